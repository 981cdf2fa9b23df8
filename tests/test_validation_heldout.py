"""The pre-registered held-out validation (configs/sweeps/validation_heldout.py, study/analysis/heldout.py),
before and after its runs: the shipped selection is what the written rule gives on the shipped screens; it meets
the pre-registration (>= 16 configurations, half near the budget as admission judges them, real recipes); no
selected configuration, seed or run was used by a shipped run; every pair and seed trains its own baseline."""

import dataclasses
import glob
import json
import math
import os

import pytest

from configs import common
from configs.sweeps import validation_heldout as sweep_config
from opd_jax.errors import InputError
from study.analysis import heldout
from opd_jax.experiments.files import read_budget, read_json, read_jsonl
from opd_jax.rollout.config import RolloutConfig
from opd_jax.screening import admission

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "results", "validation_heldout")
BUDGET = os.path.join(REPO, "results", "budget.json")


def _in_repo(path):
  return os.path.join(REPO, path)


@pytest.fixture(scope="module")
def selected():
  return read_json(os.path.join(OUT, "selected.json"), "selection")


@pytest.fixture(scope="module")
def budget_file():
  return read_budget(BUDGET)


def _shipped_rows() -> dict[str, list[dict]]:
  """Every shipped sweep row outside the validation's own directory."""
  return heldout.shipped_rows(os.path.join(REPO, "results"), skip=OUT)


def _validation_rows() -> dict[str, list[dict]]:
  """The validation sweep's own results files, once they exist (results/validation_heldout/<pair>_seed<s>.jsonl)."""
  return {path: read_jsonl(path) for path in sorted(glob.glob(os.path.join(OUT, "pair*_seed*.jsonl")))}


def test_the_selection_is_the_rule_applied_to_the_shipped_screens(selected, budget_file, monkeypatch):
  monkeypatch.chdir(REPO)  # the selection records repo-relative paths, as study/heldout_screen.py writes them
  screens = {p: read_json(s["file"], "screen") for p, s in selected["screens"].items()}
  similar = {path: read_jsonl(path) for path in selected["cost_estimate"]["from"]}
  again = heldout.selection_file(screens, {p: s["file"] for p, s in selected["screens"].items()}, budget_file,
                                 "results/budget.json", similar)
  assert json.loads(json.dumps(again)) == selected
  assert selected["rule"] == heldout.RULE and selected["seeds"] == [3, 4, 5] == list(heldout.SEEDS)


def test_every_screen_measured_the_whole_pool_as_the_validation_will(selected):
  """Each screen holds every pool candidate (measured, or excluded as trained before), measured on the calibration
  batch study/report.py --validate uses, at the sweep's run length."""
  names = [heldout.point_name(o) for o in heldout.candidate_pool()]
  assert len(set(names)) == len(names)
  for pair, s in selected["screens"].items():
    screen = read_json(_in_repo(s["file"]), "screen")
    assert sorted([r["candidate"] for r in screen["rows"]] + [e["candidate"] for e in screen["excluded"]]) \
        == sorted(names), pair
    assert (screen["pair"], screen["steps"], screen["prompts"], screen["seed"]) == (pair, 150, 128, 0)


def test_the_selection_meets_the_pre_registration(selected, budget_file):
  """>= 16 configurations, at least half within x/÷ 1.5 of the budget as admission.admit_value with
  results/budget.json compares them, at least 4 real recipes, far points on both sides on every pair."""
  points = [(pair, p) for pair, ps in selected["points"].items() for p in ps]
  assert len(points) >= 16 and sorted(selected["points"]) == ["pair1", "pair2", "pair3"]
  near = 0
  for pair, p in points:
    verdict = admission.admit_value(p["measured"], budget_file, pair, 150)
    ratio = verdict["compared"] / verdict["budget"]
    assert verdict["budget_source"] == "pooled" and ratio == pytest.approx(p["ratio"])
    near += 1 / 1.5 <= ratio <= 1.5
    assert (1 / 1.5 <= ratio <= 1.5) == (p["band"] == "near"), (pair, p["name"])
  assert 2 * near >= len(points)
  assert sum("rollout.noise_sigma" not in p["overrides"] for _, p in points) >= 4
  for pair, ps in selected["points"].items():
    assert {"far below", "far above"} <= {p["band"] for p in ps}, pair
    assert {p["ratio"] <= 1 for p in ps if p["band"] == "near"} == {True, False}, pair  # near on both sides
    assert len({p["name"] for p in ps}) == len(ps)


def _rollout(values: dict) -> RolloutConfig:
  """A resolved rollout (fields this version does not know are left out), its noise draw aside."""
  known = {f.name for f in dataclasses.fields(RolloutConfig)}
  values = {k: (tuple(map(tuple, v)) if k == "weight_rules" else v) for k, v in values.items() if k in known}
  return dataclasses.replace(RolloutConfig(**values), noise_seed=0)


