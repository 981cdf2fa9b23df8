"""OPD against the GRPO baseline, and sync against async rollouts, rendered from shipped runs:

  grpo_main/metrics.jsonl       launch/train.py --config=configs/pair1.py --config.objective.name=grpo
                                --config.objective.group_size=8 --config.optimizer.learning_rate=1e-4 (700 steps),
                                next to pair1_main/metrics.jsonl, the main OPD run
  grpo.jsonl                    launch/sweep.py --config=configs/sweeps/grpo.py: GRPO under mismatch, next to the
                                OPD runs of the same pair, knobs and length (sources.jsonl, staleness_pair1.jsonl,
                                quantization_pair1.jsonl)
  fp8_500/metrics.jsonl         launch/train.py --config=configs/pair1.py --config.rollout.weights=fp8
                                --config.rollout.kv_cache=fp8 --config.rollout.staleness_steps=2
                                --config.train.steps=500
  sync_async/<mode>/metrics.jsonl
                                launch/train.py --config=configs/pair1.py --config.train.steps=200
                                [--config.train.mode=async --config.train.max_staleness=2]
"""

from __future__ import annotations

import os

import numpy as np

from opd_jax.experiments.files import read_jsonl, read_results
from opd_jax.experiments.sweep import fill_deltas
from opd_jax.screening.k3_conversion import point_key
from study.tables.markdown import md_table
from study.tables.real_pair import _pct

SOURCES = {"OPD vs GRPO (pair1, 700 steps)": "results/pair1_main/, results/grpo_main/",
           "GRPO under mismatch (pair1, 150 steps)":
               "results/grpo.jsonl, results/sources.jsonl, results/staleness_pair1.jsonl, "
               "results/quantization_pair1.jsonl",
           "sync vs async rollouts (pair1, 200 steps)": "results/sync_async/",
           "fp8 weights + fp8 KV + 2 stale versions (pair1, 500 steps)": "results/fp8_500/"}
OPD_SIDE = ("sources.jsonl", "staleness_pair1.jsonl", "quantization_pair1.jsonl")


def _evals(rows: list[dict]) -> list[dict]:
  return [r for r in rows if "eval/accuracy" in r]


def _accuracy_cell(evals: list[dict]) -> str:
  """Greedy held-out accuracy start -> end, sampled at the end in parentheses."""
  return (f"{_pct(evals[0]['eval/accuracy'])} -> **{_pct(evals[-1]['eval/accuracy'])}** "
          f"({_pct(evals[-1]['eval/accuracy_sampled'])})")


def _train_seconds(rows: list[dict]) -> float | None:
  return next((r["time/train_s"] for r in reversed(rows) if "time/train_s" in r), None)


def opd_vs_grpo_table(runs: dict[str, list[dict]], at_step: int = 100) -> str:
  """Per objective (name -> metrics rows): greedy held-out accuracy start -> end (sampled at the end), at
  `at_step`, the reverse KL to the teacher start -> end, and the training wall time."""
  body = []
  for name, rows in runs.items():
    evals = _evals(rows)
    middle = next((r for r in evals if r["step"] == at_step), None)
    seconds = _train_seconds(rows)
    body.append([name, _accuracy_cell(evals), "n/a" if middle is None else _pct(middle["eval/accuracy"]),
                 f"{evals[0]['eval/reverse_kl']:.3f} -> {evals[-1]['eval/reverse_kl']:.3f}",
                 "n/a" if seconds is None else f"{seconds:.0f} s"])
  return md_table(["objective", "held-out acc, greedy (sampled)", f"step {at_step}", "reverse KL to teacher",
              "training time"], body)


