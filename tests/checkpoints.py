"""Tiny randomly initialized HF checkpoints (made with transformers + torch, never downloaded)."""

from __future__ import annotations

import os

FAMILIES = ("qwen3", "llama", "qwen2", "gemma3_text")
VOCAB = 61


def hf_config(family: str, **overrides):
  import transformers
  common = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=256, eos_token_id=2, pad_token_id=0,
                bos_token_id=1)
  if family == "qwen3":  # GQA 4:2, QK-norm, tied embeddings, explicit head_dim != hidden/heads
    kw = dict(common, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, rms_norm_eps=1e-6)
    kw.update(overrides)
    return transformers.Qwen3Config(**kw)
  if family == "llama":  # GQA 4:1, llama3 rope scaling, untied, rope_theta 500k
    kw = dict(common, num_key_value_heads=1, tie_word_embeddings=False, rope_theta=500000.0, rms_norm_eps=1e-5,
              rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    kw.update(overrides)
    return transformers.LlamaConfig(**kw)
  if family == "qwen2":  # q/k/v bias, untied
    kw = dict(common, num_key_value_heads=2, tie_word_embeddings=False, rope_theta=1000000.0)
    kw.update(overrides)
    return transformers.Qwen2Config(**kw)
  if family == "gemma3_text":  # sliding (window 4) / full layers, own RoPE bases, query scale != 1/sqrt(head_dim)
    kw = dict(common, num_hidden_layers=3, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
              sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
              query_pre_attn_scalar=24, rope_parameters={
                  "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                  "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    kw.update(overrides)
    return transformers.Gemma3TextConfig(**kw)
  raise ValueError(family)


def make_tiny_checkpoint(path: str, family: str, seed: int = 0, noise: float = 0.2, **overrides) -> str:
  """Saves a float32 random model (weights perturbed so norms and biases are not trivial) to `path`."""
  import torch
  import transformers
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(hf_config(family, **overrides)).float().eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(torch.randn_like(p) * noise)
  model.save_pretrained(path)
  return path


def load_torch(path: str):
  import transformers
  return transformers.AutoModelForCausalLM.from_pretrained(path, dtype="float32").eval()


def make_tiny_pair(root: str, family: str = "qwen3") -> dict[str, str]:
  """A random teacher/student pair with the embedded character tokenizer (our own init, seeded)."""
  import os

  from flax import nnx

  from opd_jax.data.char_tokenizer import build_char_tokenizer
  from opd_jax.models import Decoder, ModelConfig, save_pretrained
  paths = {}
  # gemma3_text: a sliding layer (window 4) and a full one, Gemma's activation
  gemma = dict(layer_types=("sliding_attention", "full_attention"), sliding_window=4, hidden_act="gelu_tanh",
               tie_word_embeddings=True) if family == "gemma3_text" else {}
  for role, width, seed in (("teacher", 64, 1), ("student", 32, 2)):
    config = ModelConfig(model_type=family, vocab_size=32, hidden_size=width, intermediate_size=2 * width,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         **{"tie_word_embeddings": role == "student", **gemma}, eos_token_id=(1,), pad_token_id=0)
    paths[role] = os.path.join(root, role)
    save_pretrained(Decoder(config, rngs=nnx.Rngs(seed)), paths[role])
    build_char_tokenizer(paths[role])
  return paths


def flip_a_bit_in_the_largest_array_file(step_dir: str) -> None:
  """One bit flipped in the middle of an orbax checkpoint step's largest array file: same length, same names,
  other bytes (what a checksum must catch)."""
  import glob

  files = [f for f in glob.glob(os.path.join(step_dir, "arrays", "**", "*"), recursive=True) if os.path.isfile(f)]
  largest = max(files, key=os.path.getsize)
  with open(largest, "r+b") as f:
    f.seek(os.path.getsize(largest) // 2)
    byte = f.read(1)[0]
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte ^ 0x10]))
