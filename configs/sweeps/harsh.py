"""Harsher rollout recipes that real engines use and that can cost quality, on all three pairs: int4 weights
(per channel), per-tensor fp8 scales, fp8_e5m2 and int4 KV caches, their combinations, and int4 with stale
weights (configs/sweeps/common.py for pairs= / steps= / lr= / objective= / seed=).

  python launch/sweep.py --config=configs/sweeps/harsh.py --workdir=runs/sweep_harsh
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import sweep_config  # noqa: E402

W_INT4, KV_INT4 = ("rollout.weights", "int4"), ("rollout.kv_cache", "int4")
POINTS = (
    ("baseline", ()),
    ("w_fp8_tensor", (("rollout.weights", "fp8_tensor"),)),
    ("kv_fp8_e5m2", (("rollout.kv_cache", "fp8_e5m2"),)),
    ("w_int4", (W_INT4,)),
    ("kv_int4", (KV_INT4,)),
    ("w_int4_kv_int4", (W_INT4, KV_INT4)),
    ("w_int4e_kv_int4", (W_INT4, KV_INT4, ("rollout.quantize_embedding", True))),  # embedding / tied head too
    ("w_int4_kv_int4_stale_8", (W_INT4, KV_INT4, ("rollout.staleness_steps", 8))),
)


def get_config(arg=None):
  return sweep_config("harsh", arg, ("pair1", "pair2", "pair3"), POINTS)
