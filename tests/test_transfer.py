"""study/analysis/transfer.py: a validation judged again with another budget file keeps its real verdicts and
changes only admission's; the calibration cost is counted from the budget file's own results."""

import copy
import json
import os

import pytest

from opd_jax.errors import InputError
from opd_jax.experiments.files import read_budget
from study.analysis import transfer
from study.analysis.validation import judge, summary

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET = os.path.join(REPO, "results", "budget.json")


def _halved(budget_file: dict) -> dict:
  """The same file with every budget (and its bootstrap draws) halved: a stricter budget calibrated elsewhere."""
  other = copy.deepcopy(budget_file)
  for b in other["budgets"].values():
    b["budget"] /= 2
    if b.get("bootstrap_budgets"):
      b["bootstrap_budgets"] = [x / 2 for x in b["bootstrap_budgets"]]
  return other


def _validation(budget_file: dict) -> dict:
  """Three held-out rows judged with `budget_file`: at 0.3x, 0.7x and 2x its budget (as compared), the middle one
  harmless in the real run."""
  unit = judge({"pair": "smollm2", "measured": 1.0, "quality_loss": 0.0, "steps": 100}, budget_file)
  rows = []
  for point, ratio, loss in (("a", 0.3, 0.01), ("b", 0.7, 0.02), ("c", 2.0, 0.2)):
    measured = ratio * unit["budget"] / unit["compared"]
    row = {"pair": "smollm2", "point": point, "steps": 100, "measured": measured, "quality_loss": loss}
    rows.append({**row, **judge(row, budget_file)})
  return {"rows": rows, "budget": budget_file, "budget_file": "own.json", **summary(rows)}


def test_another_budget_changes_admission_only(tmp_path):
  own = read_budget(BUDGET)
  other_path = tmp_path / "other.json"
  other_path.write_text(json.dumps(_halved(own)))
  result = transfer.transfer(_validation(own), read_budget(str(other_path)), str(other_path))
  assert [r["own"]["admit"] for r in result["rows"]] == [True, True, False]
  assert [r["transferred"]["admit"] for r in result["rows"]] == [True, False, False]  # 0.7x becomes 1.4x
  assert [r["real_ok"] for r in result["rows"]] == [True, True, False]
  assert (result["own"]["agreed"], result["transferred"]["agreed"], result["verdicts_differ"]) == (3, 2, 1)
  assert result["trivial"]["admit all"]["agreed"] == 2 and result["trivial"]["reject all"]["agreed"] == 1
  other = read_budget(str(other_path))
  other["scale"] = "k1"
  with pytest.raises(InputError, match="cannot judge the same measurements"):
    transfer.transfer(_validation(own), other, str(other_path))


def test_the_calibration_cost_counts_the_budget_files_runs(tmp_path):
  results = tmp_path / "r.jsonl"
  results.write_text("".join(json.dumps(r) + "\n" for r in (
      {"status": "ok", "wall_seconds": 600.0}, {"status": "ok", "wall_seconds": 700.0},
      {"status": "failed", "wall_seconds": 50.0})))
  k3 = tmp_path / "k3.jsonl"
  k3.write_text(json.dumps({"seconds": 100.0}) + "\n")
  cost = transfer.calibration_cost({"results": [str(results)], "k3_conversion": {"file": str(k3)}}, [1400.0, 1600.0])
  assert (cost["runs"], cost["seconds"], cost["main_runs_equivalent"]) == (2, 1400.0, pytest.approx(1400 / 1500))
  with pytest.raises(InputError, match="wall times"):
    transfer.calibration_cost({"results": [str(results)]}, [])
