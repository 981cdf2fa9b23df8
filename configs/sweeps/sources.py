"""Every mismatch source on all three pairs, against one baseline per pair: the weight-noise points that bound
each pair's budget, and the harshest rollout recipes real engines use - int4 weights (per channel) with an int4
KV cache, that plus the embedding / tied LM head in int4, and that with 8 stale versions
(configs/sweeps/common.py for pairs= / steps= / lr= / objective= / seed=).

  python launch/sweep.py --config=configs/sweeps/sources.py --workdir=runs/sweep_sources

Milder recipes are screened, not trained: per-tensor fp8 weights and an fp8_e5m2 KV cache measure k3 0.0009 /
0.010 on pair1, int4 weights alone 0.027 and an int4 KV cache alone 0.038 (launch/admit.py --candidates), all
far inside every budget; configs/sweeps/quantization.py trains the int8 / fp8 ones. 2 CPU cores run about 30
points an hour.
"""

from configs.sweeps.common import sweep_config

SIGMAS = (0.1, 0.15, 0.2, 0.3)  # around pair1's crossing (sigma 0.15-0.175 in configs/sweeps/noise.py)
W_INT4, KV_INT4 = ("rollout.weights", "int4"), ("rollout.kv_cache", "int4")
POINTS = (
    ("baseline", ()),
    *((f"noise_{s:g}", (("rollout.noise_sigma", s),)) for s in SIGMAS),
    ("w_int4_kv_int4", (W_INT4, KV_INT4)),
    ("w_int4e_kv_int4", (W_INT4, KV_INT4, ("rollout.quantize_embedding", True))),  # embedding / tied head too
    ("w_int4_kv_int4_stale_8", (W_INT4, KV_INT4, ("rollout.staleness_steps", 8))),
)


def get_config(arg=None):
  return sweep_config("sources", arg, ("pair1", "pair2", "pair3"), POINTS)
