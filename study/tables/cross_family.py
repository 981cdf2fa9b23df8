"""Tables of the real cross-family pair's runs (configs/smollm2_to_gemma3.py: SmolLM2-135M-Instruct teaching Gemma 3
270M base), one folder per seed, results/gemma3/s2g_run/seed<S>/ (the config's setting) and
results/gemma3/s2g_run_t1/seed<S>/ (the setting before it, rollouts at temperature 1):

  metrics.jsonl   the run's held-out evaluations (step 0 = the base model, the last = the distilled student)
  keeps.json      python -m study.cross_family_probe --gemma=<run>/export: what the student keeps of its own
                  few-shot abilities (capitals, French words, additions; before: results/gemma3/probe.json)
  behaviour.json  python -m study.base_student_probe --gemma=<run>/export: the trained behaviour on every graded
                  capitals question, zero-shot (before: results/gemma3/base_student_probe.json)
  time.json       the run's wall time
and the settings screened before them (one seed each, the same files and config.json), results/gemma3/s2g_screen/*/,
and the 10-step runs that found why a student stopped ending its answers, results/gemma3/s2g_diagnosis/*/
(metrics.jsonl, samples.jsonl, config.json; what each changed: results/gemma3/README.md).

Each distilled cell is the seed mean with its 95% t-interval (t with n - 1 degrees of freedom; one value where
every seed gives the same)."""

from __future__ import annotations

import os
from typing import NamedTuple

from opd_jax.experiments.files import read_json, read_jsonl
from opd_jax.experiments.intervals import T_INTERVAL
from study.tables.markdown import md_table, mean_cell
from study.tables.real_pair import seed_folders

RUN = os.path.join("gemma3", "s2g_run")
RUN_T1 = os.path.join("gemma3", "s2g_run_t1")
SCREEN = os.path.join("gemma3", "s2g_screen")
TITLE = "cross-family pair: SmolLM2-135M-Instruct teaches Gemma 3 270M (base)"
TITLE_T1 = "cross-family pair: the setting before, rollouts at temperature 1"
SCREEN_TITLE = "cross-family pair: the settings screened on seed 0"
_BEFORE = "results/gemma3/probe.json, results/gemma3/base_student_probe.json"
DIAGNOSIS = os.path.join("gemma3", "s2g_diagnosis")
DIAGNOSIS_TITLE = "cross-family pair: the first ten updates of seed 1"
SOURCES = {TITLE: f"results/gemma3/s2g_run/seed*/, {_BEFORE}",
           TITLE_T1: f"results/gemma3/s2g_run_t1/seed*/, {_BEFORE}",
           SCREEN_TITLE: f"results/gemma3/s2g_screen/*/, {_BEFORE}", DIAGNOSIS_TITLE: "results/gemma3/s2g_diagnosis/*/"}
# what each diagnostic run changed from the first (its config.json has the objective and temperatures; the two
# patches are described in results/gemma3/README.md)
DIAGNOSIS_SETTINGS = {"t1": "rollouts at temperature 1 (the 40-step runs' setting)",
                      "t1_rest_baseline": "the same, the rest's advantage minus its batch mean (a patch)",
                      "t1_jsd_starts": "the same, JSD (beta 0.5) at span starts instead of reverse KL (a patch)",
                      "t07_rollouts": "rollouts at temperature 0.7"}
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
          ("not trained: held-out capitals, zero-shot, Q/A frame", "behaviour", "gemma3-270m zero-shot, Q/A",
           "heldout"),
          ("kept: capitals, two-shot (train + held-out)", "keeps", GEMMA, "capitals"),
          ("kept: English -> French words, two-shot", "keeps", GEMMA, "french"),
          ("kept: two-digit additions, two-shot", "keeps", GEMMA, "addition"))


def _cell(values: list[float], digits) -> str:
  return mean_cell(values, (lambda x: f"{100 * x:.1f}%") if digits is None else (lambda x: f"{x:.{digits}f}"))


def _count(result: dict) -> str:
  return f"{result['correct']} / {result['asked']}"


class Measure(NamedTuple):
  """One measure of one run: the base model's value (None where only its cell is shown: a probe's count), the
  distilled student's, each as a table cell, and the digits of both (None: a percentage)."""
  label: str
  base: float | None
  base_cell: str
  value: float
  cell: str
  digits: int | None


def _measures(run: dict, before: dict) -> list[Measure]:
  """Each measure one run has: its first and last held-out evaluation, the probes against the base model's
  (counts, the value a share), its wall minutes."""
  rows = []
  for label, key, digits in EVAL:
    evals = [r[key] for r in run["metrics"] if key in r]
    rows.append(Measure(label, evals[0], _cell([evals[0]], digits), evals[-1], _cell([evals[-1]], digits), digits))
  for label, probe, row, part in PROBES:
    if run[probe]:
      after = run[probe]["results"][row][part]
      rows.append(Measure(label, None, _count(before[probe]["results"][row][part]),
                          after["correct"] / after["asked"], _count(after), None))
  if run["time"]:
    minutes = run["time"]["wall_seconds"] / 60
    rows.append(Measure("wall minutes (2 CPU cores)", None, "", minutes, f"{minutes:.0f}", 1))
  return rows


