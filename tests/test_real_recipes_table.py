"""study/tables/real_recipes.py: each recipe run against the main run of its own seed."""

import json

import numpy as np

from opd_jax.experiments.intervals import t_interval


def _write(folder, first_kl, last_kl, accuracy, k3=None):
  folder.mkdir(parents=True)
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
