"""A served teacher against the in-process one on whole runs: wall time, and how far the logged numbers move.

For each mode (sync; async: rollouts produced ahead of the learner, so the teacher's scoring overlaps the train
step) the same config runs twice from the same seed: teacher in this process, and teacher behind
launch/serve_teacher.py (float32, the config's own teacher) at config.teacher_endpoint. `compare` reads both
workdirs: the largest difference of any logged value that is not a wall-clock, whether held-out accuracy is
equal, and the time the training loop took (`time/train_s` at the end: evaluations excluded).
"""

from __future__ import annotations

import os

import numpy as np

from opd_jax.experiments.files import read_jsonl

_WALL_CLOCK = ("time/", "perf/", "eval/seconds", "teacher/")  # timings, and the served run's own wire counters


def summary(workdir: str) -> dict:
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"), "metrics file")
  train = [r for r in rows if "loss" in r]
  final = [r for r in rows if "eval/accuracy" in r][-1]
  out = {"steps": train[-1]["step"], "train_s": final["time/train_s"],
         "step_s": float(np.median([r["perf/step_s"] for r in train[1:]])),
         **{k: v for k, v in final.items() if k.startswith("eval/") and k != "eval/seconds"}}
  if "teacher/wire_bytes_per_token" in train[-1]:
    out["wire_bytes_per_token"] = train[-1]["teacher/wire_bytes_per_token"]
    out["outages"] = train[-1]["teacher/outages"]
    out["preflight_k3"] = next(r["teacher/preflight_k3"] for r in train if "teacher/preflight_k3" in r)
  return out


def compare(reference_dir: str, served_dir: str, tolerance: float = 1e-4) -> dict:
  """Largest |served - in-process| over every logged value (wall clocks aside), which key and step it is, the
  last step up to which every logged value is within `tolerance`, and whether every held-out accuracy is
  equal."""
  reference = read_jsonl(os.path.join(reference_dir, "metrics.jsonl"), "metrics file")
  served = read_jsonl(os.path.join(served_dir, "metrics.jsonl"), "metrics file")
  if [r["step"] for r in reference] != [r["step"] for r in served]:
    return {"same_rows": False}
  worst, where, compared, within, previous_step = 0.0, "", 0, None, None
  for want, got in zip(reference, served):
    row_worst = 0.0
    for key, value in want.items():
      if key == "step" or key.startswith(_WALL_CLOCK):
        continue
      compared += 1
      difference = abs(got[key] - value)
      row_worst = max(row_worst, difference)
      if difference > worst:
        worst, where = difference, f"{key} at step {want['step']}"
    if row_worst > tolerance and within is None:
      within = previous_step
    previous_step = want["step"]
  accuracy = [k for k in reference[-1] if k.startswith("eval/accuracy")]
  equal = all(a.get(k) == b.get(k) for a, b in zip(reference, served) for k in accuracy)
  return {"same_rows": True, "values_compared": compared, "max_abs_difference": worst, "largest_at": where,
          "within_tolerance_through_step": reference[-1]["step"] if within is None else within,
          "accuracy_equal": equal}
