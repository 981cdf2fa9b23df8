"""Tables of the cross-tokenizer comparison (configs/sweeps/cross_tokenizer.py on pairx): each objective's final
held-out accuracy and span KL per seed, and their seed means with 95% t-intervals (t with n - 1 degrees of
freedom, valid at two or three seeds; a min-max of three seeds would not be a 95% interval)."""

from __future__ import annotations

import glob
import os

from opd_jax.experiments.files import read_jsonl
from study.tables.markdown import md_table

SOURCES: dict[str, str] = {}
PER_SPAN = "cross_tokenizer/student_tokens_per_span"
TITLE = "cross-tokenizer objectives (pairx, 700 steps)"
# The objective each point of configs/sweeps/cross_tokenizer.py trains, in the table's words.
OBJECTIVES = {"baseline": "reverse_kl: next-character marginals at span starts", "span_pg": "reverse_kl_pg: span form",
              "uld": "uld: the ULD baseline"}


def _mean(values: list[float]) -> str:
  from opd_jax.experiments.intervals import t_interval
  text = f"{sum(values) / len(values):.3f}"
  if len(values) >= 2:
    lo, hi = t_interval(values)
    text += f" [{lo:.3f}, {hi:.3f}]"
  return text


def comparison_table(rows: list[dict]) -> str:
  """One line per objective: seeds, start, final accuracy per seed and its seed mean, final span KL likewise."""
  body = []
  for point in dict.fromkeys(r["point"] for r in rows):
    mine = sorted((r for r in rows if r["point"] == point and r["status"] == "ok"), key=lambda r: r["seed"])
    if not mine:
      continue
    accuracy = [r["final_accuracy"] for r in mine]
    span_kl = [r["cross_tokenizer"]["final_span_reverse_kl"] for r in mine]
    body.append([OBJECTIVES.get(point, point), ", ".join(str(r["seed"]) for r in mine),
                 f"{mine[0]['initial_accuracy']:.3f} / {mine[0]['cross_tokenizer']['initial_span_reverse_kl']:.3f}",
                 ", ".join(f"{a:.3f}" for a in accuracy), _mean(accuracy),
                 ", ".join(f"{k:.3f}" for k in span_kl), _mean(span_kl),
                 f"{sum(r['cross_tokenizer'][PER_SPAN] for r in mine) / len(mine):.2f}"])
  return md_table(["objective", "seeds", "start: accuracy / span KL", "final accuracy per seed",
                   "seed mean [95% t-interval]", "final span KL per seed", "seed mean [95% t-interval]",
                   "student tokens per span (run mean)"], body)


def tables(results_dir: str) -> dict[str, str]:
  files = sorted(glob.glob(os.path.join(results_dir, "cross_tokenizer", "xtok_seed*.jsonl")))
  if not files:
    return {}
  SOURCES[TITLE] = "results/cross_tokenizer/xtok_seed*.jsonl"
  return {TITLE: comparison_table([r for f in files for r in read_jsonl(f, "cross-tokenizer sweep file")])}
