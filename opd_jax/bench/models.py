"""Random-weight benchmark models in HF format: the tiny (d=256, 4 layers) and the ~191M (d=1024, 8 layers,
vocab 32000) Llama-family configurations the sampler and learner benchmarks use."""

from __future__ import annotations

import os

from flax import nnx

from opd_jax.models import Decoder, ModelConfig, save_pretrained

BENCH_CONFIGS = {
    "tiny": ModelConfig(model_type="llama", vocab_size=512, hidden_size=256, intermediate_size=768,
                        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                        tie_word_embeddings=False, eos_token_id=(), pad_token_id=0),
    "191M": ModelConfig(model_type="llama", vocab_size=32000, hidden_size=1024, intermediate_size=4096,
                        num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8, head_dim=64,
                        tie_word_embeddings=False, eos_token_id=(), pad_token_id=0),
}


def bench_checkpoint(name: str, root: str) -> str:
  """Writes (once) a random checkpoint of BENCH_CONFIGS[name] under root and returns its directory."""
  path = os.path.join(root, f"bench_{name}")
  if not os.path.isfile(os.path.join(path, "config.json")):
    save_pretrained(Decoder(BENCH_CONFIGS[name], rngs=nnx.Rngs(0)), path)
  return path
