"""study/tables/real_configs.py: the real pair's other configs, each against the main run of the same seed."""

import json

from opd_jax.experiments.intervals import t_interval


def _write(folder, first_kl, last_kl, beta, learning_rate=2e-4, extra=None):
  folder.mkdir(parents=True)
  objective = {"name": "jsd", "beta": beta, **(extra or {})}
  config = {"seed": 0, "objective": objective, "optimizer": {"learning_rate": learning_rate},
            "train": {"steps": 300, "eval_every": 150}}
  (folder / "config.json").write_text(json.dumps(config))
  evaluation = lambda step, kl: {"step": step, "eval/reverse_kl": kl, "eval/accuracy": 0.5, "eval/at_cap": 0.25,
                                 "eval/repetition": 0.125, "eval/response_tokens": 28.0}
  rows = [evaluation(0, first_kl), {"step": 5, "loss": 0.1}, evaluation(300, last_kl)]
  (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_each_config_is_paired_with_the_main_run_of_the_same_seed(tmp_path):
  from study.tables import real_configs
  root = tmp_path / "smollm2"
  for seed, first in ((0, 2.0), (1, 1.6), (2, 1.8)):
    _write(root / "run" / f"seed{seed}", first, 0.8, 0.7)
  # beta 0.8: final 0.88 and 0.72 against the main runs' 0.8 (+10%, -10%); a field added since is no difference
  _write(root / "screen_beta0.8" / "seed0", 2.0, 0.88, 0.8, extra={"marginal_span": "first"})
  _write(root / "screen_beta0.8" / "seed1", 1.6, 0.72, 0.8, extra={"marginal_span": "first"})
  _write(root / "run_v3_lr1e-4" / "seed2", 1.8, 0.9, 0.5, learning_rate=1e-4)  # one seed: no row
  (root / "tuning").mkdir()  # not a config folder
  table = real_configs.tables(str(tmp_path))["smollm2 configs against the main one"]
  lines = table.splitlines()
  assert len(lines) == 4, table
  main, screen = lines[2].split(" | "), lines[3].split(" | ")
  lo, hi = t_interval([40.0, 50.0, 100 * 0.8 / 1.8])
  assert main[2:4] == ["0 / 1 / 2", f"{(40 + 50 + 80 / 1.8) / 3:.2f}% [{lo:.2f}%, {hi:.2f}%]"]
  assert main[4] == "12.5%" and main[6] == "28.0"  # the seeds agree: one value
  assert screen[0] == "| screen_beta0.8" and screen[1] == "beta 0.8" and screen[2] == "0 / 1"
  lo, hi = t_interval([10.0, -10.0])
  assert screen[-1] == f"+0.0% [{lo:+.1f}%, {hi:+.1f}%] |"


def test_a_main_run_of_more_seeds_keeps_a_row_over_the_first_three(tmp_path):
  """Seeds added to the main run later: one row over all of them, one over seeds 0-2 as the other configs ran."""
  from study.tables import real_configs, real_pair
  root = tmp_path / "smollm2"
  firsts = (2.0, 1.95, 1.98, 2.2, 2.1)  # ratios 40.0%, 41.0%, 40.4% (mean above 40%), then 36.4% and 38.1%
  for seed, first in enumerate(firsts):
    _write(root / "run" / f"seed{seed}", first, 0.8, 0.7)
  for seed in (0, 1):
    _write(root / "screen_beta0.8" / f"seed{seed}", 2.0, 0.8, 0.8)
  lines = real_configs.tables(str(tmp_path))["smollm2 configs against the main one"].splitlines()
  ratios = [100 * 0.8 / f for f in firsts]
  rows = [line.split(" | ") for line in lines[2:]]
  assert [r[2] for r in rows] == ["0 / 1 / 2 / 3 / 4", "0 / 1 / 2", "0 / 1"]
  for row, seeds in zip(rows, (ratios, ratios[:3])):
    lo, hi = t_interval(seeds)
    assert row[3] == f"{sum(seeds) / len(seeds):.2f}% [{lo:.2f}%, {hi:.2f}%]"
  # the goals table: five seeds judged, the first three beside (each with its own "met")
  runs = [[json.loads(line) for line in (root / "run" / f"seed{s}" / "metrics.jsonl").read_text().splitlines()]
          for s in range(5)]
  for rows_ in runs:
    for r in rows_:
      r.update({"eval/teacher_response_tokens": 28.0, "eval/teacher_at_cap": 0.25, "eval/teacher_repetition": 0.1})
  goals = real_pair.goals_table(runs).splitlines()
  assert goals[0].endswith("| distilled (5 seeds) | met | first 3 seeds | met |")
  last = goals[-1].split(" | ")
  lo, hi = t_interval(ratios[:3])
  assert last[-2] == f"{sum(ratios[:3]) / 3:.2f}% [{lo:.2f}%, {hi:.2f}%]" and last[-1] == "no |"
  assert last[-3] == "yes" and "first 3 seeds" not in real_pair.goals_table(runs[:3])  # five seeds: 39.2%


def test_no_table_without_another_config_of_two_seeds(tmp_path):
  from study.tables import real_configs
  _write(tmp_path / "smollm2" / "run" / "seed0", 1.8, 0.7, 0.7)
  _write(tmp_path / "smollm2" / "screen_x" / "seed0", 1.8, 0.7, 0.8)
  assert real_configs.tables(str(tmp_path)) == {}


def test_a_timing_check_row_says_whether_the_numbers_held_and_sets_its_time_beside_the_main_runs(tmp_path):
  from study.tables import real_configs
  root = tmp_path / "smollm2"
  _write(root / "run" / "seed0", 1.8, 0.7, 0.7)
  (root / "run" / "seed0" / "time.json").write_text(json.dumps(
      {"wall_seconds": 2700.0, "train_seconds": 2380.4, "peak_rss_bytes": 6.99e9}))
  check = root / "timing_eval300" / "seed0"
  _write(check, 1.8, 0.7, 0.7)
  (check / "time.json").write_text(json.dumps({"wall_seconds": 2490.0, "train_seconds": 2259.1,
                                               "eval_seconds": [124.2, 89.7], "peak_rss_bytes": 9.05e9}))
  same = {"values_compared": 2006, "differences_total": 0, "samples_steps_0_and_300_identical": True}
  (check / "same_metrics.json").write_text(json.dumps(same))
  row = real_configs.tables(str(tmp_path))["smollm2 timing_eval300"].splitlines()[2]
  assert row == "| 0 | 2006 values, samples: yes | 41.5 | 45.0 | 2259 vs 2380 | 124 + 90 | 9.05 | 6.99 |"
  (check / "same_metrics.json").write_text(json.dumps({**same, "differences_total": 3}))
  assert "2006 values, samples: no" in real_configs.tables(str(tmp_path))["smollm2 timing_eval300"]
