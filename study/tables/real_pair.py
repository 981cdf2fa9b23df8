"""The tables for the real pair (SmolLM2-135M-Instruct -> its pruned copy), rendered from the shipped
files under results/smollm2/ (how each is made is in docs/real_pair.md):

  run/seed<S>/metrics.jsonl, samples.jsonl, time.json
                                         the main command's run at seeds 0, 1, 2 (launch/train.py
                                         --config=configs/smollm2.py --config.seed=S; GKD beta 0.7, learning rate
                                         2e-4)
  run_v4_beta0.5/seed<S>/                the previous main config (beta 0.5, seeds 0, 1, 2)
  run_v3_lr1e-4/seed<S>/                 the one before (beta 0.5, learning rate 1e-4, seeds 0, 1, 2)
  run_v2_150_steps/                      the one before that (150 steps, one seed)
  depth/L<N>.jsonl                       step-0 evaluations of students pruned to N layers (train.steps=0)
  depth/L<N>_prune.json                  the pruning record of that student (prune.json of its directory)
  prune.json                             layer-selection schedules side by side (launch/bench/prune.py)
  admission.json, admission_pair1.json   admit.py --candidates --json rows, real pair and pair1
  sensitivity_<precision>.json           launch/sensitivity.py on the real pair (recipe_<precision>.json: its recipe)
  recipes.jsonl                          configs/sweeps/smollm2.py (recipes trained on the real pair)
  loops/<student>.json                   study/loops.py: both models' probability of the greedy token in loops
                                         (run_v*/loops/: the same on the earlier configs' students)
  campaign/smollm2_budget_seed<S>.jsonl  configs/sweeps/smollm2_budget.py: the budget's calibration points, per seed
                                         (rendered once every point of every seed of the plan has finished)
"""

from __future__ import annotations

import math
import os
import re

from opd_jax.experiments.files import read_json, read_jsonl, read_results
from opd_jax.experiments.intervals import T_INTERVAL
from opd_jax.experiments.sweep import fill_deltas
from study.tables.markdown import md_table, mean_cell


def _f(x, digits: int = 3) -> str:
  return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _pct(x) -> str:
  return "n/a" if x is None else f"{100 * x:.1f}%"


def _evals(rows: list[dict]) -> list[dict]:
  return [r for r in rows if "eval/reverse_kl" in r]


# (label, metric key, teacher key, digits; None = a percentage) of the held-out evaluation, in table order.
METRICS = (
    ("held-out reverse KL to the teacher (student's samples)", "eval/reverse_kl", None, 3),
    ("teacher-forced KL(teacher ‖ student) (teacher's greedy responses)", "eval/teacher_forced_kl", None, 3),
    ("capitals accuracy (greedy)", "eval/accuracy", "eval/teacher_accuracy", None),
    ("mean greedy response tokens", "eval/response_tokens", "eval/teacher_response_tokens", 1),
    ("greedy responses at the token cap", "eval/at_cap", "eval/teacher_at_cap", None),
    ("greedy responses repeating an 8-token run", "eval/repetition", "eval/teacher_repetition", None),
)


def _value(x, digits) -> str:
  return _pct(x) if digits is None else _f(x, digits)


def _across(values: list[float], digits) -> str:
  """One value if the seeds agree (a greedy evaluation of the same weights), else the mean and its t-interval."""
  return mean_cell(values, lambda x: _value(x, digits))


