"""The shipped results (results/): every file parses with the strict readers, budget.json is what calibrate.py
computes from the shipped sweeps, and every table the README shows from them is in README.md verbatim."""

import os

import pytest

from opd_jax.experiments.calibrate_report import build_budget, load_rows
from opd_jax.experiments.files import read_budget, read_json
from opd_jax.experiments.results_tables import all_tables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results")


def _readme() -> str:
  with open(os.path.join(ROOT, "README.md")) as f:
    return f.read()


def test_every_results_table_is_in_the_readme():
  tables = all_tables(RESULTS)
  assert {"sweep sources", "budgets", "budget transfer", "validation", "importance corrections_grpo"} <= set(tables), \
      sorted(tables)
  readme = _readme()
  for title, table in tables.items():
    assert table in readme, f"README.md does not show the current {title} table; run launch/results_tables.py"


def test_budget_json_is_recomputed_from_the_shipped_sweeps():
  budget = read_budget(os.path.join(RESULTS, "budget.json"))
  paths = [os.path.join(ROOT, p) for p in budget["results"]]
  assert all(os.path.exists(p) for p in paths), budget["results"]
  again = build_budget([r for r in load_rows(paths) if r["point"] not in budget["holdout_points"]],
                       tolerance=budget["tolerance"], relative=budget["tolerance_relative"], other_scales=False)
  assert set(again["budgets"]) == set(budget["budgets"]) and again["transfer"] == budget["transfer"]
  for key, entry in again["budgets"].items():
    assert budget["budgets"][key]["budget"] == pytest.approx(entry["budget"], rel=1e-9), key
    assert budget["budgets"][key]["interval"] == pytest.approx(entry["interval"], rel=1e-9), key
  # Done-when of issue 14: a bounded budget for every pair (a tested point beyond it lost quality).
  assert all(budget["budgets"][p]["bounded"] for p in ("pair1", "pair2", "pair3"))
  assert len(budget["horizons"]) >= 2


def test_validation_rows_match_the_readme_claims():
  """README: 9 held-out configurations, 3 seeds each, all agreeing; 7 of them within 3x of their budget; the
  int3 recipe loses quality beyond the tolerance on pair2 and pair3 and not on pair1."""
  validation = read_json(os.path.join(RESULTS, "validation.json"), "validation file")
  rows = validation["rows"]
  assert validation["n"] == len(rows) == 9 and all(len(r["seeds"]) == 3 for r in rows)
  assert sum(1 / 3 <= r["measured_over_budget"] <= 3 for r in rows) == 7
  assert validation["agreed"] == sum(r["agree"] for r in rows) == 9
  lo, hi = validation["agreement_interval"]
  assert lo <= validation["agreement"] <= hi
  for r in rows:  # the seed-mean verdict is the mean of the per-seed losses
    assert r["quality_loss"] == pytest.approx(sum(s["quality_loss"] for s in r["seeds"]) / 3)
  int3 = {r["pair"]: r["real_ok"] for r in rows if r["point"] == "w_int3"}
  assert int3 == {"pair1": True, "pair2": False, "pair3": False}
