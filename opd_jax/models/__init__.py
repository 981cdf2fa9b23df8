"""Decoder models (Qwen3 / Llama 3 / Qwen2 families), HF checkpoint I/O and tokenizers."""

from opd_jax.models.config import CheckpointError, ModelConfig, read_hf_config
from opd_jax.models.decoder import Decoder
from opd_jax.models.hf_io import load_pretrained, save_pretrained
from opd_jax.models.tokenizer import load_tokenizer

__all__ = ["CheckpointError", "Decoder", "ModelConfig", "load_pretrained", "load_tokenizer",
           "read_hf_config", "save_pretrained"]
