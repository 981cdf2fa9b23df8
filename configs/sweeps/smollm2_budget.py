"""The real pair's own budget (issue 35, item 4): calibration points trained on SmolLM2-135M-Instruct -> its
20-layer pruned copy, pre-registered with the plan below before any of their runs.

  python launch/sweep.py --config=configs/sweeps/smollm2_budget.py:seed=S --workdir=runs/smollm2_budget_seedS

Plan (fixed now; a point that fails is retried by rerunning the same command, none is dropped or replaced):

- Quality: a point's final held-out reverse KL to the teacher (96 held-out prompts, the student's own samples),
  as a rise over the same seed's baseline, relative to that baseline (`launch/calibrate.py --quality=reverse_kl`);
  capitals accuracy is reported beside it, not judged. Tolerance: 0.05 (a 5% rise). One seed of the earlier
  recipe runs put fp8 weights at +0.9% and int4 weights at +11.7% (results/smollm2/recipes.jsonl), so 5% separates
  what is harmless from what is not with room for the seed noise of a paired difference.
- Run length: 100 steps (SHORT_STEPS), a third of the main run's 300, at its learning rate and objective. The
  short run must rank recipes as the full run does: baseline, fp8 and int4 weights at both lengths, seed 0
  (`configs/sweeps/smollm2.py:steps=100` and `:steps=300`), before the budget is used.
- Points (CALIBRATION below): the baseline; weight noise at three sigmas (a step-0 screen on 64 prompts put
  sigma 0.01 / 0.02 / 0.04 / 0.08 at k3 0.018 / 0.069 / 0.26 / 0.88, so 0.01, 0.03 and 0.06 span 0.02-0.6);
  int4 and int3 weights; an int4 KV cache; the per-layer fp8 recipe of the sensitivity scan
  (results/smollm2/recipe_fp8_e4m3.json: seven sensitive layers kept bf16); staleness 8 and 32 at the run's
  learning rate. Seeds 0 and 1 (two, not three: the machine budget below; the interval resamples points, then
  seeds).
- The k3 factor: launch/admission_k3.py on the same points (step-0 k3 on the admission batch / run-mean k3).
- Budget: launch/calibrate.py --quality=reverse_kl --tolerance=0.05 --seed_means --admission_k3=... on the two
  seeds' results, written to results/smollm2/budget.json, which `configs/smollm2.py` names for admission.
- Validation (after the budget; its rule is `HELDOUT_RULE`, committed here first): a pool of recipes no
  calibration point trained (`HELDOUT_POOL`), screened with launch/admit.py's own path against
  results/smollm2/budget.json; selected by the rule; trained at seeds 3 and 4 (calibration uses 0 and 1), each
  seed with its own baseline; judged with admission.admit_value (what launch/admit.py does) against the
  budget file, and, for the transfer question, against results/budget.json (the embedded pairs' pooled budget
  and factor) on the same runs.
- Cost on this 2-core machine, at about 11.5 minutes per 100-step point (5 s per step, two evaluations of 96
  prompts, start-up): calibration 10 points x 2 seeds = 20 runs, 3.8 h; the factor's screen, 6 min; ranking
  check 3 short runs, 0.6 h (the full side is item 3's recipe runs); validation 5 points + baseline x 2 seeds =
  12 runs, 2.3 h. In all about 6.8 hours, resumable point by point across sessions.
"""

from configs.common import load_recipe_rules
from configs.common import REPO
from configs.sweeps.common import sweep_config

import os

SHORT_STEPS = 100
SEEDS = (0, 1)
RECIPE = os.path.join(REPO, "results", "smollm2", "recipe_fp8_e4m3.json")

CALIBRATION = (
    ("baseline", ()),
    ("noise_0.01", (("rollout.noise_sigma", 0.01),)),
    ("noise_0.03", (("rollout.noise_sigma", 0.03),)),
    ("noise_0.06", (("rollout.noise_sigma", 0.06),)),
    ("w_int4", (("rollout.weights", "int4"),)),
    ("w_int3", (("rollout.weights", "int3"),)),
    ("kv_int4", (("rollout.kv_cache", "int4"),)),
    ("w_fp8_recipe", (("rollout.weight_rules", load_recipe_rules(RECIPE)),)),
    ("stale_8", (("rollout.staleness_steps", 8),)),
    ("stale_32", (("rollout.staleness_steps", 32),)),
)

# Recipes for the held-out validation: none is a calibration point (noise at sigmas calibration does not use).
HELDOUT_POOL = (
    {"weights": "fp8"}, {"weights": "fp8_tensor"}, {"weights": "int8"}, {"kv_cache": "int8"},
    {"kv_cache": "fp8_e4m3"}, {"weights": "fp8", "kv_cache": "fp8_e4m3"}, {"weights": "int4", "kv_cache": "int4"},
    {"weights": "int8", "kv_cache": "int4"}, {"weights": "fp8", "kv_cache": "int4"},
    {"weights": "int4", "quantize_embedding": True}, {"staleness_steps": 16}, {"weights": "fp8", "staleness_steps": 8},
    {"noise_sigma": 0.02}, {"noise_sigma": 0.04}, {"noise_sigma": 0.05}, {"noise_sigma": 0.08}, {"noise_sigma": 0.12},
)
HELDOUT_SEEDS = (3, 4)
HELDOUT_RULE = ("Screen every HELDOUT_POOL recipe with launch/admit.py --candidates on configs/smollm2.py against "
                "results/smollm2/budget.json (its default 128 prompts, seed 0, judged at the calibration's "
                f"{SHORT_STEPS} steps); ratio = the k3 it compares (step-0 k3 / the pair's factor) / the budget. "
                "Near: 1/1.5 <= ratio <= 1.5, split at 1 into near-below and near-above; far: outside that band. "
                "Rank real recipes (no weight noise) first, then |log ratio| ascending, then name. Pick the first "
                "near-below, the first near-above, one more near (either side), the first far-below and the first "
                "far-above: 5 points. Fewer than that available is reported as it is, not filled from elsewhere.")
# The real pair's quality is its reverse KL on its own samples: keep the sampled evaluation, at the config's size.
# The learning rate and GKD beta every calibration and validation run trained at, pinned here so a later change to
# configs/smollm2.py's main run (2e-4, then beta 0.7) does not change what the budget is for.
EVALUATION = (("train.eval_sampled", True), ("train.eval_size", 96), ("train.log_every", 5),
              ("optimizer.learning_rate", 1e-4), ("objective.beta", 0.5))


def get_config(arg=None):
  return sweep_config("smollm2_budget", arg, ("smollm2",), CALIBRATION, base=EVALUATION, default_steps=SHORT_STEPS)
