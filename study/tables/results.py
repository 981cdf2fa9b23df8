"""The result tables, rendered from the shipped result files (results/), so the numbers in the docs are the
numbers in the files: `python -m study.results_tables --out=docs/results.md` writes the results page, and
tests/test_results.py checks that docs/results.md is what results/ generates, and that every table the README and
the other docs pages quote is one of these, verbatim.

Quality deltas are final held-out accuracy minus the same sweep's knob-free baseline (accuracy points).
"""

from __future__ import annotations

import os

from opd_jax.experiments.files import read_budget, read_json, read_jsonl, read_results
from opd_jax.experiments.sweep import fill_deltas
from study.analysis.validation import admission_vs_run_k3
from study.tables import (bench, comparison, cross_family, cross_tokenizer, pairs, real_configs, real_pair,
                          real_recipes, serving, study)
from study.tables.markdown import g3, md_table
from study.tables.validation import k3_quantities_table, validation_rules_table, validation_table

SWEEPS = ("sources", "sources_pair3_seed1", "sources_pair3_seed2", "noise_75", "staleness_lr4", "staleness_lr4_fkl",
          "corrections", "corrections_grpo")  # results/<name>.jsonl


def sweep_table(rows: list[dict]) -> str:
  """One line per finished point (rows as `fill_deltas` returns them), in the files' order."""
  body = []
  for r in rows:
    if r.get("status") != "ok":
      body.append([r["pair"], r["point"], "failed", "", "", "", "", ""])
      continue
    m = r["mismatch"]
    delta = r.get("delta_final_accuracy")
    body.append([r["pair"], r["point"], g3(m.get("mismatch/k3")), g3(m.get("mismatch/k1")), g3(m.get("mismatch/tv")),
                 f"{m.get('rollout/version_lag', 0.0):.1f}", f"{100 * r['final_accuracy']:.1f}%",
                 "n/a" if delta is None else f"{100 * delta:+.1f}"])
  return md_table(["pair", "point", "k3", "k1", "tv", "mean lag", "final acc", "delta vs baseline"], body)


def _set_by_cell(b: dict) -> tuple[str, str]:
  """(what set the budget, the k3 range around it with no calibration point) from budget.json's `set_by`."""
  s = b.get("set_by")
  if s is None:
    return "not recorded", ""
  if "between" in s:
    what = "crossing between " + " and ".join(f"{p['point'].split('/')[-1]} ({g3(p['mismatch'])})"
                                               for p in s["between"])
  elif "knee" in s:
    what = f"hinge fit (knee {g3(s['knee'])}, slope {g3(s['slope'])})"
  else:
    what = f"largest tested ({s['point']['point'].split('/')[-1]})"
  gap = s["empty_range"]
  empty = (f"{g3(gap['below']['mismatch'])}-{g3(gap['above']['mismatch'])} ({gap['ratio']:.1f}x)"
           if gap["ratio"] is not None else "n/a")
  return what, empty


def budget_table(budget: dict) -> str:
  """Every budget in a budget.json: per pair and pooled, per horizon, with what set it (set_by) and the k3 range
  around it that no calibration point measured."""
  body = []
  for key, b in budget["budgets"].items():
    lo, hi = b["interval"]
    body.append([key, str(b.get("steps", "")), g3(b["budget"]), f"[{g3(lo)}, {g3(hi)}]",
                 "yes" if b["bounded"] else "no (largest tested)", str(len(b["points"])), *_set_by_cell(b)])
  return md_table(["budget", "run length (steps)", "k3 budget", "90% interval", "bounded", "runs", "set by (k3)",
              "no calibration point in k3"], body)


def transfer_table(budget: dict) -> str:
  """matrix[A][B]: how many of pair B's runs pair A's budget judges as B's real quality says."""
  matrix = budget["transfer"].get("matrix", {})
  pairs = list(matrix)
  body = []
  for a in pairs:
    cells = []
    for b in pairs:
      c = matrix[a][b]
      wrong = [f"admits {p}" for p in c["wrongly_admitted"]] + [f"rejects {p}" for p in c["wrongly_rejected"]]
      cells.append(f"{c['agree']}/{c['n']}" + (f" ({'; '.join(wrong)})" if wrong else ""))
    body.append([f"{a} ({g3(budget['budgets'][a]['budget'])})"] + cells)
  return md_table(["budget of \\ runs of"] + pairs, body)