def distillation_table(runs: list[list[dict]]) -> str:
  """Teacher / pruned student (step 0) / distilled student (last evaluation) over the seeds' metrics.jsonl rows:
  each cell the seed mean with its 95% t-interval (one value where every seed gives the same)."""
  firsts, lasts = [_evals(rows)[0] for rows in runs], [_evals(rows)[-1] for rows in runs]
  body = []
  for label, key, teacher_key, digits in METRICS:
    if key not in firsts[0]:  # at_cap / repetition: logged since the stopping fix
      continue
    teacher = "(0)" if teacher_key is None else _value(firsts[0].get(teacher_key), digits)
    body.append([label, teacher, _across([r[key] for r in firsts], digits), _across([r[key] for r in lasts], digits)])
  ratio = [last["eval/reverse_kl"] / first["eval/reverse_kl"] for first, last in zip(firsts, lasts)]
  body.append(["reverse KL, distilled / pruned (same seed)", "", "", _across(ratio, None)])
  steps = {r["step"] for r in lasts}
  head = [f"held-out metric ({len(runs)} seeds; mean [{T_INTERVAL}])" if len(runs) > 1 else "held-out metric",
          "teacher", f"pruned (step {firsts[0]['step']})", f"distilled (step {'/'.join(map(str, sorted(steps)))})"]
  return md_table(head, body)


# Issue 35's goals for the distilled student, judged on the seed mean: (label, key, teacher key, test, goal text).
GOALS = (
    ("mean greedy response tokens", "eval/response_tokens", "eval/teacher_response_tokens",
     lambda s, t: abs(s - t) <= 0.25 * t, "within 25% of the teacher's", 1),
    ("greedy responses at the token cap", "eval/at_cap", "eval/teacher_at_cap",
     lambda s, t: abs(s - t) <= 0.10, "within 10 points of the teacher's", None),
    ("greedy responses repeating an 8-token run", "eval/repetition", "eval/teacher_repetition",
     lambda s, t: abs(s - t) <= 0.10, "within 10 points of the teacher's", None),
)


def goals_table(runs: list[list[dict]], first_seeds: int = 3) -> str:
  """The real pair's goals (issue 35), each judged on the seed mean, with the interval beside it. With more than
  `first_seeds` seeds, the first ones' cells stand beside (the goals were first judged on those)."""
  def cells(runs):
    firsts, lasts = [_evals(rows)[0] for rows in runs], [_evals(rows)[-1] for rows in runs]
    out = []
    for label, key, teacher_key, met, goal, digits in GOALS:
      values, teacher = [r[key] for r in lasts], firsts[0][teacher_key]
      out.append((_across(values, digits), met(sum(values) / len(values), teacher)))
    ratio = [last["eval/reverse_kl"] / first["eval/reverse_kl"] for first, last in zip(firsts, lasts)]
    # Two decimals: a seed mean just past 40% must not read as "40.0% ... no".
    out.append((mean_cell(ratio, lambda x: f"{100 * x:.2f}%"), sum(ratio) / len(ratio) <= 0.40))
    return out

  teacher = _evals(runs[0])[0]
  labels = [(label, _value(teacher[teacher_key], digits), goal) for label, _, teacher_key, _, goal, digits in GOALS]
  labels.append(("held-out reverse KL, distilled / pruned", "", "at most 40%"))
  earlier = cells(runs[:first_seeds]) if len(runs) > first_seeds else None
  body = []
  for i, (label, (cell, met)) in enumerate(zip(labels, cells(runs))):
    body.append([*label, cell, "yes" if met else "no"])
    if earlier:
      body[-1] += [earlier[i][0], "yes" if earlier[i][1] else "no"]
  head = ["goal (seed mean)", "teacher", "goal", f"distilled ({len(runs)} seeds)", "met"]
  return md_table(head + ([f"first {first_seeds} seeds", "met"] if earlier else []), body)


def seeds_table(runs: dict[int, list[dict]], times: dict[int, dict]) -> str:
  """One row per seed: the last evaluation and the run's wall time."""
  body = []
  for seed, rows in sorted(runs.items()):
    first, last = _evals(rows)[0], _evals(rows)[-1]
    wall = times.get(seed, {}).get("wall_seconds")
    body.append([str(seed), _f(last["eval/reverse_kl"]), _pct(last["eval/reverse_kl"] / first["eval/reverse_kl"]),
                 _pct(last["eval/accuracy"]), _f(last["eval/response_tokens"], 1), _pct(last["eval/at_cap"]),
                 _pct(last["eval/repetition"]), "n/a" if wall is None else f"{wall / 60:.1f}"])
  return md_table(["seed", "reverse KL", "of the pruned", "capitals accuracy", "greedy tokens", "at the cap",
                   "repeating", "wall minutes"], body)


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


