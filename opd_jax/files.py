"""Files written whole or not at all, and their hashes: the one helper every writer of the package uses."""

from __future__ import annotations

import hashlib
import json
import os


def sha256(path: str) -> str:
  """sha256 of a file's bytes (hex), read in 16 MiB blocks."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 24), b""):
      digest.update(block)
  return digest.hexdigest()


def write_text(path: str, text: str) -> None:
  """The whole file or nothing: written beside it, then renamed over it."""
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, path)


def write_json(path: str, value, indent: int | None = 2, ensure_ascii: bool = True) -> None:
  """`value` as JSON, the whole file or nothing (write_text)."""
  write_text(path, json.dumps(value, indent=indent, ensure_ascii=ensure_ascii))
