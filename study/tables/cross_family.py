"""Tables of the real cross-family pair's runs (configs/smollm2_to_gemma3.py: SmolLM2-135M-Instruct teaching Gemma 3
270M base), one folder per seed, results/gemma3/s2g_run/seed<S>/:

  metrics.jsonl   the run's held-out evaluations (step 0 = the base model, the last = the distilled student)
  keeps.json      python -m study.cross_family_probe --gemma=<run>/export: what the student keeps of its own
                  few-shot abilities (capitals, French words, additions; before: results/gemma3/probe.json)
  behaviour.json  python -m study.base_student_probe --gemma=<run>/export: the trained behaviour on every graded
                  capitals question, zero-shot (before: results/gemma3/base_student_probe.json)
  time.json       the run's wall time
and the settings screened before them (one seed each, the same files and config.json), results/gemma3/s2g_screen/*/.

Each distilled cell is the seed mean with its 95% t-interval (t with n - 1 degrees of freedom; one value where
every seed gives the same)."""

from __future__ import annotations

import os

from opd_jax.experiments.files import read_json, read_jsonl
from opd_jax.experiments.intervals import T_INTERVAL, t_interval
from study.tables.markdown import md_table
from study.tables.real_pair import seed_folders

RUN = os.path.join("gemma3", "s2g_run")
SCREEN = os.path.join("gemma3", "s2g_screen")
TITLE = "cross-family pair: SmolLM2-135M-Instruct teaches Gemma 3 270M (base)"
SCREEN_TITLE = "cross-family pair: the settings screened on seed 0"
_BEFORE = "results/gemma3/probe.json, results/gemma3/base_student_probe.json"
SOURCES = {TITLE: f"results/gemma3/s2g_run/seed*/, {_BEFORE}", SCREEN_TITLE: f"results/gemma3/s2g_screen/*/, {_BEFORE}"}
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


def _measures(run: dict, before: dict) -> list[tuple]:
  """(label, base value or None, base cell, value, cell, digits) of each measure one run has: its first and last
  held-out evaluation, the probes against the base model's (counts, the value a share), its wall minutes."""
  rows = []
  for label, key, digits in EVAL:
    evals = [r[key] for r in run["metrics"] if key in r]
    rows.append((label, evals[0], _cell([evals[0]], digits), evals[-1], _cell([evals[-1]], digits), digits))
  for label, probe, row, part in PROBES:
    if run[probe]:
      after = run[probe]["results"][row][part]
      rows.append((label, None, _count(before[probe]["results"][row][part]), after["correct"] / after["asked"],
                   _count(after), None))
  if run["time"]:
    minutes = run["time"]["wall_seconds"] / 60
    rows.append(("wall minutes (2 CPU cores)", None, "", minutes, f"{minutes:.0f}", 1))
  return rows


def _last_step(run: dict) -> int:
  return [r for r in run["metrics"] if "eval/accuracy" in r][-1]["step"]


def run_table(runs: dict[int, dict], before: dict[str, dict]) -> str:
  """One row per measure: the base model (step 0), each seed's distilled student, their mean [t-interval].
  runs: seed -> {"metrics": rows, "keeps": probe or None, "behaviour": probe or None, "time": time or None};
  before: {"keeps": results/gemma3/probe.json, "behaviour": results/gemma3/base_student_probe.json}.
  A measure some seed lacks (a probe not run) is left out, not filled with the base model's."""
  seeds = sorted(runs)
  per_seed = [{row[0]: row for row in _measures(runs[s], before)} for s in seeds]
  body = []
  for label in [row[0] for row in _measures(runs[seeds[0]], before)]:
    if not all(label in rows for rows in per_seed):
      continue
    rows = [rows[label] for rows in per_seed]
    digits = rows[0][5]
    base = _cell([r[1] for r in rows], digits) if rows[0][1] is not None else rows[0][2]
    body.append([label, base, ", ".join(r[4] for r in rows), _cell([r[3] for r in rows], digits)])
  steps = sorted({_last_step(runs[s]) for s in seeds})
  return md_table(["held-out measure", "Gemma base (step 0)",
                   f"distilled (step {'/'.join(map(str, steps))}), seeds {', '.join(map(str, seeds))}",
                   f"seed mean [{T_INTERVAL}]" if len(seeds) > 1 else "seed mean"], body)


def screen_table(screens: dict[str, dict], before: dict[str, dict]) -> str:
  """One column per screened setting (one seed each), each cell "base model -> distilled student" (the evaluation
  rows on each run's own held-out prompts: eval_size differs between screens)."""
  names = sorted(screens)
  per_run = [{row[0]: row for row in _measures(screens[n], before)} for n in names]
  labels = list(dict.fromkeys(label for rows in per_run for label in rows))  # every run's, in measure order
  head = [["setting", *[f"lr {screens[n]['config']['optimizer']['learning_rate']:g}, {_last_step(screens[n])} steps"
                        for n in names]],
          ["held-out prompts evaluated", *[str(screens[n]["config"]["train"]["eval_size"]) for n in names]]]
  body = [[label, *[(f"{r[label][2]} -> {r[label][4]}" if r[label][2] else r[label][4]) if label in r else ""
                    for r in per_run]] for label in labels]
  return md_table(["measure (seed 0)", *[f"`{n}/`" for n in names]], head + body)


def _run(folder: str) -> dict:
  optional = lambda name: (read_json(os.path.join(folder, f"{name}.json"), f"{name} file")
                           if os.path.exists(os.path.join(folder, f"{name}.json")) else None)
  return {"metrics": read_jsonl(os.path.join(folder, "metrics.jsonl"), "metrics file"),
          **{name: optional(name) for name in ("keeps", "behaviour", "time", "config")}}


def tables(results_dir: str) -> dict[str, str]:
  before = lambda: {
      "keeps": read_json(os.path.join(results_dir, "gemma3", "probe.json"), "probe file"),
      "behaviour": read_json(os.path.join(results_dir, "gemma3", "base_student_probe.json"), "probe file")}
  out = {}
  folders = seed_folders(os.path.join(results_dir, RUN))
  if folders:
    out[TITLE] = run_table({seed: _run(folder) for seed, folder in folders}, before())
  screen = os.path.join(results_dir, SCREEN)
  names = sorted(n for n in os.listdir(screen) if os.path.exists(os.path.join(screen, n, "metrics.jsonl"))) \
      if os.path.isdir(screen) else []
  if names:
    out[SCREEN_TITLE] = screen_table({n: _run(os.path.join(screen, n)) for n in names}, before())
  return out
