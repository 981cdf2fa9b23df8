"""The tables for the real pair (SmolLM2-135M-Instruct -> its pruned copy), rendered from the shipped
files under results/smollm2/ (how each is made is in docs/real_pair.md):

  run/metrics.jsonl, run/samples.jsonl   the main command's run (launch/train.py --config=configs/smollm2.py)
  depth/L<N>.jsonl                       step-0 evaluations of students pruned to N layers (train.steps=0)
  depth/L<N>_prune.json                  the pruning record of that student (prune.json of its directory)
  prune.json                             layer-selection schedules side by side (launch/bench/prune.py)
  admission.json, admission_pair1.json   admit.py --candidates --json rows, real pair and pair1
  sensitivity_<precision>.json           launch/sensitivity.py on the real pair (recipe_<precision>.json: its recipe)
  recipes.jsonl                          configs/sweeps/smollm2.py (recipes trained on the real pair)
"""

from __future__ import annotations

import math
import os
import re

from opd_jax.experiments.files import read_json, read_jsonl, read_results
from opd_jax.experiments.sweep import fill_deltas
from study.tables.markdown import md_table


def _f(x, digits: int = 3) -> str:
  return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _pct(x) -> str:
  return "n/a" if x is None else f"{100 * x:.1f}%"


def _evals(rows: list[dict]) -> list[dict]:
  return [r for r in rows if "eval/reverse_kl" in r]


def distillation_table(rows: list[dict]) -> str:
  """Teacher / pruned student (step 0) / distilled student (last evaluation) of one run's metrics.jsonl."""
  evals = _evals(rows)
  first, last = evals[0], evals[-1]
  body = [
      ["held-out reverse KL to the teacher (student's samples)", "(0)", _f(first["eval/reverse_kl"]),
       _f(last["eval/reverse_kl"])],
      ["teacher-forced KL(teacher ‖ student) (teacher's greedy responses)", "(0)",
       _f(first["eval/teacher_forced_kl"]), _f(last["eval/teacher_forced_kl"])],
      ["capitals accuracy (greedy)", _pct(first.get("eval/teacher_accuracy")), _pct(first.get("eval/accuracy")),
       _pct(last.get("eval/accuracy"))],
      ["mean greedy response tokens", _f(first.get("eval/teacher_response_tokens"), 1),
       _f(first["eval/response_tokens"], 1), _f(last["eval/response_tokens"], 1)],
  ]
  if "eval/at_cap" in first:  # logged since the stopping fix
    body += [["greedy responses at the token cap", _pct(first.get("eval/teacher_at_cap")), _pct(first["eval/at_cap"]),
              _pct(last["eval/at_cap"])],
             ["greedy responses repeating an 8-token run", _pct(first.get("eval/teacher_repetition")),
              _pct(first["eval/repetition"]), _pct(last["eval/repetition"])]]
  return md_table(["held-out metric", "teacher", f"pruned (step {first['step']})", f"distilled (step {last['step']})"],
             body)


def samples_table(samples: list[dict], count: int = 3, graded: bool = False) -> str:
  """The first `count` open (ungraded; graded=True: graded) prompts: the teacher's, the pruned and the distilled
  student's responses."""
  steps = sorted({s["step"] for s in samples if s["model"] == "student"})
  by = lambda model, step: {s["prompt"]: s["response"] for s in samples if s["model"] == model and s["step"] == step}
  teacher, before, after = by("teacher", steps[0]), by("student", steps[0]), by("student", steps[-1])
  prompts = [s["prompt"] for s in samples if s["model"] == "teacher" and ("answer" in s) == graded][:count]
  clean = lambda text: " ".join(text.replace("|", "\\|").split()) or "*(empty: EOS first)*"
  body = [[clean(p), clean(teacher[p]), clean(before[p]), clean(after[p])] for p in prompts]
  return md_table(["prompt", "teacher", f"pruned (step {steps[0]})", f"distilled (step {steps[-1]})"], body)


def depth_table(folder: str) -> str:
  """One row per student depth: its step-0 evaluation, and its pruning's KL to the full model where shipped."""
  body = []
  files = sorted((int(re.match(r"L(\d+)\.jsonl$", f).group(1)), f) for f in os.listdir(folder)
                 if re.match(r"L\d+\.jsonl$", f))
  for layers, name in files:
    row = _evals(read_jsonl(os.path.join(folder, name)))[0]
    prune_path = os.path.join(folder, f"L{layers}_prune.json")
    prune = read_json(prune_path, "pruning record") if os.path.exists(prune_path) else None
    body.append([str(layers), _f(prune["kl_to_source"]) if prune else "-", _f(row["eval/reverse_kl"]),
                 _f(row["eval/teacher_forced_kl"]), _pct(row.get("eval/accuracy")), _f(row["eval/response_tokens"], 1)])
  return md_table(["layers kept (of 30)", "pruning KL (calibration prompts)", "held-out reverse KL",
                  "teacher-forced KL",
              "capitals accuracy", "greedy response tokens"], body)


def prune_table(prune: dict) -> str:
  body = [[str(r["drops_per_round"]), _f(r["kl_calibration"]), _f(r["kl_check"]), str(r["subsets_scored"]),
           ", ".join(str(d["layer"]) for d in r["dropped"])] for r in prune["rows"]]
  return md_table(["layers dropped per round", "KL to the full model (calibration)", "KL (check prompts)",
              "subsets scored (cost)", "dropped, in order"], body)


