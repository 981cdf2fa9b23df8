"""The real pair's other configs against its main one, seed by seed (issue 35: the changes that led to
configs/smollm2.py, and screens that did not move it), rendered from the shipped files:

  results/smollm2/run/seed<S>/            the main config (the reference of every row)
  results/smollm2/run_v<N>_*/seed<S>/     an earlier main config
  results/smollm2/screen_*/seed<S>/       a candidate screened against the main config (its README says the rule)
  results/smollm2/timing_*/seed<S>/       the main config with another evaluation / checkpoint cadence: time.json and
                                          same_metrics.json (its rows against run/seed<S>'s)

A folder enters the table when at least two of its seeds have a main run of the same seed. Each cell is the seed
mean with its 95% t-interval; "paired change" is the per-seed change of the final held-out reverse KL against the
main run of the same seed, averaged. Where the configs differ is read from each run's config.json.
"""

from __future__ import annotations

import os

from opd_jax.experiments.files import read_json, read_jsonl
from opd_jax.experiments.intervals import T_INTERVAL
from study.tables.markdown import md_table, mean_cell
from study.tables.real_pair import _evals, seed_folders

# config.json fields that change what a run learns; the table names those in which a folder differs from run/
_COMPARED = ("objective.", "optimizer.", "train.steps", "train.batch_size", "rollout.", "data.mix")


def _flat(tree: dict, prefix: str = "") -> dict:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[prefix + key] = value
  return out


def _differences(config: dict, main: dict) -> str:
  """`key value` for each compared field that both configs have and this one sets otherwise (fields added to the
  config since are not differences)."""
  a, b = _flat(config), _flat(main)
  keys = sorted(k for k in a.keys() & b.keys() if k.startswith(_COMPARED) and a[k] != b[k])
  return ", ".join(f"{k.split('.')[-1] if k.startswith(('objective.', 'optimizer.')) else k} {a[k]}"
                   for k in keys) or "none"


def _ratio(rows: list[dict]) -> float:
  evals = _evals(rows)
  return evals[-1]["eval/reverse_kl"] / evals[0]["eval/reverse_kl"]


def configs_table(main: dict[int, str], others: dict[str, dict[int, str]]) -> str:
  """main: seed -> folder of run/; others: name -> {seed: folder}. One row for the main config, then one per other
  folder over the seeds both ran."""
  rows = {s: read_jsonl(os.path.join(f, "metrics.jsonl")) for s, f in main.items()}
  main_config = read_json(os.path.join(next(iter(main.values())), "config.json"), "run config")
  pct = lambda values: mean_cell([100 * v for v in values], lambda x: f"{x:.1f}%")
  cells = lambda runs, seeds: [
      mean_cell([100 * _ratio(runs[s]) for s in seeds], lambda x: f"{x:.2f}%"),
      pct([_evals(runs[s])[-1]["eval/repetition"] for s in seeds]),
      pct([_evals(runs[s])[-1]["eval/at_cap"] for s in seeds]),
      mean_cell([_evals(runs[s])[-1]["eval/response_tokens"] for s in seeds], lambda x: f"{x:.1f}"),
      pct([_evals(runs[s])[-1]["eval/accuracy"] for s in seeds])]
  body = [["run (main)", "(the reference)", " / ".join(map(str, sorted(rows))), *cells(rows, sorted(rows)), ""]]
  if len(rows) > 3:  # the seeds the other configs ran, for a like-for-like comparison
    first = sorted(rows)[:3]
    body.append(["run (main), its first 3 seeds", "(the reference)", " / ".join(map(str, first)), *cells(rows, first),
                 ""])
  for name, folders in others.items():
    seeds = sorted(s for s in folders if s in rows)
    if len(seeds) < 2:
      continue
    runs = {s: read_jsonl(os.path.join(folders[s], "metrics.jsonl")) for s in seeds}
    config = read_json(os.path.join(folders[seeds[0]], "config.json"), "run config")
    change = [_evals(runs[s])[-1]["eval/reverse_kl"] / _evals(rows[s])[-1]["eval/reverse_kl"] - 1 for s in seeds]
    body.append([name, _differences(config, main_config), " / ".join(map(str, seeds)), *cells(runs, seeds),
                 mean_cell([100 * c for c in change], lambda x: f"{round(x, 1) + 0.0:+.1f}%")])  # no "-0.0%"
  return md_table(["config", "differs from run/ in", "seeds", f"reverse KL, distilled / pruned ({T_INTERVAL})",
                   "repeating", "at the cap", "greedy tokens", "capitals accuracy",
                   "final reverse KL against run/'s, same seed"], body)


def timing_table(folders: dict[int, str], main_times: dict[int, dict]) -> str:
  """One row per seed of a timing check: whether it trained exactly as the main run, and its time beside the main
  run's (time.json of each)."""
  body = []
  for seed, folder in sorted(folders.items()):
    same = read_json(os.path.join(folder, "same_metrics.json"), "equivalence file")
    time = read_json(os.path.join(folder, "time.json"), "time file")
    main = main_times.get(seed, {})
    identical = "yes" if not same["differences_total"] and same["samples_steps_0_and_300_identical"] else "no"
    minutes = lambda t: "n/a" if "wall_seconds" not in t else f"{t['wall_seconds'] / 60:.1f}"
    body.append([str(seed), f"{same['values_compared']} values, samples: {identical}", minutes(time),
                 minutes(main), f"{time['train_seconds']:.0f} vs {main.get('train_seconds', float('nan')):.0f}",
                 " + ".join(f"{x:.0f}" for x in time["eval_seconds"]), f"{time['peak_rss_bytes'] / 1e9:.2f}",
                 "n/a" if "peak_rss_bytes" not in main else f"{main['peak_rss_bytes'] / 1e9:.2f}"])
  return md_table(["seed", "same numbers as run/", "wall minutes", "run/'s wall minutes", "training s: this vs run/",
                   "evaluations s", "peak RSS GB", "run/'s peak RSS GB"], body)


def tables(results_dir: str) -> dict[str, str]:
  """Title -> markdown table, when results_dir/smollm2/run/ and another config's seeds (or a timing check's) are
  shipped."""
  root = os.path.join(results_dir, "smollm2")
  main = dict(seed_folders(os.path.join(root, "run")))
  if not main:
    return {}
  out = {}
  names = sorted(n for n in os.listdir(root) if n.startswith(("run_v", "screen_")))
  others = {n: dict(seed_folders(os.path.join(root, n))) for n in names}
  if any(len(set(f) & set(main)) >= 2 for f in others.values()):
    out["smollm2 configs against the main one"] = configs_table(main, others)
  main_times = {s: read_json(os.path.join(f, "time.json"), "time file") for s, f in main.items()
                if os.path.exists(os.path.join(f, "time.json"))}
  for name in sorted(n for n in os.listdir(root) if n.startswith("timing_")):
    folders = {s: f for s, f in seed_folders(os.path.join(root, name))
               if os.path.exists(os.path.join(f, "same_metrics.json"))}
    if folders:
      out[f"smollm2 {name}"] = timing_table(folders, main_times)
  return out
