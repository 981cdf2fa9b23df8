"""Weight-noise study on pair1: relative Gaussian noise on the sampler's weights over a sigma grid.

  python launch/sweep.py --config=configs/sweeps/noise.py --workdir=runs/sweep_noise
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quantization import SHORT_RUN  # noqa: E402

SIGMAS = (0.003, 0.01, 0.02, 0.03, 0.05, 0.1, 0.15, 0.175, 0.2, 0.3, 0.5)


def get_config(arg=None):
  del arg
  c = ml_collections.ConfigDict()
  c.name = "noise"
  c.pairs = ("pair1",)
  c.base_overrides = SHORT_RUN
  c.points = (("baseline", ()),) + tuple((f"noise_{s:g}", (("rollout.noise_sigma", s),)) for s in SIGMAS)
  return c
