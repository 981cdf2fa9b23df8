"""Whole-file writes: a results file is either complete or absent, never truncated."""

from __future__ import annotations

import json
import os


def write_json(path: str, value) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(value, f, indent=2)
  os.replace(tmp, path)


def append_jsonl(path: str, row: dict) -> None:
  """Appends one complete line (written and flushed in one call)."""
  with open(path, "a") as f:
    f.write(json.dumps(row) + "\n")
    f.flush()
    os.fsync(f.fileno())


def read_jsonl(path: str) -> list[dict]:
  """Rows of a JSONL file; a final line cut short by a crash is ignored."""
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return rows
