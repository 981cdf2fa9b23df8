"""A Qwen3-shaped random teacher/student pair at the real vocabulary (151,936), built offline, for scale checks.

What makes a learner fit or not at real scale is mostly the vocabulary: every [batch, response, vocab] tensor
grows with it, while the layers in between are cheap. So this pair keeps Qwen3's vocabulary, special tokens,
chat template and eos/pad ids, and shrinks everything else (a couple of layers, width 64-128), so that
`launch/train.py` runs on it on a CPU and the memory of the vocabulary-sized tensors dominates.

The tokenizer is character-level (every printable ASCII character, newline and tab are one token each), padded
with reserved tokens to exactly `vocab_size` entries; the special tokens sit at Qwen3's ids
(<|endoftext|> 151643 = pad, <|im_start|> 151644, <|im_end|> 151645 = eos). Weights are random (transformers'
own init, seeded), so responses rarely end early: rollouts run the whole response budget, the worst case.
"""

from __future__ import annotations

import json
import os
import string

from opd_jax.data.task import ArithmeticTask
from opd_jax.errors import InputError

QWEN3_VOCAB_SIZE = 151_936
QWEN3_SPECIAL_BASE = 151_643  # Qwen3's id of <|endoftext|>; <|im_start|> and <|im_end|> follow
ENDOFTEXT, IM_START, IM_END, UNK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"
CHARS = string.printable[:95] + "\n\t"  # printable ASCII (space .. ~), newline, tab: every character the data uses

# Qwen-style chat template (the role/content turns of Qwen2.5/Qwen3, without tools or thinking blocks).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

# The problems: 4-8 terms of 1-3 digits, so that a chat-wrapped prompt is ~30-55 tokens (<= 64).
SCALE_TASK = ArithmeticTask(min_terms=4, max_terms=8, min_digits=1, max_digits=3)
MAX_PROMPT_TOKENS = 64  # data.max_prompt_tokens that fits every chat-wrapped prompt of SCALE_TASK


def special_token_ids(vocab_size: int) -> dict[str, int]:
  """Ids of the three special tokens: Qwen3's at the real vocabulary, the last three ids of a smaller one."""
  base = min(QWEN3_SPECIAL_BASE, vocab_size - 3)
  return {ENDOFTEXT: base, IM_START: base + 1, IM_END: base + 2}


def build_vocab(vocab_size: int) -> dict[str, int]:
  """token -> id for exactly `vocab_size` ids: characters, <unk>, reserved fillers, the special tokens."""
  specials = special_token_ids(vocab_size)
  if vocab_size < len(CHARS) + 1 + len(specials):
    raise InputError(f"vocab_size={vocab_size} is too small: needs >= {len(CHARS) + 1 + len(specials)} "
                     "(characters, <unk> and three special tokens)")
  vocab = {c: i for i, c in enumerate(CHARS)}
  vocab[UNK] = len(vocab)
  by_id = {i: t for t, i in specials.items()}
  for i in range(len(vocab), vocab_size):
    # Fillers are never produced by encoding (the pre-tokenizer splits text into single characters).
    vocab[by_id.get(i, f"<|reserved_{i}|>")] = i
  assert len(vocab) == vocab_size
  return vocab


def build_tokenizer(out_dir: str, vocab_size: int = QWEN3_VOCAB_SIZE):
  """Writes a PreTrainedTokenizerFast of exactly `vocab_size` tokens, with a chat template, to `out_dir`."""
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  tokenizer = Tokenizer(models.WordLevel(build_vocab(vocab_size), unk_token=UNK))
  tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
  tokenizer.decoder = decoders.Fuse()
  tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in (ENDOFTEXT, IM_START, IM_END, UNK)])
  fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=IM_END, pad_token=ENDOFTEXT, unk_token=UNK,
                                 model_max_length=40_960)
  fast.chat_template = CHAT_TEMPLATE
  fast.save_pretrained(out_dir)
  return fast


