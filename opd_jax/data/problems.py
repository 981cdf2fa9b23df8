"""Problem sets: the embedded task generator or a local JSONL file of {"prompt": ..., ["answer": ...]}."""

from __future__ import annotations

import json
import os

from opd_jax.data.grader import GRADERS
from opd_jax.data.task import ArithmeticTask, Problem
from opd_jax.errors import InputError


def load_jsonl(path: str) -> list[Problem]:
  """Reads a JSONL problem set. Each line is an object with a string "prompt"; "answer" (a string or number) is
  optional, since OPD needs none: only rows with one are graded, by their "grader" (default "final_answer",
  see opd_jax.data.grader). An optional "solution" is the reference response for supervised warm-up, and an
  optional "teacher" names the teacher that scores the prompt in a multi-teacher run (opd_jax/train/teachers.py)."""
  if not os.path.isfile(path):
    raise InputError(f"problem file {path!r} does not exist (expected JSONL with prompt/answer fields)")
  problems = []
  try:
    with open(path, encoding="utf-8") as f:
      lines = f.read().split("\n")
  except UnicodeDecodeError as e:
    raise InputError(f"problem file {path!r} is not UTF-8 text (byte {e.start}); save it as UTF-8 JSONL") from None
  for line_no, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise InputError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
      raise InputError(f"{path}:{line_no}: each line needs a non-empty string 'prompt' (and optionally an "
                       "'answer' to grade)")
    answer = row.get("answer")
    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, (str, int, float))):
      raise InputError(f"{path}:{line_no}: 'answer' must be a string or a number, got {type(answer).__name__}")
    grader = row.get("grader", "final_answer")
    if grader not in GRADERS:
      raise InputError(f"{path}:{line_no}: 'grader' must be one of {', '.join(GRADERS)}, got {grader!r}")
    teacher = row.get("teacher", "")
    if not isinstance(teacher, str):
      raise InputError(f"{path}:{line_no}: 'teacher' must be a teacher's name (a string), got "
                       f"{type(teacher).__name__}")
    problems.append(Problem(prompt=row["prompt"], answer=None if answer is None else str(answer),
                            solution=str(row.get("solution", "")), grader=grader, teacher=teacher))
  if not problems:
    raise InputError(f"problem file {path!r} has no problems")
  return problems


def get_problems(source: str, split: str, count: int, seed: int, task: ArithmeticTask | None = None,
                 train_file: str = "", heldout_file: str = "") -> list[Problem]:
  """`count` problems from the embedded task ('arithmetic') or from local JSONL files ('jsonl').

  For JSONL, the train and held-out files are separate; `count` <= 0 means the whole file.
  """
  if source == "arithmetic":
    return (task or ArithmeticTask()).problems(split, count, seed)
  if source == "jsonl":
    path = train_file if split == "train" else heldout_file
    if not path:
      raise InputError(f"data.source='jsonl' needs data.{split}_file set to a JSONL path")
    problems = load_jsonl(path)
    return problems if count <= 0 else problems[:count]
  raise InputError(f"data.source must be 'arithmetic' or 'jsonl', got {source!r}")
