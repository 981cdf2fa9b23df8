"""Weight-noise study: relative Gaussian noise on the sampler's weights over a sigma grid. Noise is the one
source that reaches past every pair's budget, so it is what bounds a budget (see configs/sweeps/common.py for
pairs= / steps= / lr= / objective= / seed=).

  python launch/sweep.py --config=configs/sweeps/noise.py --workdir=runs/sweep_noise                 # pair1
  python launch/sweep.py --config=configs/sweeps/noise.py:steps=75,grid=bound --workdir=runs/sweep_noise_75

The horizon test (issue 23) runs grid=bound at steps=40, 75 and 150 (configs/sweeps/sources.py) with seeds 0, 1, 2.
Its rule, written before the 40-step runs finished: HORIZON_RULE.
"""

from configs.sweeps.common import sweep_config

from opd_jax.experiments import horizon

SIGMAS = (0.003, 0.01, 0.02, 0.03, 0.05, 0.1, 0.15, 0.175, 0.2, 0.3, 0.5)  # grid=full
BOUND_SIGMAS = (0.1, 0.15, 0.2, 0.3)  # grid=bound: as configs/sweeps/sources.py (pair1 crosses at 0.15-0.175)
HORIZON_RULE = horizon.RULE  # the horizon test's rule (opd_jax/experiments/horizon.py), committed before its runs


def get_config(arg=None):
  parts = [p for p in (arg or "").split(",") if p]
  grid = next((p.split("=", 1)[1] for p in parts if p.startswith("grid=")), "full")
  if grid not in ("full", "bound"):
    raise ValueError(f"config argument grid={grid!r} must be full or bound")
  rest = ",".join(p for p in parts if not p.startswith("grid="))
  sigmas = SIGMAS if grid == "full" else BOUND_SIGMAS
  points = (("baseline", ()),) + tuple((f"noise_{s:g}", (("rollout.noise_sigma", s),)) for s in sigmas)
  return sweep_config("noise", rest, ("pair1",), points)
