"""The study's replicated tables, rendered from shipped files (how each is made: docs/study.md):

  prefix_shift_pair1.json, prefix_shift_pair1_seed<S>.json
                        study/prefix_shift.py --seed=S (seed 0 is the unsuffixed file): the prefix shift and the
                        per-token estimate errors over seeds, with the spread between them
  pair_budgets.json     study/pair_budgets.py: the pre-registered per-pair budget test and its decision
  replicated/sources_seed<S>.jsonl, replicated/noise_75_seed<S>.jsonl, budget.json
                        configs/sweeps/sources.py:seed=S and noise.py:steps=75,grid=bound,seed=S: every calibration
                        point again with seeds 1 and 2 (seed 0 is results/sources.jsonl and noise_75.jsonl), and
                        launch/calibrate.py --seed_means over the three (budget.json, which admission reads)
  replicated/budget_one_seed.json
                        the budgets calibrated on seed 0 alone (admission's budgets before the replicated calibration)
  replicated/noise_40_seed<S>.jsonl
                        configs/sweeps/noise.py:steps=40,grid=bound,seed=S: the third run length of the horizon test
  validation_pairs.json study/report.py --validate on configs/sweeps/pair_budgets.py's runs: held-out points with
                        three fresh seeds and fresh baselines, next to the simple rules
  sensitivity/<pair>/sensitivity_<precision>.json, recipe_<precision>.json
                        launch/sensitivity.py --config=configs/<pair>.py --out=results/sensitivity/<pair>: which
                        layers and module types carry each embedded pair's quantization mismatch, and the recipe
"""

from __future__ import annotations

import glob
import os

import numpy as np

from opd_jax.experiments.files import read_json
from study.tables import validation
from study.tables.markdown import md_table

SOURCES = {"prefix shift over seeds (pair1)": "results/prefix_shift_pair1*.json",
           "corrections over seeds (prefix shift, pair1)": "results/prefix_shift_pair1*.json",
           "per-pair budget test (pre-registered)": "results/pair_budgets.json",
           "calibration points over seeds": "results/sources.jsonl, results/replicated/sources_seed*.jsonl",
           "75-step calibration points over seeds (pair1)":
               "results/noise_75.jsonl, results/replicated/noise_75_seed*.jsonl",
           "budgets: one seed per point vs the seed mean": "results/replicated/budget_one_seed.json, results/budget.json",
           "horizon test (pre-registered)": "results/sources.jsonl, results/replicated/*.jsonl, results/noise_75.jsonl",
           "validation with fresh seeds": "results/validation_pairs.json",
           "validation with fresh seeds against simple rules": "results/validation_pairs.json",
           "validation with fresh seeds: admission k3 vs run-mean k3": "results/validation_pairs.json",
           "held-out validation (pre-registered)": "results/validation_heldout.json",
           "held-out validation (pre-registered) against simple rules": "results/validation_heldout.json",
           "held-out validation (pre-registered): admission k3 vs run-mean k3": "results/validation_heldout.json",
           "quantization sensitivity (embedded pairs)": "results/sensitivity/pair*/"}


def _spread(values: list, fmt: str = "{:+.3f}") -> str:
  """mean [min, max] over seeds."""
  values = [v for v in values if v is not None]
  if not values:
    return "n/a"
  return f"{fmt.format(float(np.mean(values)))} [{fmt.format(min(values))}, {fmt.format(max(values))}]"


def prefix_shift_files(results_dir: str) -> list[dict]:
  paths = sorted(glob.glob(os.path.join(results_dir, "prefix_shift_pair1*.json")))
  return [read_json(p, "prefix-shift file") for p in paths]


def prefix_shift_table(runs: list[dict]) -> str:
  """Per sigma over the seeds' files: mean [min, max] of the prefix shift and of the naive / TIS estimate errors."""
  by_sigma: dict[float, list[dict]] = {}
  for run in runs:
    for row in run["rows"]:
      by_sigma.setdefault(row["sigma"], []).append(row)
  body = []
  for sigma, rows in sorted(by_sigma.items()):
    col = lambda key: [r[key] for r in rows]
    body.append([f"{sigma:g}", str(len(rows)), _spread(col("same_prefix_k3"), "{:.3g}"), _spread(col("prefix_shift")),
                 _spread(col("k1_naive_error")), _spread(col("k1_tis_error")),
                 _spread([100 * a for a in col("accuracy_clean")], "{:.1f}"),
                 _spread([100 * a for a in col("accuracy_noisy")], "{:.1f}"),
                 _spread([100 * a for a in col("identical_responses")], "{:.0f}")])
  return md_table(["sigma", "seeds", "same-prefix k3", "prefix shift", "naive error", "TIS error", "acc clean %",
              "acc noisy %", "identical responses %"], body)


