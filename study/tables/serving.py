"""The served-teacher tables, rendered from shipped files (how each is made: docs/serving.md):

  served_teacher.jsonl      launch/bench/served_teacher.py: a run in process and against a served teacher, per mode
                            (each run's metrics.jsonl in served_teacher/<name>/)
  topk_transport.jsonl      launch/bench/topk_transport.py: bytes per token and the *_topk error, per pair and K
  topk_pair1_seed<S>.jsonl  configs/sweeps/topk.py: the training outcome per K (pair1, one file per seed)
  multi_teacher/metrics.jsonl  configs/multi_teacher.py: one run, each problem scored by its routed teacher
"""

from __future__ import annotations

import glob
import os

import numpy as np

from opd_jax.experiments.files import read_jsonl, read_results
from opd_jax.experiments.sweep import fill_deltas
from study.tables.markdown import md_table


def served_table(rows: list[dict]) -> str:
  """Per mode: training time (evaluations excluded) and median s/step in process vs served, their ratios, and how
  far the served run's logged numbers are from the in-process run's."""
  by = {(r["mode"], r["teacher"]): r for r in rows}
  body = []
  for mode in dict.fromkeys(r["mode"] for r in rows):
    local, served = by.get((mode, "in_process")), by.get((mode, "served"))
    if local is None or served is None:
      continue
    body.append([mode, f"{local['train_s']:.0f} ({local['step_s']:.2f})", f"{served['train_s']:.0f} "
                 f"({served['step_s']:.2f})", f"{served['train_s'] / local['train_s']:.2f}x",
                 f"{served['step_s'] / local['step_s']:.2f}x", f"{served['max_abs_difference']:.2g} ({served['largest_at']})",
                 str(served["within_tolerance_through_step"]),
                 "yes" if served["accuracy_equal"] else "no",
                 f"{100 * local['eval/accuracy']:.1f}% / {100 * served['eval/accuracy']:.1f}%",
                 f"{served['wire_bytes_per_token']:.0f}"])
  return md_table(["mode", "in process: training s (s/step)", "served: training s (s/step)", "training time ratio",
              "s/step ratio", "largest logged difference", "every logged value within 1e-4 through step", "accuracy equal at every evaluation",
              "final accuracy (in process / served)", "wire bytes / token"], body)


def transport_table(rows: list[dict]) -> str:
  """Per pair and K: bytes per scored token on the wire, and the error of reverse_kl_topk's loss and gradient."""
  body = []
  for r in sorted(rows, key=lambda r: (r["pair"], r["k"])):
    k = "V = " + str(r["k"]) if r["k"] == r["vocab_size"] else str(r["k"])
    if "loss" in r:
      errors = [f"{r['loss_rel_error']:.2g}", f"{r['grad_rel_error']:.2g}", f"{r['grad_cosine']:.4f}"]
    else:
      errors = ["(sampled token only: reverse_kl_pg)", "", ""]
    body.append([r["pair"], k, f"{r['bytes_per_token']:,.0f}", *errors])
  return md_table(["pair", "K", "wire bytes / token", "loss rel. error", "gradient rel. error", "gradient cosine"],
                  body)


def training_table(seed_files: list[str]) -> str:
  """Per point of configs/sweeps/topk.py: final accuracy and the delta vs the same seed's exact baseline, mean over
  seeds with the min-max range."""
  per_point: dict[str, list[tuple[float, float]]] = {}
  for path in seed_files:
    for r in fill_deltas(read_results(path)):
      if r.get("status") == "ok":
        per_point.setdefault(r["point"], []).append((r["final_accuracy"], r.get("delta_final_accuracy") or 0.0))
  body = []
  for point, values in per_point.items():
    accuracy, delta = (np.asarray(v) * 100 for v in zip(*values))
    body.append([point, str(len(values)), f"{accuracy.mean():.1f}% [{accuracy.min():.1f}, {accuracy.max():.1f}]",
                 f"{delta.mean():+.1f} [{delta.min():+.1f}, {delta.max():+.1f}]"])
  return md_table(["point", "seeds", "final accuracy, mean [min, max]", "delta vs exact, points, mean [min, max]"],
                  body)


def multi_teacher_table(rows: list[dict]) -> str:
  """The routed run's evaluations, first and every fifth: accuracy, the reverse KL to the routed teachers, and the
  reverse KL per teacher on the problems routed to it."""
  evals = [r for r in rows if "eval/accuracy" in r]
  names = sorted(k.split("/")[2] for k in evals[0] if k.startswith("eval/teachers/"))
  body = [[str(r["step"]), f"{100 * r['eval/accuracy']:.1f}%", f"{r['eval/reverse_kl']:.4f}",
           *(f"{r[f'eval/teachers/{n}/reverse_kl']:.4f}" for n in names)]
          for i, r in enumerate(evals) if i % 5 == 0 or i == len(evals) - 1]
  return md_table(["step", "greedy accuracy", "reverse KL (routed)", *(f"reverse KL to {n}" for n in names)], body)


def tables(results_dir: str) -> dict[str, str]:
  out = {}
  served = os.path.join(results_dir, "served_teacher.jsonl")
  if os.path.exists(served):
    out["served teacher vs in process"] = served_table(read_jsonl(served, "served-teacher file"))
  transport = os.path.join(results_dir, "topk_transport.jsonl")
  if os.path.exists(transport):
    out["top-k transport"] = transport_table(read_jsonl(transport, "top-k transport file"))
  seeds = sorted(glob.glob(os.path.join(results_dir, "topk_pair1_seed*.jsonl")))
  if seeds:
    out["top-k transport: training outcome (pair1)"] = training_table(seeds)
  multi = os.path.join(results_dir, "multi_teacher", "metrics.jsonl")
  if os.path.exists(multi):
    out["two teachers, routed per problem"] = multi_teacher_table(read_jsonl(multi, "multi-teacher metrics"))
  return out
