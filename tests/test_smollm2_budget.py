"""The real pair's pre-registered budget campaign (configs/sweeps/smollm2_budget.py): what it trains, and that its
held-out validation can share no configuration and no seed with calibration."""

from configs.sweeps import smollm2_budget as campaign


def _knobs(overrides) -> dict:
  """A point's rollout knobs, as RolloutConfig field names ("rollout.weights" -> "weights")."""
  return {k.split(".", 1)[1]: (tuple(map(tuple, v)) if k.endswith("weight_rules") else v) for k, v in overrides
          if k.startswith("rollout.")}


def test_the_heldout_pool_shares_no_configuration_and_no_seed_with_calibration():
  calibrated = [_knobs(overrides) for _, overrides in campaign.CALIBRATION]
  assert {} in calibrated and len(calibrated) == 10  # the baseline, and nine mismatch points
  assert all(dict(recipe) not in calibrated for recipe in campaign.HELDOUT_POOL)
  assert not set(campaign.HELDOUT_SEEDS) & set(campaign.SEEDS)
  assert "5 points" in campaign.HELDOUT_RULE and "results/smollm2/budget.json" in campaign.HELDOUT_RULE


def test_the_sweep_trains_the_short_run_and_names_other_lengths():
  sweep = campaign.get_config("seed=1")
  overrides = dict(sweep.base_overrides)
  assert sweep.name == "smollm2_budget[seed=1]" and sweep.pairs == ("smollm2",)
  assert overrides["train.steps"] == campaign.SHORT_STEPS == 100 and overrides["train.eval_sampled"]
  assert overrides["seed"] == 1 and overrides["rollout.noise_seed"] == 1
  # What the shipped calibration runs trained at, whatever configs/smollm2.py's main run moves to.
  assert overrides["optimizer.learning_rate"] == 1e-4 and overrides["objective.beta"] == 0.5
  assert campaign.get_config("steps=300").name == "smollm2_budget[steps=300]"
  recipe = dict(campaign.CALIBRATION)["w_fp8_recipe"]
  assert recipe[0][0] == "rollout.weight_rules" and recipe[0][1][-1][1] == "fp8_e4m3"


def test_the_validation_plan_is_the_pre_registered_one():
  from study.analysis import heldout
  plan = heldout.plan_for("smollm2")
  assert plan.pool == campaign.HELDOUT_POOL and plan.seeds == campaign.HELDOUT_SEEDS == (3, 4)
  assert (plan.steps, plan.near_count, plan.far_count, plan.rule) == (100, 3, 2, campaign.HELDOUT_RULE)
  assert plan.budget == "results/smollm2/budget.json" and not plan.strict
  # Only calibration's runs are excluded, and they trained none of the pool (the rule screens it whole).
  assert plan.trained_in == "smollm2/campaign/smollm2_budget_seed*.jsonl"
  names = [heldout.point_name(o) for o in plan.pool]
  assert len(set(names)) == len(names) == len(plan.pool)


def _screen(ratios: dict, budget_file: dict, steps: int) -> dict:
  """A synthetic smollm2 screen whose candidates compare at `ratios` x the budget ({name: ratio})."""
  from opd_jax.screening import admission
  unit = admission.admit_value(1.0, budget_file, "smollm2", steps)
  rows = [{"candidate": name, "overrides": {"noise_sigma": 0.1} if name.startswith("noise") else {"weights": name},
           "measured": ratio * unit["budget"] / unit["compared"]} for name, ratio in ratios.items()]
  return {"pair": "smollm2", "rows": rows}


def test_the_rule_picks_five_and_reports_a_missing_group_as_it_is():
  import os
  from study.analysis import heldout
  from opd_jax.experiments.files import read_budget
  plan = heldout.plan_for("smollm2")
  budget_file = read_budget(os.path.join(os.path.dirname(os.path.dirname(__file__)), "results", "budget.json"))
  ratios = {"noise_a": 0.95, "near_real": 1.4, "noise_b": 1.05, "low": 0.2, "lower": 0.1, "high": 5.0}
  picked = [p["name"] for p in heldout.select_pair(_screen(ratios, budget_file, plan.steps), budget_file, plan)]
  assert picked == ["noise_a", "near_real", "noise_b", "low", "high"]
  # Nothing far above: the far part is the first far-below alone, not filled from the other side.
  ratios = {"noise_a": 0.95, "near_real": 1.4, "noise_b": 1.05, "low": 0.2, "lower": 0.1}
  picked = [p["name"] for p in heldout.select_pair(_screen(ratios, budget_file, plan.steps), budget_file, plan)]
  assert picked == ["noise_a", "near_real", "noise_b", "low"]
  import pytest
  from opd_jax.errors import InputError
  with pytest.raises(InputError, match="0 far above"):  # the embedded plan's rule stays strict
    heldout.select_pair(_screen(ratios, budget_file, 150), budget_file)


