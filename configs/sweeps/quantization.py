"""Quantization study across all three embedded pairs: weight recipes and KV-cache dtypes.

Run (under an hour on 2 CPU cores; README lists the measured wall time):
  python launch/sweep.py --config=configs/sweeps/quantization.py --workdir=runs/sweep_quantization
Each point is a short OPD run (configs/sweeps/common.py) of configs/pairN.py with the point's rollout knobs.
"""

from configs.sweeps.common import SHORT_RUN, sweep_config  # noqa: F401  (SHORT_RUN: re-exported for older imports)

POINTS = (
    ("baseline", ()),
    ("w_bf16", (("rollout.weights", "bf16"),)),
    ("w_int8", (("rollout.weights", "int8"),)),
    ("w_fp8", (("rollout.weights", "fp8"),)),
    ("kv_int8", (("rollout.kv_cache", "int8"),)),
    ("kv_fp8", (("rollout.kv_cache", "fp8_e4m3"),)),
    ("w_fp8_kv_fp8", (("rollout.weights", "fp8"), ("rollout.kv_cache", "fp8_e4m3"))),
)


def get_config(arg=None):
  return sweep_config("quantization", arg, ("pair1", "pair2", "pair3"), POINTS)
