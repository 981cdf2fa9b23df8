"""Staleness study on pair1: the sampler lags the learner by 0, 1, 2, 4, 8 updates (sync mode).

  python launch/sweep.py --config=configs/sweeps/staleness.py --workdir=runs/sweep_staleness
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quantization import SHORT_RUN  # noqa: E402


def get_config(arg=None):
  del arg
  c = ml_collections.ConfigDict()
  c.name = "staleness"
  c.pairs = ("pair1",)
  c.base_overrides = SHORT_RUN
  c.points = (("baseline", ()),) + tuple(
      (f"stale_{s}", (("rollout.staleness_steps", s),)) for s in (1, 2, 4, 8, 16, 32)) + (
      ("stale_2_fp8", (("rollout.staleness_steps", 2), ("rollout.weights", "fp8"))),)
  return c
