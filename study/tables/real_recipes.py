"""Rollout recipes trained on the real pair at the main run's settings, against the main run of the same seed
(issue 35, item 3), rendered from the shipped files:

  results/smollm2/recipes_300/<weights>/seed<S>/metrics.jsonl   launch/train.py --config=configs/smollm2.py
                                                                --config.seed=S --config.rollout.weights=<weights>
                                                                --config.train.eval_every=300 (evaluated at the ends)
  results/smollm2/run*/seed<S>/metrics.jsonl                    the main run of that seed at the recipe's settings
                                                                (the same config.json but for rollout and the
                                                                evaluation cadence): the baseline

A recipe run evaluates at its ends only; evaluations do not change the training trajectory
(tests/test_train.py::test_evaluations_do_not_change_the_training_trajectory), and the recipes' code reproduces
the shipped main runs bit for bit (results/smollm2/run_v4_beta0.5/reproduce_check.json), so each main run is the
baseline of the recipes that share its seed and settings. Since the main config moved to GKD beta 0.7, the recipe
runs pin beta 0.5, and their baselines are results/smollm2/run_v4_beta0.5/.
"""

from __future__ import annotations

import os

import numpy as np

from opd_jax.errors import InputError
from opd_jax.experiments.files import read_json, read_jsonl
from opd_jax.experiments.intervals import T_INTERVAL
from study.tables.markdown import md_table, mean_cell
from study.tables.real_pair import _evals, seed_folders


def _mean_interval(values: list[float], scale: float = 1.0, digits: int = 3, sign: str = "") -> str:
  """The mean of `values` (times `scale`) and its t-interval; the value alone for one seed or where the seeds agree."""
  return mean_cell(values, lambda x: f"{scale * x:{sign}.{digits}f}")


def recipe_folders(root: str) -> dict[str, dict[int, str]]:
  """weights -> {seed: folder} of every recipes_300/<weights>/seed<S>/ holding a metrics.jsonl."""
  base = os.path.join(root, "recipes_300")
  if not os.path.isdir(base):
    return {}
  found = {name: dict(seed_folders(os.path.join(base, name))) for name in sorted(os.listdir(base))}
  return {name: seeds for name, seeds in found.items() if seeds}


def recipes_300_table(recipes: dict[str, dict[int, list[dict]]], baselines: dict[str, dict[int, list[dict]]]) -> str:
  """Per recipe, over the seeds it ran (each against its baseline of the same seed, baselines[recipe][seed]): the
  run's mean k3 between sampler and learner, the final held-out reverse KL of recipe and baseline, the recipe's rise
  over its baseline as a fraction of the baseline's (the budget's quality,
  opd_jax.mismatch.budget.QUALITIES["reverse_kl"]), and the greedy capitals accuracy, share at the token cap and
  share repeating, recipe then baseline."""
  body = []
  for weights, runs in recipes.items():
    seeds = sorted(s for s in runs if s in baselines[weights])
    if not seeds:
      continue
    last = {s: _evals(runs[s])[-1] for s in seeds}
    base = {s: _evals(baselines[weights][s])[-1] for s in seeds}
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


# The config.json fields that decide a run's training trajectory apart from its sampler: a recipe run's baseline
# must share them (fields added to the config later, evaluation cadence and names may differ).
_MATCH = ("seed", "student", "teacher", "objective", "optimizer", "data.mix", "data.max_prompt_tokens", "train.steps",
          "train.batch_size", "rollout.max_new_tokens", "rollout.temperature")


def _settings(folder: str) -> dict:
  """The _MATCH fields of the run's config.json ({} where the folder has none, as in the tests' tiny runs)."""
  path = os.path.join(folder, "config.json")
  config = read_json(path, "run config") if os.path.exists(path) else {}
  out = {}
  for key in _MATCH:
    value = config
    for part in key.split("."):
      value = value.get(part) if isinstance(value, dict) else None
    out[key] = os.path.basename(value) if key in ("student", "teacher") and value else value  # not the machine's dir
  return out if config else {}


def baseline_folders(root: str, recipe: str, seeds: dict[int, str]) -> dict[int, str]:
  """seed -> the first main run (root/run/, then root/run_v*/, seed<S>/) whose settings equal the recipe run's. A
  recipe run whose settings no main run of its seed shares is an error, not a comparison across settings."""
  mains = sorted(name for name in os.listdir(root) if name == "run" or name.startswith("run_v"))
  out = {}
  for seed, folder in seeds.items():
    wanted = _settings(folder)
    candidates = [dict(seed_folders(os.path.join(root, name))).get(seed) for name in mains]
    found = [c for c in candidates if c and _settings(c) == wanted]
    if not found:
      raise InputError(f"recipes_300/{recipe}/seed{seed}: no main run of seed {seed} under {root}/run*/ trained at its "
                       f"settings ({', '.join(_MATCH)}); ship that baseline run beside it")
    out[seed] = found[0]
  return out


def tables(results_dir: str) -> dict[str, str]:
  """Title -> markdown table, when results_dir/smollm2/recipes_300/ holds a recipe run."""
  root = os.path.join(results_dir, "smollm2")
  found = recipe_folders(root)
  if not found:
    return {}
  recipes, baselines = {}, {}
  for weights, seeds in found.items():
    recipes[weights] = {s: read_jsonl(os.path.join(f, "metrics.jsonl")) for s, f in seeds.items()}
    baselines[weights] = {s: read_jsonl(os.path.join(f, "metrics.jsonl"))
                          for s, f in baseline_folders(root, weights, seeds).items()}
  return {"smollm2 recipes at 300 steps": recipes_300_table(recipes, baselines)}