def corrections_over_seeds_table(runs: list[dict], sigmas=(0.03, 0.1)) -> str:
  """At the sigmas where the corrections differ: each correction's estimate error and the prefix shift it leaves,
  mean [min, max] over seeds."""
  body = []
  for sigma in sigmas:
    rows = [r for run in runs for r in run["rows"] if r["sigma"] == sigma]
    kinds = list(dict.fromkeys(k for r in rows for k in r.get("corrections", {})))
    for kind in kinds:
      cs = [r["corrections"][kind] for r in rows if kind in r.get("corrections", {})]
      body.append([f"{sigma:g}", kind, str(len(cs)), _spread([c["k1_error"] for c in cs]),
                   _spread([c["shift"] for c in cs]), _spread([100 * c["ess"] for c in cs], "{:.0f}")])
  return md_table(["sigma", "correction", "seeds", "error of the OPD estimate", "prefix shift left", "ESS %"], body)


def pair_test_table(test: dict) -> str:
  """Per pair and point: run-mean k3, each seed's quality loss, the seed mean with its interval, and the side of
  the tolerance the interval is on; the decision point's rows first."""
  body = []
  points = sorted(test["points"], key=lambda p: (p["point"] != test["decision_point"], p["point"], p["pair"]))
  for p in points:
    lo, hi = p["interval"]
    body.append([p["pair"], p["point"] + (" (decides)" if p["point"] == test["decision_point"] else ""),
                 ", ".join(f"{k.split('.')[-1]}={v}" for k, v in p["overrides"].items()), f"{p['run_k3']:.3g}",
                 ", ".join(f"{100 * s['quality_loss']:+.1f}" for s in p["seeds"]),
                 f"{100 * p['quality_loss']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]", p["side"]])
  body.append(["all", "decision", "", "", "", "", test["decision"]])
  return md_table(["pair", "point", "knob", "run-mean k3 (seed mean)", "quality loss per seed",
                  "seed mean [95% t-interval]",
              f"vs tolerance {100 * test['tolerance']:g}"], body)


def seeds_table(points: list[dict], tolerance: float) -> str:
  """pair_budgets.summarize's entries: each seed's run-mean k3 and quality loss, the seed mean with its interval."""
  body = []
  for p in points:
    lo, hi = p["interval"]
    body.append([p["pair"], p["point"], ", ".join(f"{s['run_k3']:.3g}" for s in p["seeds"]),
                 ", ".join(f"{100 * s['quality_loss']:+.1f}" for s in p["seeds"]),
                 f"{100 * p['quality_loss']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]", p["side"]])
  return md_table(["pair", "point", "run-mean k3 per seed", "quality loss per seed", "seed mean [95% t-interval]",
              f"vs tolerance {100 * tolerance:g}"], body)


def _budget_cell(b: dict | None) -> str:
  """A budget with its 90% interval, or n/a."""
  return "n/a" if b is None else f"{b['budget']:.3g} [{b['interval'][0]:.3g}, {b['interval'][1]:.3g}]"


def seed_rows(results_dir: str, name: str) -> list[dict]:
  """A calibration sweep's rows over its seeds: results/NAME.jsonl (seed 0, when shipped) and
  results/replicated/NAME_seed<S>.jsonl, each with its deltas against its own seed's baseline."""
  from opd_jax.experiments.calibrate_report import load_rows
  first = os.path.join(results_dir, f"{name}.jsonl")
  return load_rows(([first] if os.path.exists(first) else []) +
                   sorted(glob.glob(os.path.join(results_dir, "replicated", f"{name}_seed*.jsonl"))))


def budgets_side_by_side(single: dict, means: dict) -> str:
  """Each budget calibrated on seed 0 alone (replicated/budget_one_seed.json) next to the one on seed means
  (budget.json), with their intervals."""
  body = []
  for key, b in means["budgets"].items():
    one = single["budgets"].get(key)
    seeds = sorted({p.get("seeds", 1) for p in b["points"]})
    body.append([key, _budget_cell(one), _budget_cell(b), str(len(b["points"])), "/".join(map(str, seeds)),
                 "yes" if b["bounded"] else "no"])
  return md_table(["budget", "one seed per point [90% interval]", "seed mean [90% interval, seeds resampled]", "points",
              "seeds per point", "bounded"], body)


def horizon_table(test: dict, budget: dict) -> str:
  """horizon.decide's lengths: each seed's loss at the test point, the seed mean with its t-interval and side, and
  pair1's seed-mean budget calibrated at that length (budget.json; used only when the decision is "moves")."""
  from opd_jax.experiments.calibrate_report import horizon_key
  body = []
  for p in test["lengths"]:
    lo, hi = p["interval"]
    b = budget["budgets"].get(horizon_key(test["pair"], p["steps"], budget["steps"]))
    body.append([str(p["steps"]), f"{p['run_k3']:.3g}", ", ".join(f"{100 * s['quality_loss']:+.1f}" for s in p["seeds"]),
                 f"{100 * p['quality_loss']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]", p["side"], _budget_cell(b)])
  body.append(["all", "", "", "", test["decision"], ""])
  return md_table(["run length (steps)", f"{test['point']} run-mean k3 (seed mean)", "quality loss per seed",
              "seed mean [95% t-interval]", f"vs tolerance {100 * test['tolerance']:g}",
              f"{test['pair']} budget (seed means) [90% interval]"], body)