def _save_model(path: str, vocab_size: int, hidden: int, layers: int, heads: int, kv_heads: int, tied: bool,
                seed: int, *, head_dim: int = 0, intermediate: int = 0, dtype: str = "float32") -> None:
  """A Qwen3 decoder with transformers' random init (seeded), saved as safetensors in `dtype`.

  head_dim / intermediate: 0 = hidden // heads / 3 * hidden."""
  import torch
  import transformers

  ids = special_token_ids(vocab_size)
  config = transformers.Qwen3Config(
      vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate or 3 * hidden,
      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
      head_dim=head_dim or hidden // heads, tie_word_embeddings=tied, max_position_embeddings=40_960,
      rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
      bos_token_id=ids[ENDOFTEXT], eos_token_id=ids[IM_END], pad_token_id=ids[ENDOFTEXT])
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype)).eval()
  # Qwen3's generation config: stop at <|im_end|> or <|endoftext|>.
  model.generation_config = transformers.GenerationConfig(
      bos_token_id=ids[ENDOFTEXT], eos_token_id=[ids[IM_END], ids[ENDOFTEXT]], pad_token_id=ids[ENDOFTEXT])
  model.save_pretrained(path, safe_serialization=True)


def _write_problems(path: str, problems) -> None:
  with open(path, "w") as f:
    for p in problems:
      f.write(json.dumps({"prompt": p.prompt, "answer": p.answer}) + "\n")


def pair_paths(root: str) -> dict[str, str]:
  """Where build_scale_pair(root) puts the teacher and student dirs and the train / held-out JSONL files."""
  return {"teacher": os.path.join(root, "teacher"), "student": os.path.join(root, "student"),
          "train_file": os.path.join(root, "train.jsonl"), "heldout_file": os.path.join(root, "heldout.jsonl")}


def build_scale_pair(root: str, vocab_size: int = QWEN3_VOCAB_SIZE, teacher_layers: int = 2,
                     student_layers: int = 1, hidden: tuple[int, int] = (128, 64), seed: int = 0,
                     train_problems: int = 2048, heldout_problems: int = 256) -> dict[str, str]:
  """Writes root/{teacher,student} (HF dirs with tokenizer) and root/{train,heldout}.jsonl; returns the paths.

  The teacher has untied embeddings (like Qwen3-8B), the student tied ones (like Qwen3-0.6B/1.7B); heads of
  width 32 with GQA 2:1 in both. hidden: (teacher width, student width).
  """
  teacher_hidden, student_hidden = hidden
  for width in hidden:
    if width % 64:
      raise InputError(f"hidden widths must be multiples of 64 (heads of 32, GQA 2:1), got {hidden}")
  paths = pair_paths(root)
  specs = {"teacher": (teacher_hidden, teacher_layers, False, seed + 1),
           "student": (student_hidden, student_layers, True, seed + 2)}
  for role, (width, layers, tied, model_seed) in specs.items():
    _save_model(paths[role], vocab_size, width, layers, heads=width // 32, kv_heads=width // 64, tied=tied,
                seed=model_seed)
    build_tokenizer(paths[role], vocab_size)
  _write_problems(paths["train_file"], SCALE_TASK.problems("train", train_problems, seed))
  _write_problems(paths["heldout_file"], SCALE_TASK.problems("heldout", heldout_problems, seed))
  return paths


def build_shaped_pair(root: str, teacher_shape: str = "qwen3-1.7b", student_shape: str = "qwen3-0.6b",
                      seed: int = 0, dtype: str = "bfloat16", train_problems: int = 2048,
                      heldout_problems: int = 256) -> dict[str, str]:
  """Like build_scale_pair, but both models at a shipped Qwen3 shape (opd_jax.models.shapes: depth, width,
  heads, MLP, tied embeddings), random weights stored in `dtype`: a run at real model size on an accelerator
  (launch/bench/device_check.sh), without a download. The tokenizer is this module's character-level one at
  the shape's vocabulary."""
  from opd_jax.models import shapes

  paths = pair_paths(root)
  for role, name, model_seed in (("teacher", teacher_shape, seed + 1), ("student", student_shape, seed + 2)):
    c = shapes.hf_dict(name)
    if c.get("model_type") != "qwen3":
      raise InputError(f"{name!r} is a {c.get('model_type')!r} shape; build_shaped_pair builds qwen3 shapes only")
    _save_model(paths[role], c["vocab_size"], c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
                c["num_key_value_heads"], bool(c.get("tie_word_embeddings")), model_seed, head_dim=c["head_dim"],
                intermediate=c["intermediate_size"], dtype=dtype)
    build_tokenizer(paths[role], c["vocab_size"])
  _write_problems(paths["train_file"], SCALE_TASK.problems("train", train_problems, seed))
  _write_problems(paths["heldout_file"], SCALE_TASK.problems("heldout", heldout_problems, seed))
  return paths
