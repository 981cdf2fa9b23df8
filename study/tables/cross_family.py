"""Tables of the real cross-family pair's runs (configs/smollm2_to_gemma3.py: SmolLM2-135M-Instruct teaching Gemma 3
270M base), one folder per seed, results/gemma3/s2g_run/seed<S>/:

  metrics.jsonl   the run's held-out evaluations (step 0 = the base model, the last = the distilled student)
  keeps.json      python -m study.cross_family_probe --gemma=<run>/export: what the student keeps of its own
                  few-shot abilities (capitals, French words, additions; before: results/gemma3/probe.json)
  behaviour.json  python -m study.base_student_probe --gemma=<run>/export: the trained behaviour on every graded
                  capitals question, zero-shot (before: results/gemma3/base_student_probe.json)
  time.json       the run's wall time

Each distilled cell is the seed mean with its 95% t-interval (t with n - 1 degrees of freedom; one value where
every seed gives the same)."""

from __future__ import annotations

import os

from opd_jax.experiments.files import read_json, read_jsonl
from opd_jax.experiments.intervals import T_INTERVAL, t_interval
from study.tables.markdown import md_table
from study.tables.real_pair import seed_folders

RUN = os.path.join("gemma3", "s2g_run")
TITLE = "cross-family pair: SmolLM2-135M-Instruct teaches Gemma 3 270M (base)"
SOURCES = {TITLE: "results/gemma3/s2g_run/seed*/, results/gemma3/probe.json, results/gemma3/base_student_probe.json"}
GEMMA = "gemma3-270m (base, few-shot)"  # cross_family_probe's row of the Gemma model it was given
# (label, key, digits; None = a percentage) of the run's held-out evaluation
EVAL = (("span KL per scored token (student's samples)", "eval/span_reverse_kl", 3),
        ("capitals accuracy, greedy (graded eval prompts)", "eval/accuracy", None),
        ("mean greedy response tokens", "eval/response_tokens", 1),
        ("greedy responses at the token cap", "eval/at_cap", None),
        ("greedy responses repeating an 8-token run", "eval/repetition", None))
# (label, probe file key, row, task / split): counts of right answers
PROBES = (("trained: held-out capitals, zero-shot, question line", "behaviour", "gemma3-270m zero-shot, question line",
           "heldout"),
          ("trained: training capitals, zero-shot, question line", "behaviour", "gemma3-270m zero-shot, question line",
           "train"),
          ("not trained: held-out capitals, zero-shot, Q/A frame", "behaviour", "gemma3-270m zero-shot, Q/A", "heldout"),
          ("kept: capitals, two-shot (train + held-out)", "keeps", GEMMA, "capitals"),
          ("kept: English -> French words, two-shot", "keeps", GEMMA, "french"),
          ("kept: two-digit additions, two-shot", "keeps", GEMMA, "addition"))


def _cell(values: list[float], digits) -> str:
  show = (lambda x: f"{100 * x:.1f}%") if digits is None else (lambda x: f"{x:.{digits}f}")
  if len(values) < 2 or max(values) - min(values) < 1e-9:
    return show(values[0])
  lo, hi = t_interval(values)
  return f"{show(sum(values) / len(values))} [{show(lo)}, {show(hi)}]"


def _count(result: dict) -> str:
  return f"{result['correct']} / {result['asked']}"


def run_table(runs: dict[int, dict], before: dict[str, dict]) -> str:
  """One row per measure: the base model (step 0), each seed's distilled student, their mean [t-interval].
  runs: seed -> {"metrics": rows, "keeps": probe or None, "behaviour": probe or None, "time": time or None};
  before: {"keeps": results/gemma3/probe.json, "behaviour": results/gemma3/base_student_probe.json}."""
  seeds = sorted(runs)
  body = []
  for label, key, digits in EVAL:
    firsts = [[r for r in runs[s]["metrics"] if key in r][0][key] for s in seeds]
    lasts = [[r for r in runs[s]["metrics"] if key in r][-1][key] for s in seeds]
    body.append([label, _cell(firsts, digits), ", ".join(_cell([x], digits) for x in lasts), _cell(lasts, digits)])
  for label, probe, row, part in PROBES:
    if not all(runs[s][probe] for s in seeds):
      continue
    after = [runs[s][probe]["results"][row][part] for s in seeds]
    body.append([label, _count(before[probe]["results"][row][part]), ", ".join(_count(a) for a in after),
                 _cell([a["correct"] / a["asked"] for a in after], None)])
  if all(runs[s]["time"] for s in seeds):
    minutes = [runs[s]["time"]["wall_seconds"] / 60 for s in seeds]
    body.append(["wall minutes (2 CPU cores)", "", ", ".join(f"{m:.0f}" for m in minutes), _cell(minutes, 1)])
  steps = sorted({[r for r in runs[s]["metrics"] if "eval/accuracy" in r][-1]["step"] for s in seeds})
  return md_table(["held-out measure", "Gemma base (step 0)",
                   f"distilled (step {'/'.join(map(str, steps))}), seeds {', '.join(map(str, seeds))}",
                   f"seed mean [{T_INTERVAL}]" if len(seeds) > 1 else "seed mean"], body)


def tables(results_dir: str) -> dict[str, str]:
  folders = seed_folders(os.path.join(results_dir, RUN))
  if not folders:
    return {}
  optional = lambda folder, name: (read_json(os.path.join(folder, f"{name}.json"), f"{name} file")
                                   if os.path.exists(os.path.join(folder, f"{name}.json")) else None)
  runs = {seed: {"metrics": read_jsonl(os.path.join(folder, "metrics.jsonl"), "metrics file"),
                 **{name: optional(folder, name) for name in ("keeps", "behaviour", "time")}}
          for seed, folder in folders}
  before = {"keeps": read_json(os.path.join(results_dir, "gemma3", "probe.json"), "probe file"),
            "behaviour": read_json(os.path.join(results_dir, "gemma3", "base_student_probe.json"), "probe file")}
  return {TITLE: run_table(runs, before)}
