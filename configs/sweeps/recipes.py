"""Held-out quantization recipes near the budget: 3-bit weights (per channel, the GPTQ / llama.cpp Q3 grid),
which the admission check screens at k3 0.24 / 1.98 / 0.48 on pair1 / pair2 / pair3 (0.8x / 2.8x / 1.8x
their budgets), so the same recipe is predicted to pass on one pair and fail on the others. Not a calibration
point: `study/report.py --validate --heldout_results=...` judges it by its seed-mean quality loss, each seed
against the same seed's baseline.

  for s in 0 1 2; do python launch/sweep.py --config=configs/sweeps/recipes.py:seed=$s \
      --workdir=runs/sweep_recipes_seed$s; done

(results/recipes_seed*.jsonl)
"""

from configs.sweeps.common import PAIRS, sweep_config

POINTS = (
    ("baseline", ()),
    ("w_int3", (("rollout.weights", "int3"),)),
)


def get_config(arg=None):
  return sweep_config("recipes", arg, PAIRS, POINTS)
