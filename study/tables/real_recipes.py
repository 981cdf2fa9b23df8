"""Rollout recipes trained on the real pair at the main run's settings, against the main run of the same seed
(issue 35, item 3), rendered from the shipped files:

  results/smollm2/recipes_300/<weights>/seed<S>/metrics.jsonl   launch/train.py --config=configs/smollm2.py
                                                                --config.seed=S --config.rollout.weights=<weights>
                                                                --config.train.eval_every=300 (evaluated at the ends)
  results/smollm2/run/seed<S>/metrics.jsonl                     the main run of that seed: the baseline

A recipe run evaluates at its ends only; evaluations do not change the training trajectory
(tests/test_train.py::test_evaluations_do_not_change_the_training_trajectory), and today's code reproduces the
shipped main runs bit for bit (results/smollm2/run/reproduce_check.json), so each main run is its seed's baseline.
"""

from __future__ import annotations

import os

import numpy as np

from opd_jax.experiments.files import read_jsonl
from opd_jax.experiments.intervals import T_INTERVAL, t_interval
from study.tables.markdown import md_table
from study.tables.real_pair import _evals, seed_folders


def _mean_interval(values: list[float], scale: float = 1.0, digits: int = 3, sign: str = "") -> str:
  """The mean of `values` (times `scale`) and its t-interval; the value alone for one seed or where the seeds agree."""
  cell = lambda x: f"{scale * x:{sign}.{digits}f}"
  if max(values) - min(values) < 1e-12:
    return cell(values[0])
  lo, hi = t_interval(values)
  return f"{cell(float(np.mean(values)))} [{cell(lo)}, {cell(hi)}]"


def recipe_folders(root: str) -> dict[str, dict[int, str]]:
  """weights -> {seed: folder} of every recipes_300/<weights>/seed<S>/ holding a metrics.jsonl."""
  base = os.path.join(root, "recipes_300")
  if not os.path.isdir(base):
    return {}
  found = {name: dict(seed_folders(os.path.join(base, name))) for name in sorted(os.listdir(base))}
  return {name: seeds for name, seeds in found.items() if seeds}


def recipes_300_table(recipes: dict[str, dict[int, list[dict]]], baselines: dict[int, list[dict]]) -> str:
  """Per recipe, over the seeds it ran (each against the main run of the same seed): the run's mean k3 between
  sampler and learner, the final held-out reverse KL of recipe and baseline, the recipe's rise over its baseline as a
  fraction of the baseline's (the budget's quality, opd_jax.mismatch.budget.QUALITIES["reverse_kl"]), and the
  greedy capitals accuracy, share at the token cap and share repeating, recipe then baseline."""
  body = []
  for weights, runs in recipes.items():
    seeds = sorted(s for s in runs if s in baselines)
    if not seeds:
      continue
    last = {s: _evals(runs[s])[-1] for s in seeds}
    base = {s: _evals(baselines[s])[-1] for s in seeds}
    k3 = [np.mean([r["mismatch/k3"] for r in runs[s] if "mismatch/k3" in r]) for s in seeds]
    pair = lambda key, scale=1.0, digits=3: (f"{_mean_interval([last[s][key] for s in seeds], scale, digits)} vs "
                                             f"{_mean_interval([base[s][key] for s in seeds], scale, digits)}")
    rise = [last[s]["eval/reverse_kl"] / base[s]["eval/reverse_kl"] - 1.0 for s in seeds]
    body.append([f"weights={weights}", " / ".join(map(str, seeds)), f"{np.mean(k3):.3g}", pair("eval/reverse_kl"),
                 _mean_interval(rise, 100, 1, "+") + "%", pair("eval/accuracy", 100, 1),
                 pair("eval/at_cap", 100, 1), pair("eval/repetition", 100, 1)])
  return md_table(["recipe (300 steps)", "seeds", "run k3 (seed mean)",
                   f"final reverse KL: recipe vs baseline ({T_INTERVAL})", "rise over own baseline",
                   "capitals accuracy %: recipe vs baseline", "at the cap %", "repeating %"], body)


def tables(results_dir: str) -> dict[str, str]:
  """Title -> markdown table, when results_dir/smollm2/recipes_300/ holds a recipe run."""
  root = os.path.join(results_dir, "smollm2")
  found = recipe_folders(root)
  if not found:
    return {}
  baselines = {s: read_jsonl(os.path.join(f, "metrics.jsonl")) for s, f in seed_folders(os.path.join(root, "run"))}
  recipes = {w: {s: read_jsonl(os.path.join(f, "metrics.jsonl")) for s, f in seeds.items()}
             for w, seeds in found.items()}
  return {"smollm2 recipes at 300 steps": recipes_300_table(recipes, baselines)}