def k3_conversion_table(budget: dict) -> str:
  """budget.json's k3_conversion: the admission check's step-0 k3 over the run-mean k3, on the calibration points,
  per horizon, pair and pooled (what admission divides by: the pair's own factor, else the pooled one)."""
  body = [[steps, name, f"{f['factor']:.3g}", f"[{f['interval'][0]:.3g}, {f['interval'][1]:.3g}]",
           f"x/÷ {f['geo_sd']:.2f}", str(f["n"])]
          for steps, entry in budget["k3_conversion"]["by_steps"].items() for name, f in entry.items()]
  return md_table(["steps", "pair", "admission / run-mean k3", "90% interval", "per configuration", "points"], body)


def importance_table(rows: list[dict]) -> str:
  """Runs that logged their importance weights: mean weight, ESS share, and the share of updates the ESS guard
  (objective.min_ess) skipped ("-" without the guard)."""
  body = []
  for r in rows:
    if r.get("status") == "ok" and "importance" in r:
      w = r["importance"]
      skipped = r.get("low_ess_skip_fraction")
      body.append([r["pair"], r["point"], f"{100 * w['opd/is_weight']:.1f}%", f"{100 * w['opd/is_ess']:.1f}%",
                   "-" if skipped is None else f"{100 * skipped:.0f}%", f"{100 * r['initial_accuracy']:.1f}%",
                   f"{100 * r['final_accuracy']:.1f}%"])
  return md_table(["pair", "point", "mean weight", "ESS", "updates skipped", "start acc", "final acc"], body)


def corrections_table(prefix_shift: dict) -> str:
  """Per sigma and correction kind, from study/prefix_shift.py's JSON."""
  body = []
  signed = lambda x: "n/a" if x is None else f"{x:+.4f}"
  for row in prefix_shift["rows"]:
    for kind, c in row.get("corrections", {}).items():
      body.append([f"{row['sigma']:g}", kind, signed(c["k1_error"]), signed(c["shift"]), f"{100 * c['kept']:.0f}%",
                   f"{100 * c['ess']:.0f}%"])
  return md_table(["sigma", "correction", "error of the OPD estimate", "prefix shift left", "responses kept", "ESS"],
                  body)


def plans_table(plans: dict[str, dict]) -> str:
  """Per-device GiB (program total with residents) of each shipped real-scale config's plan
  (launch/plan_memory.py --config=configs/real/<name>.py --json > results/plans/<name>.json)."""
  names = sorted(plans)
  programs = list(dict.fromkeys(p for name in names for p in plans[name]["program_totals"]))
  gib = lambda x: f"{x / 2**30:.2f}"
  body = [[p] + [gib(plans[n]["program_totals"][p]) if p in plans[n]["program_totals"] else "-" for n in names]
          for p in programs]
  compile_s = lambda n: sum(d["compile_seconds"] for d in plans[n]["program_details"].values())
  verdict = lambda n: (f"{'fits' if plans[n]['fits'] else 'does not fit'} "
                       f"{plans[n]['device_memory_bytes'] / 2**30:.0f} GiB x {plans[n]['learner_devices']}, "
                       f"micro-batch {plans[n]['micro_batch_used']}")
  body.append(["compile (s, all programs)"] + [f"{compile_s(n):.0f}" for n in names])
  if all(plans[n].get("planner_peak_rss_bytes") for n in names):
    body.append(["planner peak RSS (GB, host)"] + [f"{plans[n]['planner_peak_rss_bytes'] / 1e9:.2f}" for n in names])
  body.append(["verdict"] + [verdict(n) for n in names])
  header = ["program (GiB per device)"] + [f"configs/real/{n}.py" for n in names]
  return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                   + ["| " + " | ".join(row) + " |" for row in body])


def plan_programs_table(plan: dict) -> str:
  """One plan (launch/plan_memory.py --json) program by program, GiB per device: XLA's argument / output / temp /
  alias, the program's peak, what stays resident beside it in its pool, the total and whether it fits."""
  gib = lambda x: f"{x / 2**30:.2f}"
  body = []
  for name, d in plan["program_details"].items():
    total = plan["program_totals"][name]
    body.append([name, gib(d["argument_bytes"]), gib(d["output_bytes"]), gib(d["temp_bytes"]), gib(d["alias_bytes"]),
                 gib(d["peak_bytes"]), gib(total - d["peak_bytes"]), gib(total),
                 "yes" if total <= plan["device_memory_bytes"] else "no"])
  return md_table(["program (GiB/device)", "argument", "output", "temp", "alias", "peak", "+resident", "total", "fits"],
                  body)


