"""Resumable sweeps: many short OPD runs (the same `train` as launch/train.py), one result row per point.

A sweep config (configs/sweeps/*.py) names `pairs`, `base_overrides` that shrink each run (pairs of
(dotted field, value)) and `points`, each (name, ((dotted field, value), ...)), e.g.
("fp8", (("rollout.weights", "fp8"),)). Every pair must have a point named "baseline"
(no mismatch knobs, sync); each row's quality delta is measured against it.

DIR/results.jsonl gets one complete JSON line per finished point: the point's full rollout config, run-averaged
mismatch metrics, final and best held-out accuracy, delta vs the baseline, wall time and status, and the run's
identity (`run_id`: a hash of its full resolved config, seed and `code_version`, experiments/run_identity.py).
Rerunning skips points already "ok"; a point that crashed is recorded with status "failed" and its error, the sweep
goes on, and the next rerun retries it. A point stopped by a signal (SIGTERM / SIGINT: the run checkpoints and
raises Preempted) stops the sweep with it, no row written: the machine is going away, so starting the next point
would only be stopped again, and the rerun resumes that point from its checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import traceback
from typing import Callable

import numpy as np
from tqdm.auto import tqdm

from opd_jax.experiments.files import append_jsonl, read_jsonl, write_json
from opd_jax.experiments.run_identity import code_version, run_id
from opd_jax.errors import InputError
from opd_jax.train.preemption import Preempted

BASELINE = "baseline"


def set_field(config, dotted: str, value) -> None:
  """config.a.b = value, with the config's own unknown-field and type errors (named)."""
  node = config
  *parents, leaf = dotted.split(".")
  for part in parents:
    node = node[part]
  if leaf not in node:
    raise InputError(f"sweep override {dotted!r}: the config has no field {leaf!r}")
  if isinstance(value, list):
    value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
  node[leaf] = value


def points_of(sweep) -> list[dict]:
  """[{"name": ..., dotted field: value, ...}] from the config's (name, overrides) tuples."""
  return [{"name": name, **dict(overrides)} for name, overrides in sweep.points]


def check_sweep(sweep) -> None:
  missing = [field for field in ("name", "pairs", "points") if field not in sweep]
  if missing:
    raise InputError(f"--config is not a sweep config (it has no field {missing[0]!r}); give one of "
                     "configs/sweeps/*.py, e.g. --config=configs/sweeps/noise.py, whose pairs name the run configs")
  names = [p["name"] for p in points_of(sweep)]
  if len(set(names)) != len(names):
    raise InputError(f"sweep {sweep.name!r}: point names must be unique, got {names}")
  if BASELINE not in names:
    raise InputError(f"sweep {sweep.name!r}: needs a point named {BASELINE!r} (no mismatch knobs) to measure "
                     "quality deltas against")


def _summarize(workdir: str) -> dict:
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  train_rows = [r for r in rows if "loss" in r]
  eval_rows = [r for r in rows if "eval/accuracy" in r]
  mismatch_keys = sorted({k for r in train_rows for k in r if k.startswith(("mismatch", "rollout/"))})
  mean = lambda k: float(np.mean([r[k] for r in train_rows if isinstance(r.get(k), float)]))
  summary = {k: mean(k) for k in mismatch_keys}
  importance = {k: mean(k) for k in ("opd/is_weight", "opd/is_ess") if any(k in r for r in train_rows)}
  # a cross-tokenizer teacher (opd_jax/crosstok): alignment means, and its held-out KL (a span estimate)
  cross = {k: mean(k) for k in sorted({k for r in train_rows for k in r if k.startswith("cross_tokenizer/")})}
  if "eval/span_reverse_kl" in eval_rows[-1]:
    cross.update(initial_span_reverse_kl=eval_rows[0].get("eval/span_reverse_kl"),
                 final_span_reverse_kl=eval_rows[-1]["eval/span_reverse_kl"])
  return {"mismatch": summary, **({"importance": importance} if importance else {}),
          **({"cross_tokenizer": cross} if cross else {}),
          "initial_accuracy": eval_rows[0]["eval/accuracy"],
          "final_accuracy": eval_rows[-1]["eval/accuracy"],
          "best_accuracy": max(r["eval/accuracy"] for r in eval_rows),
          "initial_reverse_kl": eval_rows[0].get("eval/reverse_kl"),
          "final_reverse_kl": eval_rows[-1].get("eval/reverse_kl"),
          **({"initial_teacher_forced_kl": eval_rows[0]["eval/teacher_forced_kl"],
              "final_teacher_forced_kl": eval_rows[-1]["eval/teacher_forced_kl"]}
             if "eval/teacher_forced_kl" in eval_rows[-1] else {}),
          "skipped_steps": float(sum(r.get("skipped", 0.0) for r in train_rows)),
          # objective.min_ess: share of updates skipped for a low importance ESS (logged rows are window means)
          **({"low_ess_skip_fraction": mean("skipped_low_ess")} if any("skipped_low_ess" in r for r in train_rows)
             else {})}