def _last_step(run: dict) -> int:
  return [r for r in run["metrics"] if "eval/accuracy" in r][-1]["step"]


def run_table(runs: dict[int, dict], before: dict[str, dict]) -> str:
  """One row per measure: the base model (step 0), each seed's distilled student, their mean [t-interval].
  runs: seed -> {"metrics": rows, "keeps": probe or None, "behaviour": probe or None, "time": time or None};
  before: {"keeps": results/gemma3/probe.json, "behaviour": results/gemma3/base_student_probe.json}.
  A measure some seed lacks (a probe not run) is left out, not filled with the base model's."""
  seeds = sorted(runs)
  per_seed = [{m.label: m for m in _measures(runs[s], before)} for s in seeds]
  body = []
  for label in [m.label for m in _measures(runs[seeds[0]], before)]:
    if not all(label in rows for rows in per_seed):
      continue
    rows = [rows[label] for rows in per_seed]
    digits = rows[0].digits
    base = _cell([m.base for m in rows], digits) if rows[0].base is not None else rows[0].base_cell
    body.append([label, base, ", ".join(m.cell for m in rows), _cell([m.value for m in rows], digits)])
  steps = sorted({_last_step(runs[s]) for s in seeds})
  return md_table(["held-out measure", "Gemma base (step 0)",
                   f"distilled (step {'/'.join(map(str, steps))}), seeds {', '.join(map(str, seeds))}",
                   f"seed mean [{T_INTERVAL}]" if len(seeds) > 1 else "seed mean"], body)


def screen_table(screens: dict[str, dict], before: dict[str, dict]) -> str:
  """One column per screened setting (one seed each), each cell "base model -> distilled student" (the evaluation
  rows on each run's own held-out prompts: eval_size differs between screens)."""
  names = sorted(screens)
  per_run = [{m.label: m for m in _measures(screens[n], before)} for n in names]
  labels = list(dict.fromkeys(label for rows in per_run for label in rows))  # every run's, in measure order
  head = [["setting", *[_setting(screens[n]) for n in names]],
          ["held-out prompts evaluated", *[str(screens[n]["config"]["train"]["eval_size"]) for n in names]]]
  body = [[label, *[(f"{r[label].base_cell} -> {r[label].cell}" if r[label].base_cell else r[label].cell)
                    if label in r else "" for r in per_run]] for label in labels]
  return md_table(["measure (seed 0)", *[f"`{n}/`" for n in names]], head + body)


def _setting(run: dict) -> str:
  """A screened run's learning rate, steps and (where not 1) rollout temperature, from its config.json."""
  config = run["config"]
  temperature = config.get("rollout", {}).get("temperature", 1.0)
  return (f"lr {config['optimizer']['learning_rate']:g}, {_last_step(run)} steps"
          + (f", rollouts at temperature {temperature:g}" if temperature != 1.0 else ""))


def diagnosis_table(runs: dict[str, list[dict]]) -> str:
  """One row per diagnostic run (folder -> its metrics rows): held-out greedy answers at the token cap and capitals
  accuracy at each evaluation, and the training rollouts' mean length over updates 1-5 and 6-10."""
  evals = lambda rows, key: ", ".join(f"{100 * r[key]:.0f}%" for r in rows if key in r)
  mean = lambda xs: f"{sum(xs) / len(xs):.1f}" if xs else ""
  lengths = lambda rows, lo, hi: mean([r["response_tokens"] for r in rows if "response_tokens" in r
                                       and lo <= r["step"] <= hi])
  body = [[f"`{name}/`", DIAGNOSIS_SETTINGS.get(name, ""),
           "/".join(str(r["step"]) for r in rows if "eval/at_cap" in r), evals(rows, "eval/at_cap"),
           evals(rows, "eval/accuracy"), lengths(rows, 1, 5), lengths(rows, 6, 10)] for name, rows in runs.items()]
  return md_table(["run", "change", "evaluated at step", "greedy answers at the token cap", "capitals accuracy",
                   "rollout tokens, updates 1-5", "updates 6-10"], body)


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
  for folder, title in ((RUN, TITLE), (RUN_T1, TITLE_T1)):
    folders = seed_folders(os.path.join(results_dir, folder))
    if folders:
      out[title] = run_table({seed: _run(path) for seed, path in folders}, before())
  screen = os.path.join(results_dir, SCREEN)
  names = sorted(n for n in os.listdir(screen) if os.path.exists(os.path.join(screen, n, "metrics.jsonl"))) \
      if os.path.isdir(screen) else []
  if names:
    out[SCREEN_TITLE] = screen_table({n: _run(os.path.join(screen, n)) for n in names}, before())
  diagnosis = os.path.join(results_dir, DIAGNOSIS)
  names = [n for n in DIAGNOSIS_SETTINGS if os.path.exists(os.path.join(diagnosis, n, "metrics.jsonl"))]
  if names:
    out[DIAGNOSIS_TITLE] = diagnosis_table(
        {n: read_jsonl(os.path.join(diagnosis, n, "metrics.jsonl"), "metrics file") for n in names})
  return out