def test_the_validation_sweep_trains_the_selection_at_heldout_seeds(tmp_path, monkeypatch):
  import json
  import pytest
  from configs.sweeps import smollm2_validation as sweep
  selected = tmp_path / "selected.json"
  monkeypatch.setattr(sweep, "SELECTED", str(selected))
  with pytest.raises(ValueError, match="screen and select first"):
    sweep.get_config("seed=3")
  selected.write_text(json.dumps({"points": {"smollm2": [
      {"name": "w_int8", "overrides": {"rollout.weights": "int8"}},
      {"name": "noise_0.05", "overrides": {"rollout.noise_sigma": 0.05}}]}}))
  c = sweep.get_config("seed=4")
  base = dict(c.base_overrides)
  assert c.pairs == ("smollm2",) and (base["seed"], base["train.steps"]) == (4, campaign.SHORT_STEPS)
  assert base["train.eval_sampled"] and base["train.eval_size"] == 96
  assert [n for n, _ in c.points] == ["baseline", "w_int8", "noise_0.05"] and dict(c.points)["baseline"] == ()
  for bad, match in (("seed=0", "seeds"), ("seed=1", "seeds"), ("seed=3,steps=300", "leave them out"),
                     ("seed=3,pairs=pair1", "real pair")):
    with pytest.raises(ValueError, match=match):
      sweep.get_config(bad)


def test_the_calibration_table_shows_each_seeds_rise_over_its_own_baseline(tmp_path):
  """study/tables/real_pair.py: rendered only when every planned point of every seed finished; a point's rise is
  its final reverse KL over its own seed's baseline, as a fraction of the baseline's (the budget's quality)."""
  import json
  import os
  import shutil
  from study.tables import real_pair
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  seed0 = os.path.join(repo, "results", "smollm2", "campaign", "smollm2_budget_seed0.jsonl")
  root = tmp_path / "smollm2"
  (root / "campaign").mkdir(parents=True)
  shutil.copy(seed0, root / "campaign" / "smollm2_budget_seed0.jsonl")
  assert real_pair._campaign(str(root)) is None  # seed 1 missing
  rows = [json.loads(line) for line in open(seed0)]
  for r in rows:  # a second seed whose reverse KLs are all 10% higher: the same relative rises
    r["seed"], r["final_reverse_kl"] = 1, r["final_reverse_kl"] * 1.1
  (root / "campaign" / "smollm2_budget_seed1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  table = real_pair._campaign(str(root))
  assert sorted(table) == [0, 1]
  rendered = real_pair.campaign_table(table)
  base = {r["point"]: r["final_reverse_kl"] / 1.1 for r in rows}
  rise = 100 * (base["w_int4"] / base["baseline"] - 1)
  assert "| w_int4 |" in rendered and f"+{rise:.1f}% / +{rise:.1f}% | +{rise:.1f}% |" in rendered
  assert rendered.count("\n| ") == len(campaign.CALIBRATION)  # one row per point


def test_the_shipped_selection_is_the_rule_on_the_shipped_screen_and_budget():
  """results/smollm2/validation/selected.json: the rule applied again to the shipped screen, judged with the shipped
  budget (whose hash it records), picks the same five points in the same order."""
  import os

  from opd_jax.experiments.files import read_budget, read_json
  from study.analysis import heldout
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  plan = heldout.plan_for("smollm2")
  out = os.path.join(root, plan.out_dir)
  selected = read_json(os.path.join(out, "selected.json"), "selection")
  screen = read_json(os.path.join(out, "screen_smollm2.json"), "screen")
  assert selected["budget_sha256"] == screen["budget_sha256"] == heldout.file_hash(os.path.join(root, plan.budget))
  again = heldout.select({"smollm2": screen}, read_budget(os.path.join(root, plan.budget)), plan)
  assert again == selected["points"]
  assert [p["name"] for p in again["smollm2"]] == ["w_int8_kv_int4", "noise_0.08", "w_fp8_kv_int4", "stale_16",
                                                     "w_int4_kv_int4"]
