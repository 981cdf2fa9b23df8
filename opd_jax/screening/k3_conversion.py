"""One k3 for budget and admission: the measured factor from the admission check's k3 to the budgets' k3.

The budgets are fitted on a run's mean of `mismatch/k3` over its logged steps; the admission check measures k3
once, at step 0, on a calibration batch. The two differ because the mismatch moves while the student trains.
`fit` measures the factor on the calibration points themselves (never on held-out ones): for every point it
divides the admission check's step-0 k3 (launch/admission_k3.py) by the point's run-mean k3, and takes the
geometric mean of these ratios per pair and pooled, at each run length (horizon), with a 90% bootstrap interval
over points and the geometric standard deviation of the ratios (how far one configuration strays from it).
`factor_for` picks what the admission check divides its measurement by before comparing it with a budget: the
pair's own factor when its calibration points measured one, else the pooled one.
"""

from __future__ import annotations

import numpy as np

from opd_jax.errors import InputError

MIN_POINTS = 3  # a pair's own factor needs this many calibration points at the horizon; else the pooled one
BOOTSTRAP = 1000  # as many draws as a budget's bootstrap_budgets, so admission pairs them one to one


def point_key(row: dict) -> tuple[str, str]:
  """A calibration configuration: its pair and knobs (the seeds and run lengths of one point share it)."""
  return row["pair"], repr(sorted(row["overrides"].items()))


def _summary(ratios: list[float], seed: int = 0) -> dict:
  logs = np.log(ratios)
  rng = np.random.default_rng(seed)
  draws = np.exp(logs[rng.integers(0, len(logs), (BOOTSTRAP, len(logs)))].mean(axis=1))
  return {"factor": float(np.exp(logs.mean())),
          "interval": [float(np.percentile(draws, 5)), float(np.percentile(draws, 95))],
          "geo_sd": float(np.exp(logs.std(ddof=1))) if len(logs) > 1 else 1.0, "n": len(logs),
          "bootstrap_factors": [float(f"{d:.6g}") for d in draws]}  # in draw order: independent of the budget's


def fit(calibration_rows: list[dict], measurements: list[dict], main_steps) -> dict:
  """budget.json's `k3_conversion`. calibration_rows: the rows the budgets were fitted on (seed means or single
  runs, finished, with `mismatch`); measurements: launch/admission_k3.py rows. Every non-baseline calibration
  point needs its measurement (matched by pair and overrides)."""
  measured = {point_key(m): m["admission_k3"] for m in measurements}
  points, missing = [], []
  for r in calibration_rows:
    if r["point"] == "baseline":
      continue
    key = point_key(r)
    if key not in measured:
      missing.append(f"{r['pair']}/{r['point']}")
      continue
    run_k3 = r["mismatch"]["mismatch/k3"]
    if run_k3 > 0 and measured[key] > 0:
      points.append({"pair": r["pair"], "point": r["point"], "steps": r.get("steps"), "admission_k3": measured[key],
                     "run_k3": run_k3, "ratio": measured[key] / run_k3})
  if missing:
    raise InputError(f"the admission k3 file has no measurement of calibration point(s) {sorted(set(missing))}; "
                     "make it with launch/admission_k3.py over the same --results files")
  by_horizon = {}
  for steps in sorted({p["steps"] for p in points}, key=lambda s: s or 0):
    at = [p for p in points if p["steps"] == steps]
    entry = {"pooled": _summary([p["ratio"] for p in at])}
    for pair in sorted({p["pair"] for p in at}):
      ratios = [p["ratio"] for p in at if p["pair"] == pair]
      if len(ratios) >= MIN_POINTS:
        entry[pair] = _summary(ratios)
    by_horizon[str(steps)] = entry
  return {"scale": "k3", "divide": "admission k3 (step 0) / factor = run-mean k3, the budgets' quantity",
          "main_steps": main_steps, "by_steps": by_horizon, "points": points}


def _entry(budget_file: dict, pair: str, steps) -> tuple[str, dict] | None:
  conversion = budget_file.get("k3_conversion")
  if not conversion or budget_file.get("scale") != conversion["scale"]:
    return None
  entry = conversion["by_steps"].get(str(steps)) or conversion["by_steps"].get(str(conversion["main_steps"]))
  if not entry:  # no calibration point had a nonzero k3 at either horizon: nothing to convert with
    return None
  name = pair if pair in entry else "pooled"
  return name, entry[name]


def factor_for(budget_file: dict, pair: str, steps) -> tuple[float, str]:
  """(factor, note) the admission check divides its k3 by for `pair` at the budget's horizon `steps`; (1.0, note)
  for a budget file without `k3_conversion` (made before it, or without --admission_k3)."""
  found = _entry(budget_file, pair, steps)
  if found is None:
    return 1.0, "admission k3 compared unconverted (the budget file has no k3_conversion)"
  name, f = found
  return f["factor"], (f"{name} step-0 / run-mean k3 factor {f['factor']:.3g}, 90% [{f['interval'][0]:.3g}, "
                       f"{f['interval'][1]:.3g}], x/÷ {f['geo_sd']:.2f} per configuration")


def confidence(measured: float, admit: bool, budget: dict, budget_file: dict, pair: str) -> float | None:
  """Share of joint bootstrap draws (budget draw i with factor draw i) that give the same verdict: the budget's
  uncertainty and the factor's together. None without a conversion (the budget's own confidence stands)."""
  found = _entry(budget_file, pair, budget.get("steps"))
  if found is None or "bootstrap_factors" not in found[1]:
    return None
  budgets, factors = np.asarray(budget["bootstrap_budgets"]), np.asarray(found[1]["bootstrap_factors"])
  n = min(len(budgets), len(factors))
  admitted = measured / factors[:n] <= budgets[:n]
  return float(np.mean(admitted == admit))
