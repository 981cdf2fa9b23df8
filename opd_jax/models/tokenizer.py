"""Tokenizer loading (transformers' AutoTokenizer, offline, from the checkpoint directory)."""

from __future__ import annotations

import json
import os

from opd_jax.models.config import CheckpointError

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
# Every file a tokenizer may consist of (what an export or a pruned copy carries over).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")


def has_tokenizer(path: str) -> bool:
  return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, f)) for f in _TOKENIZER_FILES)


_GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(path: str):
  """The checkpoint's tokenizer, without touching the network; a clear error when none is there.

  AutoTokenizer, except when tokenizer_config.json declares the generic tokenizers-library class and a
  tokenizer.json is present: then that tokenizer.json is used as written. (transformers >= 5 otherwise
  substitutes the model family's class for some families, e.g. Qwen2Tokenizer for any qwen2 config, which
  rebuilds the pre-tokenizer and silently drops the newlines of a character-level tokenizer.)
  """
  if not has_tokenizer(path):
    what = "does not exist" if not os.path.isdir(path) else f"has no tokenizer files ({', '.join(_TOKENIZER_FILES)})"
    raise CheckpointError(f"tokenizer dir {path!r} {what}; give the dir the model's tokenizer files are in, or copy "
                          "them there (launch/sample.py: --prompt_ids with --json needs none)")
  from transformers import AutoTokenizer, PreTrainedTokenizerFast  # slow import; only pay it when needed
  declared = None
  config_file = os.path.join(path, "tokenizer_config.json")
  if os.path.isfile(config_file):
    with open(config_file) as f:
      declared = json.load(f).get("tokenizer_class")
  if declared in _GENERIC_CLASSES and os.path.isfile(os.path.join(path, "tokenizer.json")):
    return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
  return AutoTokenizer.from_pretrained(path, local_files_only=True)


def encode_prompt(tokenizer, text: str, use_chat_template: bool, prompt_format: str = "") -> list[int]:
  """Token ids of a prompt: rendered in `prompt_format` when one is given (opd_jax/models/prompt_format.py; e.g. a
  base model's "Q: {prompt}\nA:", with its BOS), else wrapped as one user turn when asked and the tokenizer has a
  chat template, else the text alone without special tokens."""
  if prompt_format:
    from opd_jax.models.prompt_format import PromptFormat
    return PromptFormat(prompt_format, tokenizer, "data.prompt_format").ids(text)
  if use_chat_template and getattr(tokenizer, "chat_template", None):
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
  return list(tokenizer.encode(text, add_special_tokens=False))
