"""Results files: whole-file writes (complete or absent, never truncated) and strict readers.

A reader names the file (and line) of anything it cannot use and says what to do; it raises InputError. The only
damage tolerated is the one a crash can cause: the final line of a JSONL file cut short (no newline after it).
"""

from __future__ import annotations

import json
import math
import os

from opd_jax.errors import InputError
from opd_jax.files import sha256 as file_hash, write_json, write_text  # noqa: F401 (re-exported for the study)
from opd_jax.mismatch.budget import SCALES

_NUMBER = (int, float)
# Fields every sweep results row has, and those of a finished ("ok") row, that the calibration and report read.
RESULT_FIELDS = {"pair": str, "point": str, "status": str}
OK_RESULT_FIELDS = {"final_accuracy": _NUMBER, "best_accuracy": _NUMBER, "mismatch": dict}
BUDGET_FIELDS = {"budget": _NUMBER, "interval": list, "bootstrap_budgets": list}
ADMISSION_K3_FIELDS = {"pair": str, "point": str, "overrides": dict, "admission_k3": _NUMBER}


def append_jsonl(path: str, row: dict) -> None:
  """Appends one complete line (written and flushed in one call)."""
  with open(path, "a") as f:
    f.write(json.dumps(row) + "\n")
    f.flush()
    os.fsync(f.fileno())


def _read_text(path: str, what: str) -> str:
  if os.path.isdir(path):
    raise InputError(f"{what} {path!r} is a directory; give the file")
  try:
    with open(path, encoding="utf-8") as f:
      return f.read()
  except UnicodeDecodeError as e:
    raise InputError(f"{what} {path!r} is not UTF-8 text (byte {e.start}); give the JSON file written by "
                     "opd_jax") from None
  except OSError as e:
    raise InputError(f"{what} {path!r} cannot be read: {e.strerror}") from None


def read_jsonl(path: str, what: str = "JSONL file") -> list[dict]:
  """Rows of a JSONL file (none if it does not exist); a final line cut short by a crash is ignored, any other
  line that is not a JSON object is an error naming the file and line."""
  if not os.path.exists(path):
    return []
  text = _read_text(path, what)
  lines = text.split("\n")
  rows = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      if number == len(lines):  # no newline after it: the write was cut short by a crash
        continue
      raise InputError(f"{path}:{number}: {what} line is not JSON ({e.msg}); only a final line cut short by a "
                       "crash is skipped: remove or fix that line") from None
    if not isinstance(row, dict):
      raise InputError(f"{path}:{number}: {what} line is a JSON {type(row).__name__}, expected an object")
    rows.append(row)
  return rows


def read_json(path: str, what: str) -> dict:
  """A JSON object from `path`; missing, unreadable, truncated or non-object files are errors naming it."""
  if not os.path.exists(path):
    raise InputError(f"{what} {path!r} does not exist")
  try:
    value = json.loads(_read_text(path, what))
  except json.JSONDecodeError as e:
    raise InputError(f"{what} {path!r} is not valid JSON ({e.msg} at line {e.lineno}); was it cut short? "
                     "Rewrite it with the command that made it") from None
  if not isinstance(value, dict):
    raise InputError(f"{what} {path!r} holds a JSON {type(value).__name__}, expected an object")
  return value


def _check_fields(value: dict, fields: dict, where: str) -> None:
  for name, kind in fields.items():
    if name not in value:
      raise InputError(f"{where}: missing field {name!r}")
    if not isinstance(value[name], kind) or isinstance(value[name], bool):
      raise InputError(f"{where}: field {name!r} is {value[name]!r}, expected "
                       f"{'a number' if kind is _NUMBER else 'a ' + kind.__name__}")


def read_results(path: str) -> list[dict]:
  """Sweep results rows, each checked for the fields the calibration and report read."""
  if not os.path.exists(path):
    raise InputError(f"results file {path!r} does not exist (run launch/sweep.py first)")
  rows = read_jsonl(path, "results file")
  for number, row in enumerate(rows, 1):
    where = f"results file {path!r}, row {number} (point {row.get('point', '?')})"
    _check_fields(row, RESULT_FIELDS, where)
    if row["status"] == "ok":
      _check_fields(row, OK_RESULT_FIELDS, where)
  return rows


def read_admission_k3(path: str) -> list[dict]:
  """launch/admission_k3.py rows (the admission check's k3 per calibration configuration), checked."""
  if not os.path.exists(path):
    raise InputError(f"admission k3 file {path!r} does not exist (make it with launch/admission_k3.py)")
  rows = read_jsonl(path, "admission k3 file")
  if not rows:
    raise InputError(f"admission k3 file {path!r} has no rows; make it with launch/admission_k3.py")
  for number, row in enumerate(rows, 1):
    _check_fields(row, ADMISSION_K3_FIELDS, f"admission k3 file {path!r}, row {number}")
  return rows


def read_budget(path: str) -> dict:
  """A budget file from launch/calibrate.py, checked for the fields admission and the report read."""
  budget = read_json(path, "budget file")
  where = f"budget file {path!r}"
  if budget.get("scale") not in SCALES:
    raise InputError(f"{where}: 'scale' is {budget.get('scale')!r}, expected one of {sorted(SCALES)}; make the "
                     "file with launch/calibrate.py")
  budgets = budget.get("budgets")
  if not isinstance(budgets, dict) or not budgets:
    raise InputError(f"{where}: 'budgets' must be a non-empty object of per-pair budgets; make the file with "
                     "launch/calibrate.py")
  for name, entry in budgets.items():
    if not isinstance(entry, dict):
      raise InputError(f"{where}: budgets[{name!r}] is not an object")
    _check_fields(entry, BUDGET_FIELDS, f"{where}, budgets[{name!r}]")
    if entry["budget"] < 0 or not math.isfinite(entry["budget"]) or len(entry["interval"]) != 2:
      raise InputError(f"{where}, budgets[{name!r}]: budget must be a finite number >= 0 with a 2-number "
                       "interval")
  # The optional sections admission reads, each the shape launch/calibrate.py writes (a hand edit is named here,
  # before anything is measured, not met as a traceback later).
  horizons = budget.get("horizons", [])
  if not isinstance(horizons, list) or not all(h is None or (isinstance(h, int) and h > 0) for h in horizons):
    raise InputError(f"{where}: 'horizons' must be a list of run lengths (integers > 0); make the file with "
                     "launch/calibrate.py")
  for section, keys in (("horizon_test", ()), ("per_pair_test", ()), ("k3_conversion", ("scale", "by_steps"))):
    value = budget.get(section)
    if value is not None and (not isinstance(value, dict) or any(k not in value for k in keys)
                              or not isinstance(value.get("by_steps", {}), dict)):
      raise InputError(f"{where}: {section!r} must be an object{' with ' + ', '.join(map(repr, keys)) if keys else ''}"
                       "; make the file with launch/calibrate.py")
  return budget
