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
  assert campaign.get_config("steps=300").name == "smollm2_budget[steps=300]"
  recipe = dict(campaign.CALIBRATION)["w_fp8_recipe"]
  assert recipe[0][0] == "rollout.weight_rules" and recipe[0][1][-1][1] == "fp8_e4m3"