def _selected_rollouts(selected) -> dict[tuple[str, str], RolloutConfig]:
  out = {}
  for pair, points in selected["points"].items():
    base = dict(common.config_for(pair).rollout)
    for p in points:
      given = {k.split(".", 1)[1]: v for k, v in p["overrides"].items()}
      out[(pair, p["name"])] = _rollout({**base, **given})
  return out


def test_no_selected_configuration_was_trained_before(selected, budget_file):
  """Compared as resolved rollout configs (noise draw aside) with every shipped run of the pair: calibration
  (budget.json's results files), the earlier validations and every other sweep."""
  shipped = _shipped_rows()
  calibration = [os.path.join(REPO, f) for f in budget_file["results"]]
  assert set(calibration) <= set(shipped), "the scan misses calibration files"
  mine = _selected_rollouts(selected)
  clashes = []
  for path, rows in shipped.items():
    for row in rows:
      if row["pair"] not in selected["points"]:
        continue
      base = dict(common.config_for(row["pair"]).rollout)
      given = {k.split(".", 1)[1]: v for k, v in row.get("overrides", {}).items() if k.startswith("rollout.")}
      theirs = _rollout(row.get("rollout") or {**base, **given})
      clashes += [f"{pair}/{name} = {path}:{row['point']}" for (pair, name), r in mine.items()
                  if pair == row["pair"] and r == theirs]
  assert not clashes, clashes
  # The check can fail: a calibration point's configuration is found.
  calibration_point = _rollout({**dict(common.config_for("pair3").rollout), "noise_sigma": 0.15})
  assert any(_rollout(r["rollout"]) == calibration_point for r in shipped[calibration[0]] if r["pair"] == "pair3")


def test_no_validation_seed_or_run_was_used_before(budget_file):
  """Seeds 3, 4, 5 appear in no shipped row of the three pairs (calibration's are 0, 1, 2); once the validation's
  rows exist, their seeds are the sweep's and no run_id of theirs is a shipped row's."""
  shipped = _shipped_rows()
  seeds = {r.get("seed", 0) for rows in shipped.values() for r in rows if r["pair"] in heldout.PAIRS}
  assert not seeds & set(heldout.SEEDS), seeds
  calibration_seeds = {r.get("seed", 0) for f in budget_file["results"] for r in read_jsonl(_in_repo(f))}
  assert calibration_seeds == {0, 1, 2}
  shipped_ids = {r["run_id"] for rows in shipped.values() for r in rows if "run_id" in r}
  for path, rows in _validation_rows().items():
    seed = int(path.rsplit("_seed", 1)[1].split(".")[0])
    assert {r["seed"] for r in rows} == {seed}, path
    assert all("run_id" in r for r in rows), f"{path}: rows without a run_id"
    assert not {r["run_id"] for r in rows} & shipped_ids, path


def test_every_pair_and_seed_trains_its_own_baseline(selected):
  assert sweep_config.SEEDS == heldout.SEEDS
  for pair in heldout.PAIRS:
    for seed in heldout.SEEDS:
      c = sweep_config.get_config(f"pairs={pair},seed={seed}")
      base = dict(c.base_overrides)
      assert (c.pairs, base["seed"], base["train.steps"]) == ((pair,), seed, heldout.STEPS)
      names = [name for name, _ in c.points]
      assert names == ["baseline"] + [p["name"] for p in selected["points"][pair]]
      assert dict(c.points)["baseline"] == ()
      for name, overrides in c.points:  # every seed trains the noise draw the screen measured
        if "rollout.noise_sigma" in dict(overrides):
          assert dict(overrides)["rollout.noise_seed"] == heldout.SCREEN_SEED, name
  for path, rows in _validation_rows().items():
    baselines = [r for r in rows if r["point"] == "baseline" and r["status"] == "ok"]
    assert len(baselines) == 1 and baselines[0]["seed"] == rows[0]["seed"], path
  for bad, match in (("pairs=pair1,seed=0", "seeds"), ("pairs=pair1+pair2,seed=3", "one of"),
                     ("pairs=pair1,seed=3,steps=75", "150 steps")):
    with pytest.raises(ValueError, match=match):
      sweep_config.get_config(bad)


def _screen(pair: str, ratios: dict[str, float], budget_file) -> dict:
  """A synthetic screen whose candidates compare at `ratios` x the budget ({name: ratio}; noise_* are noise)."""
  unit = admission.admit_value(1.0, budget_file, pair, 150)
  rows = []
  for name, ratio in ratios.items():
    overrides = {"noise_sigma": 0.1, "noise_seed": 0} if name.startswith("noise") else {"weights": name}
    rows.append({"candidate": name, "overrides": overrides, "measured": ratio * unit["budget"] / unit["compared"]})
  return {"pair": pair, "rows": rows}


