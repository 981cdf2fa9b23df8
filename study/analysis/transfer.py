"""Does a budget calibrated elsewhere transfer? (issue 35, item 5) A pair's held-out validation (its rows: the
admission check's step-0 k3 of each configuration, and its seed-mean quality loss against the pair's own
tolerance) judged twice with the same admission path: by the pair's own budget file and by another (the embedded
pairs' pooled budget and k3 factor), side by side; and what calibrating on the pair cost, against one training run.

The real verdict is the same for both: the configuration's quality loss on the pair's own measure (the validation
budget's quality and tolerance). Only admission's answer changes with the budget file, as launch/admit.py would
give it with that file (admission.admit_value: the file's factor and its budget at the horizon nearest the runs').
"""

from __future__ import annotations

import numpy as np

from opd_jax.errors import InputError
from opd_jax.experiments.files import file_hash, read_jsonl
from opd_jax.experiments.intervals import wilson_interval
from study.analysis.validation import judge, summary

VERDICT = ("admit", "compared", "k3_factor", "budget", "budget_source", "agree")


def _trivial(rows: list[dict]) -> dict:
  n, out = len(rows), {}
  ok = sum(r["real_ok"] for r in rows)
  for name, agreed in (("reject all", n - ok), ("admit all", ok)):
    out[name] = {"agreed": agreed, "n": n, "agreement": agreed / n, "interval": wilson_interval(agreed, n)}
  return out


def transfer(validation: dict, other: dict, other_path: str) -> dict:
  """`validation`: a stored validate() result (rows judged with the pair's own budget, in validation["budget"]);
  `other`: the budget file to compare (read from `other_path`)."""
  own = validation["budget"]
  if own["scale"] != other["scale"]:
    raise InputError(f"{other_path} budgets {other['scale']}, the validation measured {own['scale']}: they cannot "
                     "judge the same measurements")
  if not validation["rows"]:
    raise InputError("the validation has no rows to judge")
  rows, mine, theirs = [], [], []
  for r in validation["rows"]:
    tolerance = own["budgets"][r["budget_source"]]["tolerance_abs"]
    again = judge(r, other, tolerance=tolerance)
    if again["real_ok"] != r["real_ok"]:
      raise InputError(f"{r['pair']}/{r['point']}: the real verdict changed with the budget file (a bug)")
    mine.append(r)
    theirs.append(again)
    rows.append({"pair": r["pair"], "point": r["point"], "measured": r["measured"], "quality_loss": r["quality_loss"],
                 "tolerance": tolerance, "real_ok": r["real_ok"], "own": {k: r[k] for k in VERDICT},
                 "transferred": {k: again[k] for k in VERDICT}})
  return {"quality": own.get("quality", "accuracy"), "own_budget_file": validation.get("budget_file"),
          "transferred_budget_file": other_path, "transferred_budget_sha256": file_hash(other_path),
          "own": summary(mine), "transferred": summary(theirs), "trivial": _trivial(mine),
          "verdicts_differ": sum(r["own"]["admit"] != r["transferred"]["admit"] for r in rows), "rows": rows}


def calibration_cost(budget_file: dict, run_seconds: list[float]) -> dict:
  """What the pair's calibration cost: its training runs (the budget file's results files) and their wall time,
  the admission k3 measurements behind its factor, against one full training run (`run_seconds`: the main run's
  wall seconds per seed)."""
  rows = [r for path in budget_file["results"] for r in read_jsonl(path, "results file") if r.get("status") == "ok"]
  if not rows or not run_seconds:
    raise InputError("the calibration cost needs the budget file's results rows and the main run's wall times")
  k3_path = (budget_file.get("k3_conversion") or {}).get("file")
  k3_seconds = sum(r.get("seconds", 0.0) for r in read_jsonl(k3_path, "admission k3 file")) if k3_path else 0.0
  train = float(sum(r["wall_seconds"] for r in rows))
  main = float(np.mean(run_seconds))
  return {"runs": len(rows), "train_seconds": train, "admission_k3_seconds": k3_seconds,
          "seconds": train + k3_seconds, "main_run_seconds": main, "main_runs_equivalent": (train + k3_seconds) / main,
          "results": list(budget_file["results"]), "admission_k3_file": k3_path}
