"""The pre-registered test of per-pair budgets (configs/sweeps/pair_budgets.py, where the rule is written).

Every point of that sweep runs on every pair with seeds 0, 1, 2, each against the same seed's fresh baseline. Per
(pair, point): each seed's quality loss (baseline final accuracy minus the point's), their mean, and a 95%
t-interval of the mean over seeds (opd_jax.experiments.intervals: with three seeds a percentile bootstrap would
be the seeds' min-max). The rule compares the k3_high point across pairs: per-pair
budgets are kept only if pair2's interval lies wholly inside the tolerance while pair1's and pair3's lie wholly
beyond it; otherwise admission uses the pooled budget for every pair. `decide` returns the rule, every number it
read and the decision; launch/calibrate.py --pair_test= copies the decision into budget.json, where admission
reads it (screening.admission.pick_budget).
"""

from __future__ import annotations

import numpy as np

from opd_jax.errors import InputError
from opd_jax.experiments.intervals import T_INTERVAL, t_interval
from opd_jax.experiments.sweep import BASELINE

RULE = ("per-pair budgets are kept only if, at k3_high, pair2's seed-mean quality loss has its whole 95% interval "
        "below the tolerance while pair1's and pair3's have their whole intervals above it; otherwise admission "
        "uses the pooled budget for every pair")
DECISION_POINT = "k3_high"
INSIDE, BEYOND = ("pair2",), ("pair1", "pair3")  # what the calibrated per-pair budgets predict at k3_high
MIN_SEEDS = 3


def seed_interval(losses: list[float]) -> list[float]:
  """95% t-interval of the mean of `losses` over seeds; a single seed has no interval (its value, twice)."""
  return t_interval(losses) if len(losses) > 1 else [float(losses[0])] * 2


def side(interval: list[float], tolerance: float) -> str:
  lo, hi = interval
  return "inside" if hi <= tolerance else "beyond" if lo > tolerance else "straddles"


def summarize(rows: list[dict], tolerance: float) -> list[dict]:
  """Rows (each results file's deltas already filled against its own seed's baseline) -> one entry per
  (pair, point) with every seed's numbers, the seed mean and its interval."""
  groups: dict[tuple[str, str], list[dict]] = {}
  for r in rows:
    if r.get("status") == "ok" and r["point"] != BASELINE:
      if "delta_final_accuracy" not in r:
        raise InputError(f"{r['pair']}/{r['point']} seed {r.get('seed', 0)} has no baseline in its results file; "
                         "rerun that seed's sweep (it runs the baseline first)")
      groups.setdefault((r["pair"], r["point"]), []).append(r)
  out = []
  for (pair, point), runs in sorted(groups.items()):
    runs = sorted(runs, key=lambda r: r.get("seed", 0))
    seeds = [r.get("seed", 0) for r in runs]
    if len(set(seeds)) != len(seeds):
      raise InputError(f"{pair}/{point} appears twice with seed(s) {seeds}; pass each seed's results once")
    losses = [-r["delta_final_accuracy"] for r in runs]
    interval = seed_interval(losses)
    out.append({"pair": pair, "point": point, "overrides": runs[0]["overrides"],
                "seeds": [{"seed": r.get("seed", 0), "final_accuracy": r["final_accuracy"],
                           "baseline_accuracy": r["final_accuracy"] - r["delta_final_accuracy"],
                           "quality_loss": loss, "run_k3": r["mismatch"].get("mismatch/k3"),
                           "noise_seed": r["rollout"].get("noise_seed")} for r, loss in zip(runs, losses)],
                "quality_loss": float(np.mean(losses)), "interval": interval, "interval_kind": T_INTERVAL,
                "side": side(interval, tolerance),
                "run_k3": float(np.mean([r["mismatch"]["mismatch/k3"] for r in runs]))})
  return out


def decide(rows: list[dict], tolerance: float) -> dict:
  """The pre-registered decision from the sweep's rows (RULE)."""
  points = summarize(rows, tolerance)
  at = {p["pair"]: p for p in points if p["point"] == DECISION_POINT}
  missing = [p for p in INSIDE + BEYOND if p not in at or len(at[p]["seeds"]) < MIN_SEEDS]
  if missing:
    raise InputError(f"the decision needs {DECISION_POINT} with >= {MIN_SEEDS} seeds on every pair; missing or "
                     f"short: {missing} (run configs/sweeps/pair_budgets.py for those pairs and seeds)")
  kept = all(at[p]["side"] == "inside" for p in INSIDE) and all(at[p]["side"] == "beyond" for p in BEYOND)
  outcome = "; ".join(f"{p} loses {100 * at[p]['quality_loss']:.1f} points "
                      f"[{100 * at[p]['interval'][0]:.1f}, {100 * at[p]['interval'][1]:.1f}] ({at[p]['side']})"
                      for p in INSIDE + BEYOND)
  return {"rule": RULE, "tolerance": tolerance, "decision_point": DECISION_POINT,
          "decision": "per_pair" if kept else "pooled",
          "outcome": f"at {DECISION_POINT} (seed means, 95% t-intervals over seeds): {outcome}", "points": points}