def sensitivity_table(scans: list[tuple[dict, dict]], top: int = 4) -> str:
  """Per pair and precision (launch/sensitivity.py's scan and recipe): the whole-model k3, the groups (layers and
  module types) that add the most k3 alone, the fitted recipe, its k3 and its weight bytes against bf16."""
  body = []
  for scan, recipe in scans:
    groups = sorted(scan["groups"], key=lambda g: -g["k3"])
    kept = ", ".join(recipe["kept_bf16"]) or "nothing"
    body.append([scan["pair"], scan["precision"], f"{scan['whole_model']['k3']:.3g}",
                 ", ".join(f"{g['name']} ({g['k3']:.2g})" for g in groups[:top]),
                 f"{kept} bf16, rest {recipe['precision']}", f"{recipe['k3']:.2g}",
                 f"{recipe['weight_bytes'] / recipe['weight_bytes_bf16']:.2f}x"])
  return md_table(["pair", "weights", "whole model k3", "top groups (k3)", "fitted recipe", "recipe k3",
              "recipe weight bytes vs bf16"], body)


def sensitivity_files(results_dir: str) -> list[tuple[dict, dict]]:
  """(scan, recipe) for every results/sensitivity/<pair>/sensitivity_<precision>.json, by pair and precision."""
  out = []
  for path in sorted(glob.glob(os.path.join(results_dir, "sensitivity", "*", "sensitivity_*.json"))):
    recipe = os.path.join(os.path.dirname(path), os.path.basename(path).replace("sensitivity_", "recipe_"))
    out.append((read_json(path, "sensitivity file"), read_json(recipe, "recipe file")))
  return out


def tables(results_dir: str) -> dict[str, str]:
  from study.analysis.validation import admission_vs_run_k3
  out = {}
  runs = prefix_shift_files(results_dir)
  if len(runs) > 1:
    out["prefix shift over seeds (pair1)"] = prefix_shift_table(runs)
    out["corrections over seeds (prefix shift, pair1)"] = corrections_over_seeds_table(runs)
  path = os.path.join(results_dir, "pair_budgets.json")
  if os.path.exists(path):
    out["per-pair budget test (pre-registered)"] = pair_test_table(read_json(path, "per-pair test file"))
  replicated = os.path.join(results_dir, "replicated")
  files = {name: sorted(glob.glob(os.path.join(replicated, f"{name}_seed*.jsonl")))
           for name in ("sources", "noise_75", "noise_40")}
  if files["sources"]:
    from opd_jax.experiments import horizon
    from opd_jax.experiments.pair_budgets import summarize
    budget = read_json(os.path.join(results_dir, "budget.json"), "budget file")
    tolerance = budget["tolerance"]
    rows = seed_rows(results_dir, "sources")
    out["calibration points over seeds"] = seeds_table(summarize(rows, tolerance), tolerance)
    if files["noise_75"]:
      rows_75 = seed_rows(results_dir, "noise_75")
      out["75-step calibration points over seeds (pair1)"] = seeds_table(summarize(rows_75, tolerance), tolerance)
      if len(files["noise_40"]) >= 3:
        test = horizon.decide(rows + rows_75 + seed_rows(results_dir, "noise_40"), tolerance)
        out["horizon test (pre-registered)"] = horizon_table(test, budget)
  path = os.path.join(replicated, "budget_one_seed.json")
  if os.path.exists(path):
    out["budgets: one seed per point vs the seed mean"] = budgets_side_by_side(
        read_json(path, "budget file"), read_json(os.path.join(results_dir, "budget.json"), "budget file"))
  for name, title in (("validation_pairs.json", "validation with fresh seeds"),
                      ("validation_heldout.json", "held-out validation (pre-registered)")):
    path = os.path.join(results_dir, name)
    if os.path.exists(path):
      judged = read_json(path, "validation file")
      out[title] = validation.validation_table(judged)
      out[f"{title} against simple rules"] = validation.validation_rules_table(judged)
      if admission_vs_run_k3(judged)["n"]:
        out[f"{title}: admission k3 vs run-mean k3"] = validation.k3_quantities_table(judged)
  scans = sensitivity_files(results_dir)
  if scans:
    out["quantization sensitivity (embedded pairs)"] = sensitivity_table(scans)
  return out