def plans_before_after_table(before: dict[str, dict], after: dict[str, dict]) -> str:
  """Per config and program: compile seconds and per-device GiB of the plan before stacked layer storage
  (results/plans/before_stacked_layers/, the planner of the release before it) and right after it
  (results/plans/after_stacked_layers/), with the planner's peak host RSS; both planned on one host, compilation
  cache off."""
  body = []
  for name in sorted(set(before) & set(after)):
    b, a = before[name], after[name]
    for program in a["program_details"]:
      if program not in b["program_details"]:
        continue
      bs, as_ = b["program_details"][program]["compile_seconds"], a["program_details"][program]["compile_seconds"]
      body.append([name, program, f"{bs:.1f} -> {as_:.1f}", f"{bs / as_:.1f}x",
                   f"{b['program_totals'][program] / 2**30:.2f} -> {a['program_totals'][program] / 2**30:.2f}"])
    total = lambda plan: sum(d["compile_seconds"] for d in plan["program_details"].values())
    body.append([name, "all programs", f"{total(b):.0f} -> {total(a):.0f}", f"{total(b) / total(a):.1f}x",
                 f"peak {b['peak_bytes_per_device'] / 2**30:.2f} -> {a['peak_bytes_per_device'] / 2**30:.2f}"])
    body.append([name, "planner peak RSS (GB, host)", f"{b['planner_peak_rss_bytes'] / 1e9:.2f} -> "
                 f"{a['planner_peak_rss_bytes'] / 1e9:.2f}", "", ""])
  return md_table(["config", "program", "compile s (before -> after)", "faster", "GiB per device (before -> after)"],
             body)


def host_rss_table(rows: list[dict]) -> str:
  """Predicted (launch/plan_memory.py --host_rss) vs measured peak RSS of whole runs on this CPU host
  (launch/bench/host_rss.py, launch/bench/scale.py --predict; GB = 1e9 bytes)."""
  gb = lambda x: f"{x / 1e9:.2f}"
  body = [[r["name"], f"{gb(r['predicted']['peak_bytes'])} = " + " + ".join(
      gb(r["predicted"][k]) for k in ("runtime_bytes", "compile_bytes", "device_bytes")),
           gb(r["peak_rss_bytes"]), f"{r['predicted']['peak_bytes'] / r['peak_rss_bytes']:.2f}"] for r in rows]
  return md_table(["run", "predicted GB = runtime + compile + device", "measured peak GB", "predicted / measured"],
                  body)


