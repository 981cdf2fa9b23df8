"""The registry of real model shapes: HF config.json files of published models (no weights), shipped as package
data in opd_jax/assets/model_shapes/<name>.json, so the memory planner, the KV-capacity tables and the admission
check's memory columns work from any install, without a download.

A name is the file's stem in lower case (`qwen3-8b`); `display_name` is the published model's own name
(`Qwen3-8B`, from the file's `_name_or_path`). Add a shape by copying a model's config.json there and adding
`_name_or_path`.
"""

from __future__ import annotations

import os

from opd_jax.errors import InputError
from opd_jax.models.config import ModelConfig, read_json_object

SHAPES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "model_shapes")


def names() -> list[str]:
  return sorted(f[:-5] for f in os.listdir(SHAPES_DIR) if f.endswith(".json"))


def _file(name: str) -> str:
  return os.path.join(SHAPES_DIR, name.lower() + ".json")


def load(name: str) -> ModelConfig:
  """The ModelConfig of a shipped shape (any case: `QWEN3-8B` is `qwen3-8b`)."""
  if name.lower() not in names():
    raise InputError(f"{name!r} is not a shipped model shape; known names: {', '.join(names())}")
  return ModelConfig.from_hf_dict(read_json_object(_file(name)), source=_file(name))


def hf_dict(name: str) -> dict:
  """The shipped config.json of a shape, as HF writes it."""
  load(name)  # the error for an unknown name
  return read_json_object(_file(name))


def display_name(name: str) -> str:
  return str(read_json_object(_file(name)).get("_name_or_path", name)).rsplit("/", 1)[-1]
