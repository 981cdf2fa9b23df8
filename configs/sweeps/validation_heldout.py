"""Pre-registered held-out validation of admission (issue 34, item 2; the rule and the points were committed before
any of their runs).

Question: does launch/admit.py with results/budget.json (the pooled budget, k3 0.429 at 150 steps) say correctly
which rollout configurations keep OPD quality within the 0.05 tolerance, on configurations and runs nothing in
calibration used?

Held out by construction:
- configurations: every point below is a (pair, rollout) combination no shipped results file ever trained
  (calibration, the earlier validations pair_budgets / boundary / recipes, and every other sweep; same mismatch
  knobs = same configuration, noise draw aside), checked again by tests/test_validation_heldout.py;
- seeds 3, 4, 5: every shipped run used 0, 1 or 2; each pair and seed trains its own baseline in the same sweep,
  and each point's quality loss is against that baseline;
- rows carry a run_id (config + seed + code version hash), so a later check can show no run is shared.

The points (results/validation_heldout/selected.json, read below) come from a screen and a written rule
(study/analysis/heldout.py, `RULE`): a pool of real recipes (weights int8 / fp8 / fp8_tensor / int4 / int3 /
int2, embedding-quantized int4 / int3, KV int8 / fp8 / int4, weight + KV combinations, staleness 2-16 alone and on
a recipe) and weight noise at sigmas no shipped run used (noise_seed fixed at 0: each seed trains the draw the
screen measured), screened by the admission check launch/admit.py runs (128 prompts, seed 0, the calibration batch
study/report.py --validate measures on), judged by admission.admit_value with results/budget.json at 150 steps.
Per pair: 3 "near" (compared k3 within x/÷ 1.5 of the budget: the first at or below it, the first above it, one
more) and 3 "far" (the first below the band, the first above it, one more); "first" ranks real recipes first, then
the closest to the budget, then by name. 18 configurations, 9 near.

Commands (in order; 1-2 are done and committed with this file, 3-4 run after the commit):
  1. screen (admission only, no training; 5.6 min for the three pairs on 2 busy CPU cores with a warm XLA
     compilation cache, the screens' `seconds`):
       for p in pair1 pair2 pair3; do python -m study.heldout_screen --pair=$p; done
  2. select (the rule on the screen files; reproduced by tests/test_validation_heldout.py):
       python -m study.heldout_screen --select
  3. the sweep, 63 runs (18 points + 3 baselines, x 3 seeds); about 1.5 h of wall time on 2 CPU cores, from the
     mean wall time of the same pairs' 150-step runs in results/pair_budgets_seed*.jsonl (selected.json
     `cost_estimate`). A point that fails is retried by rerunning the same command; none is dropped or replaced:
       for s in 3 4 5; do for p in pair1 pair2 pair3; do
         python launch/sweep.py --config=configs/sweeps/validation_heldout.py:pairs=$p,seed=$s \
             --workdir=runs/validation_heldout_${p}_seed$s
         cp runs/validation_heldout_${p}_seed$s/results.jsonl results/validation_heldout/${p}_seed$s.jsonl
       done; done
  4. judge with the shipped rule (each results file is one pair and seed with its own baseline; the --results are
     the calibration rows budget.json was fitted on, which validate() checks no held-out point repeats):
       python -m study.report --validate --results=results/sources.jsonl \
           --results=results/replicated/sources_seed1.jsonl --results=results/replicated/sources_seed2.jsonl \
           --seed_means --admission_k3=results/admission_k3.jsonl --tolerance=0.05 \
           $(for s in 3 4 5; do for p in pair1 pair2 pair3; do
               echo --heldout_results=results/validation_heldout/${p}_seed$s.jsonl; done; done) \
           --budget=results/budget.json --validation=results/validation_heldout.json --out=runs/report_heldout

Readout (fixed now): the shipped rule's agreement over the 18 configurations (seed-mean quality loss vs the
tolerance) with its 95% Wilson interval, next to reject-all, admit-all and the constant threshold on the compared k3
fitted on the calibration points only (heldout.calibration_constant: 0.419, right on 20 of the 21 calibration
configurations; the hindsight-best constant is an oracle and is labelled so); the same on the 9 near points alone;
seed-level agreement with configurations as clusters. Admission is said to beat the trivial rules only if its
agreement exceeds both reject-all's and admit-all's on all 18; whatever the outcome, it is reported as measured,
and nothing is re-selected or re-run after seeing results.
"""

import json
import os

from configs.sweeps.common import PAIRS, sweep_config

from configs.common import REPO, parse_arg

SELECTED = os.path.join(REPO, "results", "validation_heldout", "selected.json")
SEEDS = (3, 4, 5)  # study.analysis.heldout.SEEDS


def selected_points(path: str = SELECTED) -> dict[str, list[dict]]:
  with open(path) as f:
    return json.load(f)["points"]


def points_for(pair: str, path: str = SELECTED):
  return (("baseline", ()),) + tuple((p["name"], tuple(sorted(p["overrides"].items())))
                                     for p in selected_points(path)[pair])


def get_config(arg=None):
  args = parse_arg(arg, pairs="", steps=0, lr=0.0, objective="", seed=0, only="")
  pairs = args.pairs.split("+")
  if len(pairs) != 1 or pairs[0] not in PAIRS:
    raise ValueError(f"config argument pairs={args.pairs!r}: this sweep's points differ by pair; run one of "
                     f"{list(PAIRS)} per invocation (pairs=pair1)")
  if args.seed not in SEEDS:
    raise ValueError(f"config argument seed={args.seed}: the held-out validation runs seeds {list(SEEDS)} only "
                     "(seeds 0-2 are calibration's)")
  if args.steps or args.lr or args.objective:
    raise ValueError("config arguments steps / lr / objective: the pre-registered sweep runs the calibrated "
                     "150 steps, learning rate and objective; leave them out")
  return sweep_config("validation_heldout", arg, tuple(pairs), points_for(pairs[0]))
