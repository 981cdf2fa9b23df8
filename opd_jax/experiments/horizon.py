"""The horizon test: does the budget depend on how long the run is? (configs/sweeps/noise.py runs its grid=bound
points at 40 and 75 steps, configs/sweeps/sources.py the same sigmas at 150, each with seeds 0, 1, 2.)

The rule was committed before the 40-step runs finished (RULE). It reads pair1's quality loss at sigma 0.15 at
each run length: the seed mean and its 95% seed-bootstrap interval (pair_budgets.summarize), and the interval's side
of the tolerance. budget.json keeps a budget per calibrated length either way (admission picks the nearest); the
decision says whether the lengths' budgets can be told apart here.
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
