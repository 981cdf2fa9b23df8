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

from opd_jax.data.char_tokenizer import EOS, PAD, build_char_tokenizer
from opd_jax.data.task import ArithmeticTask
from opd_jax.models import Decoder, ModelConfig, load_tokenizer, save_pretrained
from opd_jax.rollout.sampler import Sampler, SamplingConfig
from opd_jax.train.evaluation import evaluate
from opd_jax.train.sft import SFTConfig, train_sft

ASSETS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets")
VOCAB_SIZE = 32  # the character tokenizer's 18 tokens, padded so the vocab splits over 2, 4 or 8 devices
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
  sft_steps: int  # supervised steps on reference solutions (batch 64)
  learning_rate: float
  init_seed: int
  data_seed: int
  head_dim: int = 32

  def model_config(self) -> ModelConfig:
    return ModelConfig(model_type=self.model_type, vocab_size=VOCAB_SIZE, hidden_size=self.hidden_size,
                       intermediate_size=self.intermediate_size, num_hidden_layers=self.num_hidden_layers,
                       num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
                       head_dim=self.head_dim, tie_word_embeddings=self.tie_word_embeddings,
                       rope_theta=10000.0, max_position_embeddings=256, eos_token_id=(1,), pad_token_id=0,
                       bos_token_id=None)


PAIRS: dict[str, dict[str, ModelSpec]] = {
    # Qwen3-style (QK-norm, tied embeddings, GQA 4:2).
    "pair1": {
        "teacher": ModelSpec("qwen3", 128, 4, 4, 2, 384, True, sft_steps=2500, learning_rate=3e-3,
                             init_seed=1, data_seed=11),
        "student": ModelSpec("qwen3", 96, 3, 3, 1, 256, True, sft_steps=600, learning_rate=3e-3,
                             init_seed=2, data_seed=12),
    },
}


def build_model(spec: ModelSpec, tokenizer, task: ArithmeticTask, log=print) -> tuple[Decoder, dict]:
  """Initializes (seeded) and SFT-trains one model; returns it with its measured held-out accuracy."""
  config = spec.model_config()
  model = Decoder(config, rngs=nnx.Rngs(spec.init_seed))
  start = time.time()
  sft = SFTConfig(steps=spec.sft_steps, learning_rate=spec.learning_rate, seed=spec.data_seed,
                  max_prompt_tokens=task.max_prompt_chars() + 2, max_response_tokens=task.max_response_chars() + 1)
  train_sft(model, tokenizer, task, sft, log=lambda step, loss, sps: log(f"  step {step}: loss {loss:.4f} "
                                                                        f"({sps:.2f} s/step)"))
  seconds = time.time() - start
  graphdef, state = nnx.split(model)
  sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=task.max_response_chars() + 1, temperature=0.0,
                                             eos_ids=(1,), pad_id=0))
  result = evaluate(sampler, state, tokenizer, task.problems("heldout", EVAL_PROBLEMS, seed=0),
                    max_prompt_tokens=sft.max_prompt_tokens, batch_size=128, key=jax.random.key(0))
  info = {"params": config.num_params(), "sft_steps": spec.sft_steps, "train_seconds": round(seconds, 1),
          "heldout_greedy_accuracy": result["accuracy"], "heldout_problems": EVAL_PROBLEMS}
  return model, info


def build_pair(name: str, out_root: str = ASSETS, roles=("teacher", "student"), log=print) -> dict:
  """Builds (and overwrites) out_root/<name>/{teacher,student}; returns the build info written."""
  if name not in PAIRS:
    raise ValueError(f"unknown pair {name!r}; known: {sorted(PAIRS)}")
  task = ArithmeticTask()
  pair_dir = os.path.join(out_root, name)
  os.makedirs(pair_dir, exist_ok=True)
  tokenizer_dir = os.path.join(pair_dir, "_tokenizer")
  build_char_tokenizer(tokenizer_dir)
  tokenizer = load_tokenizer(tokenizer_dir)
  assert tokenizer.pad_token == PAD and tokenizer.eos_token == EOS
  info_path = os.path.join(pair_dir, "build_info.json")
  info = json.load(open(info_path)) if os.path.exists(info_path) else {}
  for role in roles:
    log(f"{name} {role}: {PAIRS[name][role]}")
    model, info[role] = build_model(PAIRS[name][role], tokenizer, task, log)
    extra = {f: os.path.join(tokenizer_dir, f) for f in os.listdir(tokenizer_dir)}
    save_pretrained(model, os.path.join(pair_dir, role), extra_files=extra)
    log(f"{name} {role}: held-out accuracy {info[role]['heldout_greedy_accuracy']:.3f} "
        f"({info[role]['params']:,} params, {info[role]['train_seconds']:.0f} s)")
  tmp = info_path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(info, f, indent=2)
  os.replace(tmp, info_path)
  for f in os.listdir(tokenizer_dir):
    os.remove(os.path.join(tokenizer_dir, f))
  os.rmdir(tokenizer_dir)
  return info
