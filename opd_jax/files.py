"""Files written whole or not at all, and their hashes: the one helper every writer of the package uses."""

from __future__ import annotations

import hashlib
import json
import os

from opd_jax.errors import InputError


def sha256(path: str) -> str:
  """sha256 of a file's bytes (hex), read in 16 MiB blocks."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 24), b""):
      digest.update(block)
  return digest.hexdigest()


def write_text(path: str, text: str) -> None:
  """The whole file or nothing: written beside it, then renamed over it (the temporary file goes on failure)."""
  tmp = path + ".tmp"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    if os.path.isfile(tmp):
      os.remove(tmp)
    raise


def check_output_file(path: str, flag: str, inputs: tuple = (), example: str = "out.json") -> None:
  """Before any work: `path` (a command's `flag`) can be written as a file, and is none of its `inputs`. `example`:
  the file name the "is a directory" message suggests in it."""
  if any(os.path.realpath(path) == os.path.realpath(i) for i in inputs if i):
    raise InputError(f"{flag}={path!r} is also one of the command's inputs; write the output to another file")
  if os.path.isdir(path):
    raise InputError(f"{flag}={path!r} is a directory; name a file in it, e.g. {os.path.join(path, example)!r}")
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder):
    raise InputError(f"{flag}={path!r}: its folder does not exist ({folder!r}); create it or choose another path")


def check_output_dir(path: str, flag: str) -> None:
  """Before any work: `path` (a command's `flag`, a folder it fills) is not an existing file."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise InputError(f"{flag}={path!r} is a file; this command writes a folder there, so give a folder path")


def write_json(path: str, value, indent: int | None = 2, ensure_ascii: bool = True) -> None:
  """`value` as JSON, the whole file or nothing (write_text)."""
  write_text(path, json.dumps(value, indent=indent, ensure_ascii=ensure_ascii))