def all_tables(results_dir: str) -> dict[str, str]:
  """Title -> markdown table for every result file present in `results_dir` (the results page's order)."""
  tables = pairs.tables(results_dir)
  for name in SWEEPS:
    path = os.path.join(results_dir, f"{name}.jsonl")
    if os.path.exists(path):
      rows = fill_deltas(read_results(path))
      tables[f"sweep {name}"] = sweep_table(rows)
      if any("importance" in r for r in rows):
        tables[f"importance {name}"] = importance_table(rows)
  budget_path = os.path.join(results_dir, "budget.json")
  if os.path.exists(budget_path):
    budget = read_budget(budget_path)
    tables["budgets"] = budget_table(budget)
    if budget["transfer"].get("matrix"):
      tables["budget transfer"] = transfer_table(budget)
    if budget.get("k3_conversion"):
      tables["budget: admission k3 to run-mean k3"] = k3_conversion_table(budget)
  validation_path = os.path.join(results_dir, "validation.json")
  if os.path.exists(validation_path):
    validation = read_json(validation_path, "validation file")
    tables["validation"] = validation_table(validation)
    tables["validation against simple rules"] = validation_rules_table(validation)
    if admission_vs_run_k3(validation)["n"]:
      tables["validation: admission k3 vs run-mean k3"] = k3_quantities_table(validation)
  prefix_path = os.path.join(results_dir, "prefix_shift_pair1.json")
  if os.path.exists(prefix_path):
    tables["corrections (prefix shift, pair1)"] = corrections_table(read_json(prefix_path, "prefix-shift file"))
  plans_dir = os.path.join(results_dir, "plans")
  if os.path.isdir(plans_dir):
    plans = {f[:-len(".json")]: read_json(os.path.join(plans_dir, f), "plan file")
             for f in sorted(os.listdir(plans_dir)) if f.endswith(".json")}
    if plans:
      tables["real-scale plans"] = plans_table(plans)
    read_dir = lambda folder: {f[:-len(".json")]: read_json(os.path.join(folder, f), "plan file")
                               for f in sorted(os.listdir(folder)) if f.endswith(".json")}
    before_dir, after_dir = (os.path.join(plans_dir, f"{when}_stacked_layers") for when in ("before", "after"))
    if os.path.isdir(before_dir) and os.path.isdir(after_dir):  # the comparison as measured then
      tables["real-scale plans before and after stacked layers"] = plans_before_after_table(read_dir(before_dir),
                                                                                          read_dir(after_dir))
    flags_dir = os.path.join(plans_dir, "flags")
    for f in sorted(os.listdir(flags_dir)) if os.path.isdir(flags_dir) else []:
      if f.endswith(".json"):
        tables[f"plan {f[:-len('.json')]}"] = plan_programs_table(read_json(os.path.join(flags_dir, f), "plan file"))
  host_path = os.path.join(results_dir, "host_rss.jsonl")
  if os.path.exists(host_path):
    tables["host memory"] = host_rss_table(read_jsonl(host_path, "host-memory file"))
  tables.update(real_pair.tables(results_dir))
  tables.update(real_configs.tables(results_dir))
  tables.update(real_recipes.tables(results_dir))
  tables.update(serving.tables(results_dir))
  tables.update(study.tables(results_dir))
  tables.update(comparison.tables(results_dir))
  tables.update(bench.tables(results_dir))
  tables.update(cross_tokenizer.tables(results_dir))
  tables.update(cross_family.tables(results_dir))
  return tables


PAGE_HEADER = """# Results

Every table below is rendered from the result files shipped in `results/` by
`python -m study.results_tables --out=docs/results.md`; do not edit this page by hand (a test fails when it is
not what `results/` generates). How each file is made, and what the numbers mean, is in [study.md](study.md)
(the embedded pairs), [real_pair.md](real_pair.md) (SmolLM2) and [real_scale.md](real_scale.md) (plans).
"""


def source_of(title: str) -> str:
  """The shipped file (or folder) a table of all_tables is rendered from."""
  for sources in (pairs.SOURCES, study.SOURCES, comparison.SOURCES, bench.SOURCES, cross_tokenizer.SOURCES,
                  cross_family.SOURCES):
    if title in sources:
      return sources[title]
  kind, _, name = title.partition(" ")
  if kind in ("sweep", "importance"):
    return f"results/{name}.jsonl"
  if title.startswith("budget"):
    return "results/budget.json"
  if title.startswith("validation"):
    return "results/validation.json"
  if title.startswith("corrections (prefix shift"):
    return "results/prefix_shift_pair1.json"
  if title == "real-scale plans":
    return "results/plans/"
  if title == "real-scale plans before and after stacked layers":
    return "results/plans/before_stacked_layers/, results/plans/after_stacked_layers/"
  if title.startswith("plan "):
    return f"results/plans/flags/{title[len('plan '):]}.json"
  if title == "host memory":
    return "results/host_rss.jsonl"
  if title == "served teacher vs in process":
    return "results/served_teacher.jsonl"
  if title == "top-k transport":
    return "results/topk_transport.jsonl"
  if title.startswith("top-k transport: training"):
    return "results/topk_pair1_seed*.jsonl"
  if title == "two teachers, routed per problem":
    return "results/multi_teacher/metrics.jsonl"
  return "results/smollm2/"


def render_page(results_dir: str) -> str:
  """docs/results.md: every table of all_tables, each under its title with the file it comes from."""
  parts = [PAGE_HEADER]
  for title, table in all_tables(results_dir).items():
    caption = f" {bench.CAPTIONS[title]}." if title in bench.CAPTIONS else ""
    parts.append(f"## {title}\n\nFrom `{source_of(title)}`.{caption}\n\n{table}\n")
  return "\n".join(parts)