def run_sweep(sweep, out: str, load_pair_config: Callable, train_fn: Callable, log=print) -> list[dict]:
  """Runs every (pair, point) not yet "ok" in out/results.jsonl; returns all rows."""
  check_sweep(sweep)
  _check_overrides(sweep, load_pair_config)  # a typo is one error before anything is written, not N failed points
  os.makedirs(out, exist_ok=True)
  results_path = os.path.join(out, "results.jsonl")
  write_json(os.path.join(out, "sweep.json"), sweep.to_dict())
  done = {(r["pair"], r["point"]) for r in read_jsonl(results_path) if r.get("status") == "ok"}
  todo = [(pair, point) for pair in sweep.pairs for point in points_of(sweep) if (pair, point["name"]) not in done]
  log(f"sweep {sweep.name}: {len(done)} points done, {len(todo)} to run -> {results_path}")
  # Baselines first, so deltas can be filled in as points finish.
  todo.sort(key=lambda item: item[1]["name"] != BASELINE)
  for pair, point in tqdm(todo, desc=f"sweep {sweep.name}", unit="run"):
    workdir = os.path.join(out, "runs", pair, point["name"])
    start = time.time()
    row = {"sweep": sweep.name, "pair": pair, "point": point["name"],
           "overrides": {k: v for k, v in point.items() if k != "name"}}
    try:
      config = load_pair_config(pair)
      for key, value in {**dict(sweep.base_overrides), **row["overrides"]}.items():
        set_field(config, key, value)
      config.train.progress_bar = False
      config.train.resume = True  # a crashed point resumes from its last checkpoint on rerun
      row["rollout"] = {k: (list(map(list, v)) if k == "weight_rules" else v) for k, v in dict(config.rollout).items()}
      row["mode"] = config.train.mode
      # The horizon and the optimizer a budget is for (a budget calibrated at 150 steps is not one for 75).
      row.update(steps=config.train.steps, learning_rate=config.optimizer.learning_rate, seed=config.seed)
      row["objective"] = config.objective.name if "objective" in config else None
      row["code_version"] = code_version()
      row["run_id"] = run_id(json.loads(config.to_json()), config.seed, row["code_version"])
      _discard_if_config_changed(workdir, config)
      train_fn(config, workdir)
      row.update(_summarize(workdir), status="ok")
    except Preempted:
      raise  # the sweep stops with its point (module docstring)
    except Exception as e:  # recorded, not raised: one bad point must not stop the sweep
      row.update(status="failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=5))
      log(f"  {pair}/{point['name']} failed: {row['error']}")
    row["wall_seconds"] = time.time() - start
    append_jsonl(results_path, row)
  return fill_deltas(read_jsonl(results_path))


def _check_overrides(sweep, load_pair_config: Callable) -> None:
  """Every point's overrides name fields of every pair's config, and its objective is a known one."""
  from opd_jax.objectives import ObjectiveConfig
  for pair in sweep.pairs:
    for point in points_of(sweep):
      config = load_pair_config(pair)
      try:
        for key, value in {**dict(sweep.get("base_overrides", ())), **point}.items():
          if key != "name":
            set_field(config, key, value)
        if "objective" in config:
          ObjectiveConfig(**dict(config.objective))
      except (InputError, KeyError, TypeError) as e:
        raise InputError(f"sweep {sweep.name!r}, point {point['name']!r} on {pair}: {e}; fix the sweep config or its "
                         "arguments") from None


def _discard_if_config_changed(workdir: str, config) -> None:
  """A point's old run dir is resumed only if it ran the same config; otherwise it is removed."""
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    return
  with open(path) as f:
    old = json.load(f)
  if old != json.loads(config.to_json()):
    shutil.rmtree(workdir)


def check_one_objective(rows: list[dict]) -> None:
  """Budgets and quality-vs-mismatch plots compare runs of one objective; rows that predate the `objective`
  field are not checked."""
  objectives = sorted({r["objective"] for r in rows if r.get("objective")})
  if len(objectives) > 1:
    raise InputError(f"the sweep results mix objectives {objectives}: how much mismatch a run tolerates depends "
                     "on its objective; pass one objective's results at a time")


def fill_deltas(rows: list[dict]) -> list[dict]:
  """Latest row per (pair, point), with quality deltas vs the pair's baseline (accuracy points, 0..1)."""
  latest = {}
  for row in rows:
    latest[(row["pair"], row["point"])] = row
  rows = list(latest.values())
  baselines = {r["pair"]: r for r in rows if r["point"] == BASELINE and r["status"] == "ok"}
  for row in rows:
    base = baselines.get(row["pair"])
    if row["status"] == "ok" and base is not None:
      row["delta_final_accuracy"] = row["final_accuracy"] - base["final_accuracy"]
      row["delta_best_accuracy"] = row["best_accuracy"] - base["best_accuracy"]
      if row.get("final_reverse_kl") is not None and base.get("final_reverse_kl") is not None:
        row["delta_final_reverse_kl"] = row["final_reverse_kl"] - base["final_reverse_kl"]
  return rows
