"""The real pair's held-out validation of admission (issue 35, items 4-5), as configs/sweeps/smollm2_budget.py
pre-registered it (its HELDOUT_POOL, HELDOUT_RULE and HELDOUT_SEEDS, committed before any calibration run).

Question: does launch/admit.py with results/smollm2/budget.json (the real pair's own budget and k3 factor) say
correctly which rollout recipes keep the real pair's quality (final held-out reverse KL, as a rise over the same
seed's baseline) within the 0.05 tolerance, on recipes and runs calibration never used? And, on the same runs, how
would the embedded pairs' pooled budget and factor (results/budget.json) have judged them (transfer)?

Held out by construction: no pool recipe is a calibration point (tests/test_smollm2_budget.py); seeds 3 and 4
(calibration trained 0 and 1), each with its own baseline in the same sweep; rows carry a run_id.

Commands (in order; the selection is committed before the sweep starts):
  1. screen (admission only, no training) and select by the rule (study/analysis/heldout.py, plan `smollm2`):
       python -m study.heldout_screen --plan=smollm2 --pair=smollm2
       python -m study.heldout_screen --plan=smollm2 --select   # -> results/smollm2/validation/selected.json
  2. the sweep, 100 steps per run at the calibration's settings, the selected points and a baseline per seed;
     a point that fails is retried by rerunning the same command, none is dropped or replaced:
       for s in 3 4; do
         python launch/sweep.py --config=configs/sweeps/smollm2_validation.py:seed=$s \
             --workdir=runs/smollm2_validation_seed$s
         cp runs/smollm2_validation_seed$s/results.jsonl results/smollm2/validation/smollm2_seed$s.jsonl
       done

Weight noise keeps the sweep's per-seed draw (rollout.noise_seed = seed), as calibration trained it; the screen
measured draw 0 of the same sigma, as admission_k3 did for calibration's noise points.
"""

import json
import os

from configs.common import parse_arg, REPO
from configs.sweeps import smollm2_budget as campaign
from configs.sweeps.common import sweep_config

SELECTED = os.path.join(REPO, "results", "smollm2", "validation", "selected.json")


def points_for(path: str | None = None):
  """The baseline, then the selected points in pick order."""
  path = path or SELECTED
  if not os.path.isfile(path):
    raise ValueError(f"no selection {path}: screen and select first (python -m study.heldout_screen --plan=smollm2 "
                     "--pair=smollm2, then --select)")
  with open(path) as f:
    points = json.load(f)["points"]["smollm2"]
  return (("baseline", ()),) + tuple((p["name"], tuple(sorted(p["overrides"].items()))) for p in points)


def get_config(arg=None):
  args = parse_arg(arg, pairs="", steps=0, lr=0.0, objective="", seed=0, only="")
  if args.pairs not in ("", "smollm2"):
    raise ValueError(f"config argument pairs={args.pairs!r}: this validation is the real pair's (smollm2) only")
  if args.seed not in campaign.HELDOUT_SEEDS:
    raise ValueError(f"config argument seed={args.seed}: the held-out validation runs seeds "
                     f"{list(campaign.HELDOUT_SEEDS)} only (calibration trained {list(campaign.SEEDS)})")
  if args.steps or args.lr or args.objective:
    raise ValueError(f"config arguments steps / lr / objective: the pre-registered sweep runs the calibration's "
                     f"{campaign.SHORT_STEPS} steps, learning rate and objective; leave them out")
  return sweep_config("smollm2_validation", arg, ("smollm2",), points_for(), base=campaign.EVALUATION,
                      default_steps=campaign.SHORT_STEPS)
