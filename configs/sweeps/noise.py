"""Weight-noise study: relative Gaussian noise on the sampler's weights over a sigma grid. Noise is the one
source that reaches past every pair's budget, so it is what bounds a budget (see configs/sweeps/common.py for
pairs= / steps= / lr= / objective= / seed=).

  python launch/sweep.py --config=configs/sweeps/noise.py --workdir=runs/sweep_noise                 # pair1
  python launch/sweep.py --config=configs/sweeps/noise.py:steps=75,grid=bound --workdir=runs/sweep_noise_75

The horizon test (issue 23) runs grid=bound at steps=40, 75 and 150 (configs/sweeps/sources.py) with seeds 0, 1, 2.
Its rule, written before the 40-step runs finished: HORIZON_RULE.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import sweep_config  # noqa: E402

SIGMAS = (0.003, 0.01, 0.02, 0.03, 0.05, 0.1, 0.15, 0.175, 0.2, 0.3, 0.5)  # grid=full
BOUND_SIGMAS = (0.1, 0.15, 0.2, 0.3)
HORIZON_RULE = ("Run length moves the budget only if pair1's seed-mean quality loss at sigma 0.15 (the grid point "
                "nearest its crossing) has its 95% seed interval wholly inside the 5-point tolerance at one of the "
                "three lengths (40, 75, 150 steps) and wholly beyond it at another. Otherwise budget.json still "
                "keeps a budget per calibrated length, and the study says run length is not shown to move it.")  # grid=bound: as configs/sweeps/sources.py (pair1 crosses at 0.15-0.175)


def get_config(arg=None):
  parts = [p for p in (arg or "").split(",") if p]
  grid = next((p.split("=", 1)[1] for p in parts if p.startswith("grid=")), "full")
  if grid not in ("full", "bound"):
    raise ValueError(f"config argument grid={grid!r} must be full or bound")
  rest = ",".join(p for p in parts if not p.startswith("grid="))
  sigmas = SIGMAS if grid == "full" else BOUND_SIGMAS
  points = (("baseline", ()),) + tuple((f"noise_{s:g}", (("rollout.noise_sigma", s),)) for s in sigmas)
  return sweep_config("noise", rest, ("pair1",), points)
