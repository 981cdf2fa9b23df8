"""Pair 3 (Qwen2-style, embedded): OPD of the pair3 student from the pair3 teacher on the arithmetic task.

Run (about 8 minutes on 2 CPU cores; README lists the measured before/after accuracy):
  python launch/train.py --config=configs/pair3.py --workdir=runs/pair3
Smoke run (seconds):   --config=configs/pair3.py:runlocal
Sensitivity recipe:    --config=configs/pair3.py:recipe=runs/sensitivity_pair3/recipe_fp8.json
Mismatch knobs:        --config.rollout.weights=fp8 --config.rollout.kv_cache=fp8 --config.rollout.staleness_steps=2
Real checkpoints:      start from configs/real/*.py (every real-scale setting, with why; plan it with
                       python launch/plan_memory.py --config=configs/real/qwen3_1p7b_to_0p6b.py)
"""

from configs import common


def get_config(arg=None):
  """arg: 'runlocal' and/or 'recipe=PATH' (see configs.common.pair_config)."""
  return common.pair_config("pair3", arg)