def admission_table(real: dict, pair1: dict | None, budget_file: dict) -> str:
  """Measured k3 per candidate on the real pair next to pair1's, judged as launch/admit.py judges it today
  (admission.admit_value with the shipped budget file: the measurement divided by the file's k3 factor, against
  the budget it picks for a pair it has none of: the pooled one), beside the verdict the run itself printed
  against the budget file of its day."""
  from opd_jax.screening import admission
  embedded = {r["candidate"]: r["measured"] for r in (pair1 or {}).get("rows", [])}
  body = []
  for r in sorted(real["rows"], key=lambda r: r["measured"]):
    other = embedded.get(r["candidate"])
    today = admission.admit_value(r["measured"], budget_file, "smollm2")
    body.append([r["candidate"], f"{r['measured']:.3g}", "n/a" if other is None else f"{other:.3g}",
                 "n/a" if not other else f"{r['measured'] / other:.0f}x", f"{today['compared']:.3g}",
                 "ADMIT" if today["admit"] else "REJECT", f"{today['compared'] / today['budget']:.2f}x",
                 ("ADMIT" if r["admit"] else "REJECT") + f" ({r['budget']:.3f})"])
  return md_table(["candidate", "k3 real pair", "k3 pair1", "real / pair1", "compared k3 (÷ factor)",
              "verdict (shipped budget)", "vs shipped budget", "verdict at the run (its budget)"], body)


def sensitivity_table(scans: dict[str, dict], top: int = 5) -> str:
  """Per precision: the whole-model k3, the most sensitive layers, layer 0's rank, and the module types."""
  body = []
  for precision, scan in scans.items():
    layers = [g for g in scan["groups"] if g["kind"] == "layer"]
    modules = [g for g in scan["groups"] if g["kind"] == "module"]
    rank0 = next(i for i, g in enumerate(layers, 1) if g["name"] == "layer 0")
    body.append([precision, f"{scan['whole_model']['k3']:.3g}",
                 ", ".join(f"{g['name'].split()[1]} ({g['k3']:.2g})" for g in layers[:top]),
                 f"{rank0} of {len(layers)}", ", ".join(f"{g['name']} ({g['k3']:.2g})" for g in modules[:3])])
  return md_table(["weights", "whole-model k3", "most sensitive layers (k3)", "layer 0's rank",
              "most sensitive module types (k3)"], body)


def recipes_table(rows: list[dict]) -> str:
  body = []
  for r in fill_deltas(rows):
    if r.get("status") != "ok":
      body.append([r["point"], "failed", "", "", "", ""])
      continue
    k3 = r["mismatch"].get("mismatch/k3")
    delta_kl, delta_acc = r.get("delta_final_reverse_kl"), r.get("delta_final_accuracy")
    body.append([r["point"], f"{k3:.3g}", _f(r["final_reverse_kl"]),
                 "n/a" if delta_kl is None else f"{delta_kl:+.3f}", _pct(r["final_accuracy"]),
                 "n/a" if delta_acc is None else f"{100 * delta_acc:+.1f}"])
  return md_table(["recipe", "run k3", "final reverse KL", "vs baseline", "capitals accuracy", "vs baseline (points)"],
             body)


def tables(results_dir: str) -> dict[str, str]:
  """Title -> markdown table for every real-pair file present under results_dir/smollm2."""
  root = os.path.join(results_dir, "smollm2")
  if not os.path.isdir(root):
    return {}
  out = {}
  run = os.path.join(root, "run")
  if os.path.exists(os.path.join(run, "metrics.jsonl")):
    out["smollm2 distillation"] = distillation_table(read_jsonl(os.path.join(run, "metrics.jsonl")))
    samples = read_jsonl(os.path.join(run, "samples.jsonl"))
    out["smollm2 samples"] = samples_table(samples)
    if any(s["model"] == "teacher" and "answer" in s for s in samples):
      out["smollm2 capitals samples"] = samples_table(samples, count=4, graded=True)
  if os.path.isdir(os.path.join(root, "depth")):
    out["smollm2 depth"] = depth_table(os.path.join(root, "depth"))
  if os.path.exists(os.path.join(root, "prune.json")):
    out["smollm2 pruning schedules"] = prune_table(read_json(os.path.join(root, "prune.json"), "prune file"))
  if os.path.exists(os.path.join(root, "admission.json")):
    pair1 = os.path.join(root, "admission_pair1.json")
    out["smollm2 admission"] = admission_table(read_json(os.path.join(root, "admission.json"), "admission file"),
                                               read_json(pair1, "admission file") if os.path.exists(pair1) else None,
                                               read_json(os.path.join(results_dir, "budget.json"), "budget file"))
  scans = {}
  for name in sorted(os.listdir(root)):
    if name.startswith("sensitivity_") and name.endswith(".json"):
      scan = read_json(os.path.join(root, name), "sensitivity file")
      scans[scan["precision"]] = scan
  if scans:
    out["smollm2 sensitivity"] = sensitivity_table(scans)
  if os.path.exists(os.path.join(root, "recipes.jsonl")):
    out["smollm2 recipes"] = recipes_table(read_results(os.path.join(root, "recipes.jsonl")))
  return out
