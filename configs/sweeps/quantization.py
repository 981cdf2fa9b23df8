"""Quantization study across all three embedded pairs: weight recipes and KV-cache dtypes.

Run (under an hour on 2 CPU cores; README lists the measured wall time):
  python launch/sweep.py --config=configs/sweeps/quantization.py --workdir=runs/sweep_quantization
Each point is a short OPD run (base_overrides) of configs/pairN.py with the point's rollout knobs.
"""

import ml_collections

SHORT_RUN = (  # shared by every sweep: each point trains this long and evaluates at its start and end
    ("train.steps", 150),
    ("train.log_every", 10),
    ("train.eval_every", 150),
    ("train.eval_size", 256),
    ("train.eval_sampled", False),
    ("train.checkpoint_every", 150),
)


def get_config(arg=None):
  del arg
  c = ml_collections.ConfigDict()
  c.name = "quantization"
  c.pairs = ("pair1", "pair2", "pair3")
  c.base_overrides = SHORT_RUN
  c.points = (
      ("baseline", ()),
      ("w_bf16", (("rollout.weights", "bf16"),)),
      ("w_int8", (("rollout.weights", "int8"),)),
      ("w_fp8", (("rollout.weights", "fp8"),)),
      ("kv_int8", (("rollout.kv_cache", "int8"),)),
      ("kv_fp8", (("rollout.kv_cache", "fp8_e4m3"),)),
      ("w_fp8_kv_fp8", (("rollout.weights", "fp8"), ("rollout.kv_cache", "fp8_e4m3"))),
  )
  return c