def grpo_mismatch_table(grpo: list[dict], opd: list[dict]) -> str:
  """Every GRPO point next to the OPD run of the same knobs (matched on the point's overrides; "n/a" where OPD
  has none, e.g. a GRPO-only correction; a sweep's shared settings, GRPO's objective among them, are not in its
  overrides): final held-out accuracy and run-mean k3, and GRPO's mean training reward."""
  by_knobs = {point_key(r): r for r in opd if r.get("status") == "ok"}
  body = []
  for r in grpo:
    if r.get("status") != "ok":
      body.append([r["point"], "", "failed"])
      continue
    twin = by_knobs.get(point_key(r))
    opd_cell = "n/a" if twin is None else f"{_pct(twin['final_accuracy'])} ({twin['mismatch']['mismatch/k3']:.2g})"
    reward = r["mismatch"].get("rollout/reward", float("nan"))
    body.append([r["point"], opd_cell,
                 f"{_pct(r['final_accuracy'])} ({r['mismatch']['mismatch/k3']:.2g}, {reward:.3f})"])
  return md_table(["point", "OPD acc (k3)", "GRPO acc (k3, mean training reward)"], body)


def sync_async_table(runs: dict[str, list[dict]]) -> str:
  """Per mode: median s/step and rollout tokens/s, mean policy lag, final held-out accuracy."""
  body = []
  for mode, rows in runs.items():
    train = [r for r in rows if "perf/step_s" in r]
    body.append([mode, f"{np.median([r['perf/step_s'] for r in train]):.3f}",
                 f"{np.median([r['perf/tokens_per_s'] for r in train]):.0f}",
                 f"{np.mean([r['rollout/version_lag'] for r in train]):.2f}", _pct(_evals(rows)[-1]["eval/accuracy"])])
  return md_table(["mode", "s/step (median)", "rollout tokens/s (median)", "mean policy lag",
                  "held-out acc at the end"],
             body)


def knobs_run_table(rows: list[dict]) -> str:
  """One run under mismatch knobs: held-out accuracy start -> end, run-mean k3, the run-mean k1 split into
  precision (the sampler's knobs against the same-version learner) and staleness (that version against the
  current learner), the training time and the median s/step."""
  train = [r for r in rows if "mismatch/k3" in r]
  mean = lambda key: float(np.mean([r[key] for r in train if key in r]))
  seconds = _train_seconds(rows)
  return md_table(["held-out acc, greedy (sampled)", "run-mean k3", "k1 precision", "k1 staleness", "training time",
              "s/step (median)"],
             [[_accuracy_cell(_evals(rows)), f"{mean('mismatch/k3'):.3g}",
               f"{mean('mismatch_split/precision_k1'):.2g}", f"{mean('mismatch_split/staleness_k1'):.2g}",
               f"{seconds:.0f} s", f"{np.median([r['perf/step_s'] for r in train]):.3f}"]])


def tables(results_dir: str) -> dict[str, str]:
  out = {}
  opd_main, grpo_main = (os.path.join(results_dir, d, "metrics.jsonl") for d in ("pair1_main", "grpo_main"))
  if os.path.exists(opd_main) and os.path.exists(grpo_main):
    out["OPD vs GRPO (pair1, 700 steps)"] = opd_vs_grpo_table(
        {"OPD, exact reverse KL, lr 1e-3": read_jsonl(opd_main), "GRPO, lr 1e-4": read_jsonl(grpo_main)})
  path = os.path.join(results_dir, "grpo.jsonl")
  if os.path.exists(path):
    opd = [r for name in OPD_SIDE if os.path.exists(os.path.join(results_dir, name))
           for r in fill_deltas(read_results(os.path.join(results_dir, name))) if r["pair"] == "pair1"]
    out["GRPO under mismatch (pair1, 150 steps)"] = grpo_mismatch_table(fill_deltas(read_results(path)), opd)
  path = os.path.join(results_dir, "fp8_500", "metrics.jsonl")
  if os.path.exists(path):
    out["fp8 weights + fp8 KV + 2 stale versions (pair1, 500 steps)"] = knobs_run_table(read_jsonl(path))
  modes = {mode: os.path.join(results_dir, "sync_async", mode, "metrics.jsonl") for mode in ("sync", "async")}
  if all(os.path.exists(p) for p in modes.values()):
    out["sync vs async rollouts (pair1, 200 steps)"] = sync_async_table({m: read_jsonl(p) for m, p in modes.items()})
  return out