def test_the_rule_prefers_real_recipes_then_the_closest(budget_file):
  ratios = {"noise_a": 0.98, "noise_b": 1.1, "noise_c": 0.9, "near_real": 1.45, "low_real": 0.1,
            "low_closer": 0.5, "noise_low": 0.6, "noise_high": 1.6, "high_real": 9.0, "noise_z": 3.0}
  picked = [p["name"] for p in heldout.select_pair(_screen("pair2", ratios, budget_file), budget_file)]
  assert picked == ["noise_a", "near_real", "noise_b", "low_closer", "high_real", "low_real"]
  with pytest.raises(InputError, match="pair2's screen has 1 near below, 1 near above"):  # too few near
    heldout.select_pair(_screen("pair2", {"noise_a": 0.98, "noise_b": 1.1, "x": 0.1, "y": 9.0, "z": 5.0},
                                budget_file), budget_file)
  with pytest.raises(InputError, match="0 near above"):  # no near candidate the budget rejects
    heldout.select_pair(_screen("pair2", {"noise_a": 0.98, "noise_c": 0.9, "noise_d": 0.8, "x": 0.1, "y": 9.0,
                                          "z": 5.0}, budget_file), budget_file)


def test_the_cost_estimate_and_the_docstring_agree(selected):
  cost = selected["cost_estimate"]
  n = sum(map(len, selected["points"].values()))
  assert cost["total_runs"] == (n + 3) * 3
  doc = " ".join(sweep_config.__doc__.split())
  assert f"{cost['total_runs']} runs" in doc and f"{cost['seconds'] / 3600:.1f} h" in doc
  near = sum(p["band"] == "near" for ps in selected["points"].values() for p in ps)
  assert f"{n} configurations, {near} near" in doc
  fitted = heldout.calibration_constant(read_budget(BUDGET))
  assert f"calibration_constant: {fitted['threshold']:.3g}, right on {fitted['agreed']} of the {fitted['n']}" in doc
  screened = sum(read_json(_in_repo(s["file"]), "screen")["seconds"] for s in selected["screens"].values())
  assert f"{screened / 60:.1f} min for the three pairs" in doc
  assert math.isclose(cost["seconds"], sum(cost["seconds_per_run"][p] * cost["runs"][p] for p in cost["runs"]))


def test_the_calibration_constant_is_the_best_threshold_on_calibration_points(budget_file):
  fitted = heldout.calibration_constant(budget_file)
  losses = {(p["pair"], p["point"]): p["quality_loss"] for p in budget_file["budgets"]["pooled"]["points"]}
  points = [(admission.admit_value(p["admission_k3"], budget_file, p["pair"], 150)["compared"],
             losses[(p["pair"], p["point"])] <= 0.05)
            for p in budget_file["k3_conversion"]["points"] if p["steps"] == 150]
  score = lambda t: sum((v <= t) == ok for v, ok in points)
  assert fitted["n"] == len(points) == 21 and score(fitted["threshold"]) == fitted["agreed"]
  assert all(score(10 ** (e / 100)) <= fitted["agreed"] for e in range(-500, 200))


def test_the_judged_losses_are_the_shipped_runs():
  """results/validation_heldout.json's per-seed quality losses and run k3 recomputed from the sweep's own files:
  each point's finished row against the baseline of its pair and seed (a preempted attempt left a row with an
  error, followed by the resumed run's); every selected configuration is judged with all three seeds."""
  validation = read_json(os.path.join(REPO, "results", "validation_heldout.json"), "validation file")
  finished = {}
  for path, rows in _validation_rows().items():
    for r in rows:
      if r.get("status") == "ok":
        finished[(r["pair"], r["point"], r["seed"])] = r
  judged = set()
  for row in validation["rows"]:
    assert [s["seed"] for s in row["seeds"]] == list(heldout.SEEDS), row["point"]
    for s in row["seeds"]:
      run, base = finished[(row["pair"], row["point"], s["seed"])], finished[(row["pair"], "baseline", s["seed"])]
      assert s["final_accuracy"] == run["final_accuracy"]
      assert s["quality_loss"] == pytest.approx(base["final_accuracy"] - run["final_accuracy"], abs=1e-12)
      assert s["run_k3"] == pytest.approx(run["mismatch"]["mismatch/k3"], rel=1e-12)
    judged.add((row["pair"], row["point"]))
  selected = read_json(os.path.join(OUT, "selected.json"), "selection")
  assert judged == {(pair, p["name"]) for pair, points in selected["points"].items() for p in points}