def campaign_table(per_seed: dict[int, list[dict]]) -> str:
  """Per calibration point (in plan order): the run's mean k3 (seed mean), each seed's final held-out reverse KL,
  its rise over the same seed's baseline as a fraction of the baseline's (the budget's quality,
  opd_jax.mismatch.budget.QUALITIES["reverse_kl"]), the seed mean of that rise, and each seed's capitals accuracy."""
  from opd_jax.mismatch.budget import QUALITIES
  loss = QUALITIES["reverse_kl"][1]
  seeds = sorted(per_seed)
  by_seed = {seed: {r["point"]: r for r in fill_deltas(rows)} for seed, rows in per_seed.items()}
  body = []
  for point in by_seed[seeds[0]]:
    runs = [by_seed[seed][point] for seed in seeds]
    k3 = [r["mismatch"].get("mismatch/k3") for r in runs]
    rises = [loss(r) for r in runs] if point != "baseline" else []
    body.append([point, f"{sum(k3) / len(k3):.3g}", " / ".join(_f(r["final_reverse_kl"]) for r in runs),
                 " / ".join(f"{100 * x:+.1f}%" for x in rises) or "", f"{100 * sum(rises) / len(rises):+.1f}%"
                 if rises else "", " / ".join(_pct(r["final_accuracy"]) for r in runs)])
  per = f"seed {' / '.join(map(str, seeds))}"
  return md_table(["point", "run k3 (seed mean)", f"final reverse KL ({per})", "rise vs own baseline", "seed mean",
                   f"capitals accuracy ({per})"], body)


def _campaign(root: str) -> dict[int, list[dict]] | None:
  """The campaign's rows per seed, when every point of configs/sweeps/smollm2_budget.py has finished at every seed
  of its plan; else None (partial campaigns are not rendered)."""
  from configs.sweeps import smollm2_budget as plan
  per_seed = {}
  for seed in plan.SEEDS:
    path = os.path.join(root, "campaign", f"smollm2_budget_seed{seed}.jsonl")
    rows = read_results(path) if os.path.exists(path) else []
    done = {r["point"] for r in rows if r.get("status") == "ok"}
    if not {name for name, _ in plan.CALIBRATION} <= done:
      return None
    per_seed[seed] = rows
  return per_seed


def seed_folders(run: str) -> list[tuple[int, str]]:
  """(seed, folder) of every run/seed<S>/ holding a metrics.jsonl, by seed."""
  if not os.path.isdir(run):
    return []
  found = [(int(m.group(1)), os.path.join(run, name)) for name in os.listdir(run)
           if (m := re.fullmatch(r"seed(\d+)", name)) and os.path.exists(os.path.join(run, name, "metrics.jsonl"))]
  return sorted(found)


def loops_table(reports: list[dict]) -> str:
  """Per student: how many greedy responses loop, and each model's mean (median) probability of the greedy token
  inside the loops and elsewhere in those responses."""
  cell = lambda s: f"{s['mean']:.3f} ({s['median']:.3f})"
  seed = lambda r: (m.group(1) if (m := re.search(r"seed(\d+)", r["samples"])) else "?")
  run = lambda r: (m.group(1) if (m := re.search(r"smollm2/([^/]+)/seed", r["samples"])) else "?")
  name = lambda r: ("pruned (step 0)" if r["step"] == 0 else
                    f"distilled (step {r['step']}, seed {seed(r)})" + ("" if run(r) == "run" else f", `{run(r)}`"))
  body = [[name(r), f"{r['looping']} of {r['responses']}",
           str(r["in_loop"]["student"]["tokens"]), cell(r["in_loop"]["student"]), cell(r["in_loop"]["teacher"]),
           cell(r["elsewhere"]["student"]), cell(r["elsewhere"]["teacher"])] for r in reports]
  return md_table(["student", "greedy responses that loop", "tokens in loops", "in loops: student p", "teacher p",
                   "elsewhere: student p", "teacher p"], body)


