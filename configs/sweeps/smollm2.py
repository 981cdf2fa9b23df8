"""Rollout recipes trained on the real pair (SmolLM2-135M-Instruct -> its 20-layer pruned copy): the baseline, an
fp8 recipe the admission screen admits, and int4 weights / an int4 KV cache, which it screens above the embedded
pairs' pooled budget. Quality is the final held-out reverse KL to the teacher (and capitals accuracy), each
against the baseline of the same seed.

  python launch/sweep.py --config=configs/sweeps/smollm2.py --workdir=runs/sweep_smollm2

(copy its results.jsonl to results/smollm2/recipes.jsonl; about 33 minutes per point on 2 CPU cores, one seed)
"""

from configs.sweeps.common import sweep_config

POINTS = (
    ("baseline", ()),
    ("w_fp8", (("rollout.weights", "fp8"),)),
    ("w_int4", (("rollout.weights", "int4"),)),
    ("kv_int4", (("rollout.kv_cache", "int4"),)),
)
# The real pair's quality is its reverse KL on its own samples: keep the sampled evaluation, at the config's size.
EVALUATION = (("train.eval_sampled", True), ("train.eval_size", 96), ("train.log_every", 5))


def get_config(arg=None):
  return sweep_config("smollm2", arg, ("smollm2",), POINTS, base=EVALUATION)
