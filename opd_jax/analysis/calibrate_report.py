"""Budget calibration as a command: per-pair and pooled budgets on every scale, written to budget.json."""

from __future__ import annotations

import os

from opd_jax.analysis.files import read_results, write_json
from opd_jax.analysis.sweep import check_one_objective, fill_deltas
from opd_jax.errors import InputError
from opd_jax.mismatch import budget as budget_lib

PRIMARY = "k3"


def load_rows(results_paths: list[str]) -> list[dict]:
  rows = []
  for path in results_paths:
    rows += fill_deltas(read_results(path))
  check_one_objective(rows)
  return rows


def build_budget(rows: list[dict], *, tolerance: float, relative: bool) -> dict:
  """Per-pair and pooled budgets (primary scale) plus the other scales' fits, from finished sweep rows."""
  usable = [r for r in rows if r.get("status") == "ok" and "delta_final_accuracy" in r]
  pairs = sorted({r["pair"] for r in usable})
  budgets, other_scales = {}, {}
  for name, subset in [*((p, [r for r in usable if r["pair"] == p]) for p in pairs), ("pooled", usable)]:
    if len(subset) < 3:
      continue
    budgets[name] = budget_lib.calibrate(subset, scale=PRIMARY, tolerance=tolerance, relative=relative)
    other_scales[name] = {s: {k: v for k, v in budget_lib.calibrate(subset, scale=s, tolerance=tolerance,
                                                                      relative=relative).items()
                              if k in ("budget", "interval", "fit", "bounded")}
                          for s in budget_lib.SCALES if s != PRIMARY}
  if not budgets:
    raise InputError("no pair has >= 3 finished sweep points with a baseline")
  per_pair = [budgets[p]["budget"] for p in pairs if p in budgets]
  transfer = {"per_pair_budgets": {p: budgets[p]["budget"] for p in pairs if p in budgets},
              "max_over_min": max(per_pair) / min(per_pair) if len(per_pair) > 1 and min(per_pair) > 0 else None}
  return {"scale": PRIMARY, "tolerance": tolerance, "tolerance_relative": relative, "budgets": budgets,
          "other_scales": other_scales, "transfer": transfer,
          "runs": [{"pair": r["pair"], "point": r["point"]} for r in usable]}


def run(results_paths: list[str], out: str, *, tolerance: float, relative: bool, holdout: list[str]) -> dict:
  if not 0 < tolerance < 1:
    raise InputError(f"--tolerance={tolerance:g} must be in (0, 1): accuracy points, or with --relative a fraction "
                     "of the baseline accuracy (e.g. 0.02)")
  rows = load_rows(results_paths)
  unknown = sorted(set(holdout) - {r["point"] for r in rows})
  if unknown:
    raise InputError(f"--holdout names points that are in no results file: {', '.join(unknown)}")
  rows = [r for r in rows if r["point"] not in holdout]
  result = build_budget(rows, tolerance=tolerance, relative=relative)
  result.update(results=list(results_paths), holdout_points=holdout)
  budgets, other_scales, transfer = result["budgets"], result["other_scales"], result["transfer"]
  write_json(out, result)
  print(f"budget on {PRIMARY} (tolerance {tolerance:g}{' of baseline' if relative else ' accuracy points'}):")
  for name, b in budgets.items():
    lo, hi = b["interval"]
    note = "" if b["bounded"] else "  (no quality loss observed: budget = largest mismatch tested)"
    print(f"  {name:<7} {b['budget']:.3g}  90% interval [{lo:.3g}, {hi:.3g}]  fit r2 {b['fit']['r2']:.2f}  "
          f"n={b['fit']['n']}{note}")
    for scale, s in other_scales[name].items():
      print(f"           {scale:<16} budget {s['budget']:.3g}  r2 {s['fit']['r2']:.2f}")
  if transfer["max_over_min"] is not None:
    print(f"per-pair budgets differ by {transfer['max_over_min']:.2f}x (max / min)")
  print(f"wrote {out}")
  return result
