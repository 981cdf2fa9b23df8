"""Tables of the cross-tokenizer comparison (configs/sweeps/cross_tokenizer.py on pairx): each objective's final
held-out accuracy and span KL per seed, and their seed means with 95% t-intervals (t with n - 1 degrees of
freedom, valid at two or three seeds; a min-max of three seeds would not be a 95% interval). And the real
cross-family pair's runs of the marginal form (configs/gemma3_to_smollm2.py, results/gemma3/*/metrics.jsonl)."""

from __future__ import annotations

import glob
import os

from opd_jax.experiments.files import read_jsonl
from study.tables.markdown import md_table, mean_cell

SOURCES: dict[str, str] = {}
PER_SPAN = "cross_tokenizer/student_tokens_per_span"
TITLE = "cross-tokenizer objectives (pairx, 700 steps)"
# The objective each point of configs/sweeps/cross_tokenizer.py trains, in the table's words.
OBJECTIVES = {"baseline": "reverse_kl: next-character marginals at span starts", "span_pg": "reverse_kl_pg: span form",
              "uld": "uld: the ULD baseline",
              "chain": 'reverse_kl, chain split (`marginal_span="chain"`): marginals plus the rest given the character'}


def _mean(values: list[float]) -> str:
  return mean_cell(values, collapse=False)


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


GEMMA_TITLE = "cross-family pair: the marginal form at corrected boundaries (Gemma 3 -> SmolLM2, seed 0)"
# results/gemma3/<run>/metrics.jsonl, in the table's words
GEMMA_RUNS = {"corrected_marginal_run_seed0": 'first-character marginals only (`marginal_span="first"`)',
              "chain_run_seed0": 'the chain split (`marginal_span="chain"`, the pair\'s default)'}


def gemma_table(runs: dict[str, list[dict]]) -> str:
  """Per run: held-out span KL per scored token and accuracy at the first and last evaluation, greedy answer length
  at the last, and training plus evaluation seconds (time/train_s and every eval/seconds; not start-up)."""
  body = []
  for name, rows in runs.items():
    evals = [r for r in rows if "eval/accuracy" in r]
    first, last = evals[0], evals[-1]
    minutes = (last["time/train_s"] + sum(r["eval/seconds"] for r in evals)) / 60
    body.append([GEMMA_RUNS[name], f"{first['eval/span_reverse_kl']:.2f} -> {last['eval/span_reverse_kl']:.2f}",
                 f"{first['eval/accuracy']:.2f} -> {last['eval/accuracy']:.2f}", f"{last['eval/response_tokens']:.1f}",
                 f"{last['step']}", f"{minutes:.0f}"])
  return md_table(["run (`reverse_kl`, corrected boundaries)", "held-out span KL per scored token, first -> last",
                   "held-out accuracy", "greedy tokens, last", "steps", "minutes (train + eval)"], body)


def tables(results_dir: str) -> dict[str, str]:
  out = {}
  files = sorted(glob.glob(os.path.join(results_dir, "cross_tokenizer", "xtok_seed*.jsonl")))
  if files:
    SOURCES[TITLE] = "results/cross_tokenizer/xtok_seed*.jsonl"
    out[TITLE] = comparison_table([r for f in files for r in read_jsonl(f, "cross-tokenizer sweep file")])
  runs = {name: os.path.join(results_dir, "gemma3", name, "metrics.jsonl") for name in GEMMA_RUNS}
  if all(os.path.exists(path) for path in runs.values()):
    SOURCES[GEMMA_TITLE] = "results/gemma3/{" + ",".join(GEMMA_RUNS) + "}/metrics.jsonl"
    out[GEMMA_TITLE] = gemma_table({name: read_jsonl(path, "metrics file") for name, path in runs.items()})
  return out
