"""study/tables/real_recipes.py: each recipe run against the main run of its own seed."""

import json

import numpy as np

from opd_jax.experiments.intervals import t_interval


def _write(folder, first_kl, last_kl, accuracy, k3=None, config=None):
  folder.mkdir(parents=True)
  if config is not None:
    (folder / "config.json").write_text(json.dumps(config))
  evaluation = lambda step, kl, acc: {"step": step, "eval/reverse_kl": kl, "eval/accuracy": acc, "eval/at_cap": 0.25,
                                      "eval/repetition": 0.125}
  rows = [evaluation(0, first_kl, 0.0)]
  rows += [{"step": s, "loss": 0.1, **({"mismatch/k3": k} if k3 else {})} for s, k in zip((5, 10), k3 or (0, 0))]
  rows.append(evaluation(300, last_kl, accuracy))
  (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_recipe_is_judged_against_the_main_run_of_the_same_seed(tmp_path):
  from study.tables import real_recipes
  root = tmp_path / "smollm2"
  for seed, base_kl in ((0, 0.7), (1, 0.8), (2, 0.75)):
    _write(root / "run" / f"seed{seed}", 1.8, base_kl, 0.5)
  _write(root / "recipes_300" / "fp8" / "seed0", 1.8, 0.77, 0.5, k3=(0.01, 0.03))  # +10%
  _write(root / "recipes_300" / "fp8" / "seed1", 1.8, 0.84, 0.25, k3=(0.02, 0.02))  # +5%
  _write(root / "recipes_300" / "int4" / "seed2", 1.8, 1.5, 0.0, k3=(1.0, 1.0))  # one seed: no interval
  (root / "recipes_300" / "int8").mkdir()  # no run yet: no row
  table = real_recipes.tables(str(tmp_path))["smollm2 recipes at 300 steps"]
  lines = table.splitlines()
  assert len(lines) == 4, table
  fp8, int4 = lines[2].split(" | "), lines[3].split(" | ")
  assert fp8[0] == "| weights=fp8" and fp8[1] == "0 / 1" and fp8[2] == "0.02"
  lo, hi = t_interval([10.0, 5.0])
  assert fp8[4] == f"+7.5 [{lo:+.1f}, {hi:+.1f}]%"
  lo, hi = t_interval([0.77, 0.84])
  assert fp8[3].startswith(f"0.805 [{lo:.3f}, {hi:.3f}] vs 0.750 [")
  assert fp8[5].startswith("37.5 [") and fp8[5].endswith("vs 50.0")  # the baselines agree: one value
  assert int4[1] == "2" and int4[3] == "1.500 vs 0.750" and int4[4] == "+100.0%" and int4[5] == "0.0 vs 50.0"
  assert np.isclose(float(int4[2]), 1.0)


def test_no_table_without_recipe_runs(tmp_path):
  from study.tables import real_recipes
  _write(tmp_path / "smollm2" / "run" / "seed0", 1.8, 0.7, 0.5)
  assert real_recipes.tables(str(tmp_path)) == {}


def test_a_recipe_takes_the_main_run_trained_at_its_own_settings(tmp_path):
  """After the main config moves (GKD beta 0.5 -> 0.7), recipe runs that pinned 0.5 keep the old main runs as their
  baselines; a recipe with no main run at its settings is refused with the culprit named."""
  import pytest
  from study.tables import real_recipes
  root = tmp_path / "smollm2"
  config = lambda beta, weights="none", every=150: {"seed": 0, "objective": {"name": "jsd", "beta": beta},
                                                   "optimizer": {"learning_rate": 2e-4}, "train": {"steps": 300,
                                                   "eval_every": every}, "rollout": {"weights": weights}}
  _write(root / "run" / "seed0", 1.8, 0.6, 0.5, config=config(0.7))
  _write(root / "run_v4_beta0.5" / "seed0", 1.8, 0.7, 0.5, config=config(0.5, every=75))
  _write(root / "recipes_300" / "fp8" / "seed0", 1.8, 0.77, 0.5, k3=(0.01, 0.01), config=config(0.5, "fp8", 300))
  row = real_recipes.tables(str(tmp_path))["smollm2 recipes at 300 steps"].splitlines()[2].split(" | ")
  assert row[3] == "0.770 vs 0.700" and row[4] == "+10.0%"  # against the beta-0.5 run, not the beta-0.7 one
  _write(root / "recipes_300" / "int4" / "seed0", 1.8, 0.9, 0.5, k3=(1.0, 1.0), config=config(0.3, "int4", 300))
  with pytest.raises(ValueError, match=r"recipes_300/int4/seed0: no main run of seed 0"):
    real_recipes.tables(str(tmp_path))


def test_mean_cell_writes_the_seed_mean_and_its_t_interval_or_one_value():
  """The one cell format every seed table shares (study/tables/markdown.mean_cell)."""
  from study.tables.markdown import mean_cell
  lo, hi = t_interval([0.5, 0.7, 0.6])
  assert mean_cell([0.5, 0.7, 0.6]) == f"0.600 [{lo:.3f}, {hi:.3f}]" and lo < 0.5 and hi > 0.7
  assert mean_cell([0.25, 0.25], lambda x: f"{100 * x:.1f}%") == "25.0%"  # the seeds agree: one value
  assert mean_cell([0.25, 0.25], collapse=False) == "0.250 [0.250, 0.250]" and mean_cell([0.4]) == "0.400"
  # two hosts' float noise (the seventh digit) still reads as one value; a difference at the fourth does not
  assert mean_cell([1.993933151, 1.993933471]) == "1.994" and mean_cell([1.9939, 1.9941]).startswith("1.994 [")
