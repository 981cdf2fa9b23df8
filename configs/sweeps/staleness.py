"""Staleness study: the sampler lags the learner by 0 .. 32 updates (sync mode). With lr= it becomes the
learning-rate x staleness grid (a larger step moves the learner further per version, so the same lag is more
mismatch), and with objective=forward_kl the forward-vs-reverse comparison (configs/sweeps/common.py).

  python launch/sweep.py --config=configs/sweeps/staleness.py --workdir=runs/sweep_staleness
  python launch/sweep.py --config=configs/sweeps/staleness.py:lr=0.004,grid=short --workdir=runs/sweep_stale_lr4
  python launch/sweep.py --config=configs/sweeps/staleness.py:objective=forward_kl,grid=short --workdir=...
"""

from configs.sweeps.common import sweep_config

LAGS = (1, 2, 4, 8, 16, 32)  # grid=full
SHORT_LAGS = (4, 16, 32)  # grid=short


def get_config(arg=None):
  parts = [p for p in (arg or "").split(",") if p]
  grid = next((p.split("=", 1)[1] for p in parts if p.startswith("grid=")), "full")
  if grid not in ("full", "short"):
    raise ValueError(f"config argument grid={grid!r} must be full or short")
  rest = ",".join(p for p in parts if not p.startswith("grid="))
  points = (("baseline", ()),) + tuple((f"stale_{s}", (("rollout.staleness_steps", s),))
                                       for s in (LAGS if grid == "full" else SHORT_LAGS))
  if grid == "full":
    points += (("stale_2_fp8", (("rollout.staleness_steps", 2), ("rollout.weights", "fp8"))),)
  return sweep_config("staleness", rest, ("pair1",), points)
