"""Held-out configurations near the budget, for validating the admission check where it can be wrong: noise
levels between the calibration sweep's points (configs/sweeps/sources.py trains 0.1, 0.15, 0.2, 0.3), whose
k3 lands within 3x of the budget (default pair1; pairs=pair3 etc. for the others). Run once per seed;
`launch/report.py --validate --heldout_results=...` judges each configuration by its seed-mean quality loss
(each seed against the same seed's baseline).

  for s in 0 1 2; do python launch/sweep.py --config=configs/sweeps/boundary.py:seed=$s \
      --workdir=runs/sweep_boundary_seed$s; done
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import sweep_config  # noqa: E402

SIGMAS = (0.125, 0.16, 0.19)


def get_config(arg=None):
  points = (("baseline", ()),) + tuple((f"noise_{s:g}", (("rollout.noise_sigma", s),)) for s in SIGMAS)
  return sweep_config("boundary", arg, ("pair1",), points)
