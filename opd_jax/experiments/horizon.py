"""The horizon test: does the budget depend on how long the run is? (configs/sweeps/noise.py runs its grid=bound
points at 40 and 75 steps, configs/sweeps/sources.py the same sigmas at 150, each with seeds 0, 1, 2.)

The rule was committed before the 40-step runs finished (RULE). It reads pair1's quality loss at sigma 0.15 at
each run length: the seed mean and its 95% t-interval over seeds (pair_budgets.summarize), and the interval's side
of the tolerance. budget.json keeps a budget per calibrated length either way and records the decision
(`horizon_test`, launch/calibrate.py --horizon_test): admission picks the length nearest a run's own only when the
decision is "moves"; otherwise it judges every run against the main length's budgets.
"""

from __future__ import annotations

from opd_jax.errors import InputError
from opd_jax.experiments.pair_budgets import MIN_SEEDS, summarize

RULE = ("Run length moves the budget only if pair1's seed-mean quality loss at sigma 0.15 (the grid point "
        "nearest its crossing) has its 95% seed interval wholly inside the 5-point tolerance at one of the "
        "three lengths (40, 75, 150 steps) and wholly beyond it at another. Otherwise budget.json still "
        "keeps a budget per calibrated length, and the study says run length is not shown to move it.")
PAIR, POINT = "pair1", "noise_0.15"


def decide(rows: list[dict], tolerance: float) -> dict:
  """RULE over sweep rows of several run lengths (each results file's deltas against its own seed's baseline).
  Returns every length's entry at POINT (pair_budgets.summarize's numbers plus `steps`) and the decision:
  "moves" or "not shown"."""
  lengths = sorted({r.get("steps") for r in rows if r["pair"] == PAIR and r["point"] == POINT})
  at = [{**summarize([r for r in rows if r.get("steps") == steps and (r["pair"], r["point"]) == (PAIR, POINT)],
                     tolerance)[0], "steps": steps} for steps in lengths]
  short = [p["steps"] for p in at if len(p["seeds"]) < MIN_SEEDS]
  if len(at) < 3 or short:
    raise InputError(f"the horizon test needs {PAIR}/{POINT} at three run lengths with >= {MIN_SEEDS} seeds each; "
                     f"have lengths {lengths}, short of seeds: {short} (run configs/sweeps/noise.py:grid=bound,"
                     "steps=N,seed=S for those)")
  sides = {p["side"] for p in at}
  moves = "inside" in sides and "beyond" in sides
  outcome = "; ".join(f"{p['steps']} steps: {100 * p['quality_loss']:.1f} points [{100 * p['interval'][0]:.1f}, "
                      f"{100 * p['interval'][1]:.1f}] ({p['side']})" for p in at)
  return {"rule": RULE, "tolerance": tolerance, "pair": PAIR, "point": POINT,
          "decision": "moves" if moves else "not shown", "outcome": outcome, "lengths": at}


def budget_entry(test: dict) -> dict:
  """budget.json's `horizon_test`: the decision in short (admission.pick_budget reads `decision`)."""
  return {"decision": test["decision"], "rule": test["rule"], "outcome": test["outcome"], "pair": test["pair"],
          "point": test["point"], "tolerance": test["tolerance"], "interval": "95% t-interval over seeds",
          "used": ("per-length budgets: admission picks the calibrated length nearest the run's" if
                   test["decision"] == "moves" else "the main length's budgets for every run length; the "
                   "per-length budgets are kept for the record, not used")}
