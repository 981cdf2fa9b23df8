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
  optional "teacher" names the teacher that scores the prompt in a multi-teacher run (opd_jax/train/teachers.py);
  an optional "source" names the part of the set the row belongs to, which `data.mix` weights."""
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
    source = row.get("source", "")
    if not isinstance(source, str):
      raise InputError(f"{path}:{line_no}: 'source' must be a name (a string), got {type(source).__name__}")
    problems.append(Problem(prompt=row["prompt"], answer=None if answer is None else str(answer),
                            solution=str(row.get("solution", "")), grader=grader, teacher=teacher, source=source))
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


def parse_mix(spec: str) -> dict[str, float]:
  """`data.mix` "name=weight,..." -> {name: weight}; "" -> {} (no mix: every prompt equally often)."""
  mix = {}
  for part in filter(None, (p.strip() for p in spec.split(","))):
    name, _, weight = part.partition("=")
    try:
      value = float(weight)
    except ValueError:
      value = -1.0
    if not name.strip() or not value >= 0 or name.strip() in mix:
      raise InputError(f"data.mix: {part!r} is not 'source=weight' with a weight >= 0 (each source once), e.g. "
                       "data.mix='chat=1,capitals=1'")
    mix[name.strip()] = value
  if mix and not sum(mix.values()) > 0:
    raise InputError(f"data.mix={spec!r}: at least one weight must be > 0")
  return mix


def mix_groups(problems: list[Problem], mix: dict[str, float]) -> list[tuple[list[int], float]]:
  """(indices of the problems of a source, its weight) for each source of `mix` with a weight > 0; every
  source in the problems must have a weight, and every weighted source rows."""
  by_source: dict[str, list[int]] = {}
  for index, problem in enumerate(problems):
    by_source.setdefault(problem.source, []).append(index)
  unweighted = sorted(set(by_source) - set(mix))
  if "" in unweighted:
    raise InputError(f"data.mix weights sources, but {len(by_source[''])} training prompts have no \"source\" "
                     "(the embedded arithmetic task has none); give every JSONL row one, or set data.mix=''")
  if unweighted:
    name = unweighted[0]
    raise InputError(f"data.mix has no weight for source {name!r} ({len(by_source[name])} training prompts); "
                     f"give it one (0 leaves it out), e.g. data.mix='{name}=1,...'")
  empty = sorted(s for s, w in mix.items() if w > 0 and s not in by_source)
  if empty:
    raise InputError(f"data.mix weights source {empty[0]!r}, but no training prompt has it (sources: "
                     f"{', '.join(sorted(by_source)) or 'none'}); fix the name or the rows' \"source\"")
  return [(by_source[s], w) for s, w in mix.items() if w > 0]