def transfer_table(transfer: dict) -> str:
  """Each held-out recipe judged twice by launch/admit.py's rule (study.analysis.transfer): with the pair's own budget
  file and factor, and with the embedded pairs' pooled file; then each side's agreement with the real runs."""
  verdict = lambda v: (f"{'ADMIT' if v['admit'] else 'REJECT'} (÷ {v['k3_factor']:.3g} = {v['compared']:.3g} vs "
                       f"{v['budget']:.3g})")
  body = [[r["point"], f"{r['measured']:.3g}", f"{100 * r['quality_loss']:+.1f}%",
           "kept" if r["real_ok"] else "lost", verdict(r["own"]), "yes" if r["own"]["agree"] else "**no**",
           verdict(r["transferred"]), "yes" if r["transferred"]["agree"] else "**no**"] for r in transfer["rows"]]
  agreement = lambda s: (f"{s['agreed']} / {s['n']} (95% Wilson {100 * s['agreement_interval'][0]:.0f}-"
                         f"{100 * s['agreement_interval'][1]:.0f}%)")
  body.append(["agreement with the real runs", "", "", "", "", agreement(transfer["own"]), "",
               agreement(transfer["transferred"])])
  return md_table(["held-out recipe", "admission k3", "reverse-KL rise (seed mean)", "real runs (tolerance 5%)",
                   "own budget: verdict (k3 ÷ factor vs budget)", "agrees", "pooled budget: verdict", "agrees"], body)


def tables(results_dir: str) -> dict[str, str]:
  """Title -> markdown table for every real-pair file present under results_dir/smollm2."""
  root = os.path.join(results_dir, "smollm2")
  if not os.path.isdir(root):
    return {}
  out = {}
  runs, times = {}, {}
  for seed, folder in seed_folders(os.path.join(root, "run")):
    runs[seed] = read_jsonl(os.path.join(folder, "metrics.jsonl"))
    if os.path.exists(os.path.join(folder, "time.json")):
      times[seed] = read_json(os.path.join(folder, "time.json"), "time file")
  if runs:
    out["smollm2 distillation"] = distillation_table(list(runs.values()))
    if len(runs) > 1:
      out["smollm2 goals"] = goals_table(list(runs.values()))
      out["smollm2 seeds"] = seeds_table(runs, times)
    samples = read_jsonl(os.path.join(seed_folders(os.path.join(root, "run"))[0][1], "samples.jsonl"))
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
  # Today's students (loops/), then the earlier configs' (run_v*/loops/, newest first; their pruned row is the same).
  earlier = sorted((os.path.join(n, "loops") for n in os.listdir(root) if n.startswith("run_v")), reverse=True)
  reports = []
  for i, loops in enumerate(f for f in ["loops"] + earlier if os.path.isdir(os.path.join(root, f))):
    names = sorted(f for f in os.listdir(os.path.join(root, loops)) if f.endswith(".json"))
    found = [read_json(os.path.join(root, loops, f), "loops file") for f in names]
    reports += sorted((r for r in found if i == 0 or r["step"] > 0), key=lambda r: (r["step"], r["samples"]))
  if reports:
    out["smollm2 loops"] = loops_table(reports)
  if os.path.exists(os.path.join(root, "recipes.jsonl")):
    out["smollm2 recipes"] = recipes_table(read_results(os.path.join(root, "recipes.jsonl")))
  campaign = _campaign(root)
  if campaign:
    out["smollm2 budget calibration"] = campaign_table(campaign)
  validation = os.path.join(root, "validation", "validation.json")
  if os.path.exists(validation):
    from study.tables.validation import validation_table
    out["smollm2 held-out validation"] = validation_table(read_json(validation, "validation file"))
  transfer = os.path.join(root, "validation", "transfer.json")
  if os.path.exists(transfer):
    out["smollm2 transfer"] = transfer_table(read_json(transfer, "transfer file"))
  return out
