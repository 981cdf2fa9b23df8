"""The embedded teacher-student pairs: architectures, training recipes, and the deterministic build.

Each pair is one model family with a teacher trained to high accuracy and a smaller student trained briefly
(supervised on reference solutions), so OPD has a visible gap to close. Size ratios differ by pair so that
quantization sensitivity can differ too. `build_pair` writes HF checkpoint directories (config.json,
safetensors, tokenizer.json) plus build_info.json with the measured held-out accuracies.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
from flax import nnx

from opd_jax.data import number_tokenizer
from opd_jax.data.char_tokenizer import EOS, PAD, build_char_tokenizer
from opd_jax.data.task import ArithmeticTask
from opd_jax.errors import InputError
from opd_jax.files import write_json
from opd_jax.models import Decoder, ModelConfig, load_tokenizer, save_pretrained
from opd_jax.rollout.sampler import Sampler, SamplingConfig
from opd_jax.train.evaluation import evaluate
from opd_jax.train.sft import SFTConfig, train_sft

ASSETS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets")
VOCAB_SIZE = 32  # the character tokenizer's 18 tokens, padded so the vocab splits over 2, 4 or 8 devices
# Each tokenizer a model may use: (builder, vocab size padded as above, EOS id). "number" pairs digits
# (opd_jax/data/number_tokenizer.py): the teacher of the cross-tokenizer pair.
TOKENIZERS = {"char": (build_char_tokenizer, VOCAB_SIZE, 1),
              "number": (number_tokenizer.build_number_tokenizer, 128, number_tokenizer.VOCAB[number_tokenizer.EOS])}
EVAL_PROBLEMS = 512


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  model_type: str
  hidden_size: int
  num_hidden_layers: int
  num_attention_heads: int
  num_key_value_heads: int
  intermediate_size: int
  tie_word_embeddings: bool
  sft_steps: int  # supervised steps on reference solutions (batch 64); the most for early-stopped students
  learning_rate: float
  init_seed: int
  data_seed: int
  head_dim: int = 32
  # Students: constant learning rate, stop at the first check (every 50 steps, on 256 held-out problems drawn
  # apart from the reported ones) where greedy accuracy reaches this. None = train all sft_steps with cosine decay.
  stop_at_accuracy: float | None = None
  rope_scaling: tuple | None = None  # llama3 frequency scaling as (key, value) pairs, exercised by pair2
  tokenizer: str = "char"  # a key of TOKENIZERS

  def model_config(self) -> ModelConfig:
    _, vocab_size, eos = TOKENIZERS[self.tokenizer]
    return ModelConfig(model_type=self.model_type, vocab_size=vocab_size, hidden_size=self.hidden_size,
                       intermediate_size=self.intermediate_size, num_hidden_layers=self.num_hidden_layers,
                       num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
                       head_dim=self.head_dim, tie_word_embeddings=self.tie_word_embeddings,
                       rope_theta=10000.0, rope_scaling=self.rope_scaling, max_position_embeddings=256,
                       eos_token_id=(eos,), pad_token_id=0, bos_token_id=None)


_LLAMA3_SCALING = (("factor", 4.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
                   ("original_max_position_embeddings", 32), ("rope_type", "llama3"))

PAIRS: dict[str, dict[str, ModelSpec]] = {
    # Qwen3-style: QK-norm, tied embeddings, GQA 4:2. Teacher/student size ratio ~2.6.
    "pair1": {
        "teacher": ModelSpec("qwen3", 128, 4, 4, 2, 384, True, sft_steps=2000, learning_rate=3e-3,
                             init_seed=1, data_seed=11),
        "student": ModelSpec("qwen3", 96, 3, 3, 1, 256, True, sft_steps=1500, learning_rate=2e-3,
                             init_seed=2, data_seed=12, stop_at_accuracy=0.3),
    },
    # Llama-style: untied embeddings, GQA 5:1 / 2:1, llama3 RoPE scaling. Size ratio ~6.
    "pair2": {
        "teacher": ModelSpec("llama", 160, 4, 5, 1, 448, False, sft_steps=2000, learning_rate=3e-3,
                             init_seed=3, data_seed=13, rope_scaling=_LLAMA3_SCALING),
        "student": ModelSpec("llama", 64, 4, 2, 1, 192, False, sft_steps=3000, learning_rate=2e-3,
                             init_seed=4, data_seed=14, stop_at_accuracy=0.3, rope_scaling=_LLAMA3_SCALING),
    },
    # Qwen2-style: q/k/v biases, untied embeddings, wide and shallow teacher. Size ratio ~2.
    "pair3": {
        "teacher": ModelSpec("qwen2", 192, 3, 6, 2, 512, False, sft_steps=2000, learning_rate=3e-3,
                             init_seed=5, data_seed=15),
        "student": ModelSpec("qwen2", 128, 2, 4, 2, 384, False, sft_steps=1500, learning_rate=2e-3,
                             init_seed=6, data_seed=16, stop_at_accuracy=0.3),
    },
    # Cross-tokenizer (opd_jax/crosstok): pair1's teacher recipe (same architecture, seeds and steps) with a
    # tokenizer that writes two-digit numbers as one token; its student is pair1's (configs/pairx.py), which
    # writes every digit alone. Only the tokenizer differs from pair1's teacher.
    "pairx": {
        "teacher": ModelSpec("qwen3", 128, 4, 4, 2, 384, True, sft_steps=2000, learning_rate=3e-3,
                             init_seed=1, data_seed=11, tokenizer="number"),
    },
}


def build_model(spec: ModelSpec, tokenizer, task: ArithmeticTask, log=print) -> tuple[Decoder, dict]:
  """Initializes (seeded) and SFT-trains one model; returns it with its measured held-out accuracy."""
  config = spec.model_config()
  model = Decoder(config, rngs=nnx.Rngs(spec.init_seed))
  max_prompt, max_response = task.max_prompt_chars() + 2, task.max_response_chars() + 1
  graphdef, _ = nnx.split(model)
  greedy = Sampler(graphdef, SamplingConfig(max_new_tokens=max_response, temperature=0.0,
                                            eos_ids=config.eos_token_id, pad_id=0))
  measure = lambda state, problems: evaluate(greedy, state, tokenizer, problems, max_prompt_tokens=max_prompt,
                                             batch_size=128, key=jax.random.key(0))["accuracy"]
  stop_problems = task.problems("heldout", 256, seed=1)  # early stopping never sees the reported problems

  def early_stop(step, state):
    accuracy = measure(state, stop_problems)
    log(f"  step {step}: early-stop check accuracy {accuracy:.3f}")
    return accuracy >= spec.stop_at_accuracy

  start = time.time()
  sft = SFTConfig(steps=spec.sft_steps, learning_rate=spec.learning_rate, seed=spec.data_seed,
                  end_lr_fraction=0.1 if spec.stop_at_accuracy is None else 1.0,
                  max_prompt_tokens=max_prompt, max_response_tokens=max_response)
  steps = train_sft(model, tokenizer, task, sft,
                    log=lambda step, loss, sps: log(f"  step {step}: loss {loss:.4f} ({sps:.2f} s/step)"),
                    evaluate=early_stop if spec.stop_at_accuracy is not None else None, eval_every=50)
  seconds = time.time() - start
  accuracy = measure(nnx.state(model), task.problems("heldout", EVAL_PROBLEMS, seed=0))
  info = {"params": config.num_params(), "sft_steps": steps, "train_seconds": round(seconds, 1),
          "heldout_greedy_accuracy": accuracy, "heldout_problems": EVAL_PROBLEMS}
  return model, info


def build_pair(name: str, out_root: str = ASSETS, roles=("teacher", "student"), log=print) -> dict:
  """Builds (and overwrites) out_root/<name>/{teacher,student}; returns the build info written."""
  if name not in PAIRS:
    raise InputError(f"unknown pair {name!r}; known: {sorted(PAIRS)}")
  task = ArithmeticTask()
  pair_dir = os.path.join(out_root, name)
  os.makedirs(pair_dir, exist_ok=True)
  tokenizer_dir = os.path.join(pair_dir, "_tokenizer")
  info_path = os.path.join(pair_dir, "build_info.json")
  info = json.load(open(info_path)) if os.path.exists(info_path) else {}
  for role in roles:
    if role not in PAIRS[name]:
      raise InputError(f"pair {name!r} has no {role} to build (it has {sorted(PAIRS[name])})")
    TOKENIZERS[PAIRS[name][role].tokenizer][0](tokenizer_dir)
    tokenizer = load_tokenizer(tokenizer_dir)
    assert tokenizer.pad_token == PAD and tokenizer.eos_token == EOS
    log(f"{name} {role}: {PAIRS[name][role]}")
    model, info[role] = build_model(PAIRS[name][role], tokenizer, task, log)
    extra = {f: os.path.join(tokenizer_dir, f) for f in os.listdir(tokenizer_dir)}
    save_pretrained(model, os.path.join(pair_dir, role), extra_files=extra)
    log(f"{name} {role}: held-out accuracy {info[role]['heldout_greedy_accuracy']:.3f} "
        f"({info[role]['params']:,} params, {info[role]['train_seconds']:.0f} s)")
  write_json(info_path, info)
  for f in os.listdir(tokenizer_dir):
    os.remove(os.path.join(tokenizer_dir, f))
  os.rmdir(tokenizer_dir)
  return info
