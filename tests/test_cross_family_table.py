"""The cross-family pair's results table (study/tables/cross_family.py) on a made-up results folder: step 0 from
the first evaluation, the distilled student from the last, probes against the shipped before-files, seed means with
t-intervals."""

import json
import os
import shutil

from study.tables import cross_family

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _probe(path, row, part, correct, asked):
  with open(os.path.join(REPO, "results", "gemma3", path)) as f:
    report = json.load(f)
  report["results"][row][part].update(correct=correct, asked=asked)
  return report


def _seed(root, seed, accuracy, french, wall):
  folder = os.path.join(root, "gemma3", "s2g_run", f"seed{seed}")
  os.makedirs(folder)
  rows = [{"step": 0, "eval/span_reverse_kl": 1.8, "eval/accuracy": 0.5, "eval/response_tokens": 12.0,
           "eval/at_cap": 0.0, "eval/repetition": 0.0},
          {"step": 2, "loss": 1.0},
          {"step": 100, "eval/span_reverse_kl": 0.9 + seed / 10, "eval/accuracy": accuracy,
           "eval/response_tokens": 10.0, "eval/at_cap": 0.0, "eval/repetition": 0.0}]
  with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in rows))
  for name, report in (("keeps", _probe("probe.json", cross_family.GEMMA, "french", french, 50)),
                       ("time", {"wall_seconds": wall})):
    with open(os.path.join(folder, f"{name}.json"), "w") as f:
      json.dump(report, f)


def _results_root(tmp_path) -> str:
  """A results folder holding the shipped before-files (the base models' probes)."""
  root = str(tmp_path)
  os.makedirs(os.path.join(root, "gemma3"))
  for name in ("probe.json", "base_student_probe.json"):
    shutil.copy(os.path.join(REPO, "results", "gemma3", name), os.path.join(root, "gemma3", name))
  return root


def test_the_table_reads_first_and_last_evaluations_and_the_probes(tmp_path):
  root = _results_root(tmp_path)
  _seed(root, 0, 0.75, 40, 3000)
  _seed(root, 1, 1.0, 30, 3600)
  table = cross_family.tables(root)[cross_family.TITLE]
  lines = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()}
  # span KL: base 1.8 (both seeds equal: one value), distilled 0.9 and 1.0, mean 0.95, t(1) = 12.7062
  half = 12.7062 * 0.05  # sd of (0.9, 1.0) is 0.0707, over sqrt(2) seeds 0.05
  assert "| 1.800 | 0.900, 1.000 | 0.950 [" in lines["span KL per scored token (student's samples)"]
  assert f"{0.95 - half:.3f}, {0.95 + half:.3f}]" in lines["span KL per scored token (student's samples)"]
  assert "| 50.0% | 75.0%, 100.0% | 87.5% [" in lines["capitals accuracy, greedy (graded eval prompts)"]
  base_french = json.load(open(os.path.join(REPO, "results", "gemma3", "probe.json")))
  base_french = base_french["results"][cross_family.GEMMA]["french"]
  assert (f"| {base_french['correct']} / {base_french['asked']} | 40 / 50, 30 / 50 | 70.0% ["
          in lines["kept: English -> French words, two-shot"])
  assert "|  | 50, 60 | 55.0 [" in lines["wall minutes (2 CPU cores)"]
  # no behaviour.json in either seed: those rows are left out, not filled with the base model's counts
  assert not any(label.startswith("trained:") for label in lines)
  assert "distilled (step 100), seeds 0, 1" in table


def test_the_screen_table_puts_each_setting_in_a_column_of_before_after_cells(tmp_path):
  root = _results_root(tmp_path)
  for name, lr, french, rollout in (("fast", 5e-5, 0, {}), ("slow", 2e-5, 37, {"temperature": 0.7})):
    _seed(root, 0, 1.0, french, 900)
    folder = os.path.join(root, "gemma3", "s2g_screen", name)
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    shutil.move(os.path.join(root, "gemma3", "s2g_run", "seed0"), folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
      json.dump({"optimizer": {"learning_rate": lr}, "train": {"eval_size": 48}, "rollout": rollout}, f)
  tables = cross_family.tables(root)
  assert cross_family.TITLE not in tables  # no seed folder left
  lines = {line.split(" | ")[0].lstrip("| "): line for line in tables[cross_family.SCREEN_TITLE].splitlines()}
  assert "`fast/` | `slow/`" in lines["measure (seed 0)"]
  assert lines["setting"].endswith("| lr 5e-05, 100 steps | lr 2e-05, 100 steps, rollouts at temperature 0.7 |")
  assert "| 1.800 -> 0.900 | 1.800 -> 0.900 |" in lines["span KL per scored token (student's samples)"]
  base_french = json.load(open(os.path.join(REPO, "results", "gemma3", "probe.json")))
  base_french = base_french["results"][cross_family.GEMMA]["french"]["correct"]
  assert f"| {base_french} / 50 -> 0 / 50 | {base_french} / 50 -> 37 / 50 |" in lines[
      "kept: English -> French words, two-shot"]
  assert lines["wall minutes (2 CPU cores)"].endswith("| 15 | 15 |")


def test_the_previous_settings_seeds_and_the_diagnostic_runs_have_tables_of_their_own(tmp_path):
  root = _results_root(tmp_path)
  _seed(root, 0, 0.75, 40, 3000)
  shutil.move(os.path.join(root, "gemma3", "s2g_run"), os.path.join(root, "gemma3", "s2g_run_t1"))
  for name, caps in (("t1", (0.1, 0.8, 1.0)), ("t07_rollouts", (0.1, 0.2, 0.05)), ("unlisted", (0.0, 0.0, 0.0))):
    folder = os.path.join(root, "gemma3", "s2g_diagnosis", name)
    os.makedirs(folder)
    rows = [{"step": step, "eval/at_cap": cap, "eval/accuracy": 0.5} for step, cap in zip((0, 5, 10), caps)]
    rows += [{"step": step, "response_tokens": 10.0 + step} for step in range(1, 11)]
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
      f.write("".join(json.dumps(r) + "\n" for r in sorted(rows, key=lambda r: r["step"])))
  tables = cross_family.tables(root)
  assert cross_family.TITLE not in tables and "seeds 0" in tables[cross_family.TITLE_T1]
  lines = {line.split(" | ")[0].lstrip("| "): line for line in tables[cross_family.DIAGNOSIS_TITLE].splitlines()}
  assert "unlisted" not in " ".join(lines)  # only the runs whose change the table can name
  assert "| 0/5/10 | 10%, 80%, 100% | 50%, 50%, 50% | 13.0 | 18.0 |" in lines["`t1/`"]
  assert "| 10%, 20%, 5% |" in lines["`t07_rollouts/`"]
