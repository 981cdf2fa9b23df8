"""Sensitivity scan, recipe fitting and prefix-shift analysis on a tiny random pair."""

import pytest

from configs import common
from opd_jax.screening.calibration import Calibration
from opd_jax.screening.prefix_shift import analyze
from opd_jax.screening.sensitivity import fit_recipe, scan
from opd_jax.rollout.config import RolloutConfig
from opd_jax.spec import screening_spec


@pytest.fixture(scope="module")
def cal(tiny_pair):
  config = common.base_config("tiny")
  config.teacher, config.student = tiny_pair["teacher"], tiny_pair["student"]
  config.rollout.max_new_tokens = 12
  return Calibration.from_spec(screening_spec(config), num_prompts=16)


@pytest.fixture(scope="module")
def fp8_scan(cal):
  return scan(cal, "fp8", RolloutConfig(max_new_tokens=12))


@pytest.mark.slow
def test_scan_covers_every_group_and_ranks(fp8_scan):
  rows = fp8_scan
  names = {r["name"] for r in rows}
  assert {"layer 0", "layer 1", "q_proj", "down_proj", "embed"} <= names and "lm_head" not in names  # tied
  assert [r["k3"] for r in rows] == sorted((r["k3"] for r in rows), reverse=True)
  assert all(r["k3"] >= 0 for r in rows) and rows[0]["k3"] > 0


@pytest.mark.slow
def test_sensitivity_scan_is_the_same_for_either_layer_storage(tiny_pair, fp8_scan):
  """The per-layer groups quantize one layer of the stacked [L, ...] kernels (PerLayer values, a loop over layers)
  where per-layer storage quantizes one layer's own kernels: every group's k3 and vocabulary KL agree to 1e-6."""
  config = common.base_config("tiny")
  config.teacher, config.student = tiny_pair["teacher"], tiny_pair["student"]
  config.rollout.max_new_tokens = 12
  config.model.scan_layers = False
  per_layer = {r["name"]: r for r in scan(Calibration.from_spec(screening_spec(config), num_prompts=16), "fp8",
                                          RolloutConfig(max_new_tokens=12))}
  assert {r["name"] for r in fp8_scan} == set(per_layer)
  for row in fp8_scan:
    metrics = [k for k, v in row.items() if isinstance(v, float)]
    assert {"k3", "k1"} <= set(metrics) and any(k.startswith("vocab/") for k in metrics)
    for key in metrics:
      assert row[key] == pytest.approx(per_layer[row["name"]][key], abs=1e-6), (row["name"], key)


def test_weight_recipes_and_the_sensitivity_scan_on_gemma3(tmp_path):
  """Gemma 3 (sliding and full layers, scaled embedding, four norms a block): the fp8 scan ranks every layer and
  projection group; a recipe keeping every layer in bf16 leaves less mismatch than fp8 throughout."""
  from tests import checkpoints
  pair = checkpoints.make_tiny_pair(str(tmp_path), "gemma3_text")
  config = common.base_config("tiny")
  config.teacher, config.student = pair["teacher"], pair["student"]
  config.rollout.max_new_tokens = 12
  calibration = Calibration.from_spec(screening_spec(config), num_prompts=16)
  rows = scan(calibration, "fp8", RolloutConfig(max_new_tokens=12))
  assert {"layer 0", "layer 1", "q_proj", "down_proj", "embed"} <= {r["name"] for r in rows}
  assert [r["k3"] for r in rows] == sorted((r["k3"] for r in rows), reverse=True)  # ranked, most sensitive first
  assert all(r["k3"] >= 0 for r in rows) and rows[0]["k3"] > 0
  fitted = fit_recipe(calibration, "fp8", RolloutConfig(max_new_tokens=12), rows, target_k3=0.0)
  everything = fit_recipe(calibration, "fp8", RolloutConfig(max_new_tokens=12), rows, target_k3=float("inf"))
  assert len(fitted["kept_bf16"]) == 2 and fitted["k3"] < everything["k3"]


@pytest.mark.slow
def test_fit_recipe_keeps_layers_until_target(cal, fp8_scan):
  rollout = RolloutConfig(max_new_tokens=12)
  rows = fp8_scan
  everything = fit_recipe(cal, "fp8", rollout, rows, target_k3=float("inf"))
  assert everything["kept_bf16"] == [] and everything["k3"] > 0
  strict = fit_recipe(cal, "fp8", rollout, rows, target_k3=0.0)
  assert len(strict["kept_bf16"]) == 2  # both layers had to stay in bf16
  first_rule = strict["rules"][0]
  assert first_rule[1] == "bf16" and first_rule[0] == [r for r in rows if r["kind"] == "layer"][0]["regex"]
  RolloutConfig(weight_rules=tuple(tuple(r) for r in strict["rules"])).validate_for(cal.params)


def test_recipe_file_round_trips_into_the_pair_config(cal, tmp_path):
  import json
  rules = [[r"^layers\.0\.", "bf16"], [r"mlp", "fp8_e4m3"]]
  (tmp_path / "recipe.json").write_text(json.dumps({"rules": rules}))
  config = common.pair_config("pair1", f"runlocal,recipe={tmp_path / 'recipe.json'}")
  assert config.rollout.weight_rules == tuple(tuple(r) for r in rules) and config.train.steps == 6
  with pytest.raises(ValueError, match="does not exist"):
    common.pair_config("pair1", "recipe=/no/such.json")
  with pytest.raises(ValueError, match="config argument 'fast' is unknown"):
    common.pair_config("pair1", "fast")


@pytest.mark.slow
def test_prefix_shift_is_zero_without_noise_and_appears_with_it(cal):
  rollout = RolloutConfig(max_new_tokens=12)
  zero = analyze(cal, rollout, 0.0)
  assert zero["identical_responses"] == 1.0 and abs(zero["prefix_shift"]) < 1e-6
  assert zero["same_prefix_k3"] < 1e-9 and zero["k1_tis_error"] == pytest.approx(zero["k1_naive_error"], abs=1e-5)
  # Without noise every correction's weight is 1: all equal the uncorrected estimate and keep every response.
  for kind, c in zero["corrections"].items():
    assert c["k1_error"] == pytest.approx(zero["corrections"]["none"]["k1_error"], abs=1e-5), kind
    assert abs(c["shift"]) < 1e-5 and c["kept"] == 1.0 and c["ess"] == pytest.approx(1.0), kind
  noisy = analyze(cal, rollout, 0.3)
  assert noisy["same_prefix_k3"] > 1e-4 and noisy["identical_responses"] < 1.0
  assert noisy["first_divergence_mean"] < zero["first_divergence_mean"]
  assert noisy["corrections"]["seq_tis"]["ess"] < noisy["corrections"]["tis"]["ess"] <= 1.0  # whole-sequence ratios


@pytest.mark.slow
def test_admission_staleness_grows_with_lag(tiny_pair, cal):
  """Lagged versions come from real updates after a burn-in: lag 1 is already a nonzero mismatch."""
  from opd_jax.screening.admission import measure_candidate
  config = common.base_config("tiny")
  config.teacher, config.student = tiny_pair["teacher"], tiny_pair["student"]
  config.rollout.max_new_tokens = 12
  k3 = [measure_candidate(cal, screening_spec(config), RolloutConfig(max_new_tokens=12, staleness_steps=s))["k3"] for s in (0, 1, 3)]
  assert k3[0] < 1e-6 < k3[1] < k3[2]


@pytest.mark.slow
def test_lagged_versions_keep_holds_only_the_offsets_asked_for(tiny_pair, cal):
  """keep={0, 3} holds two weight copies, equal to the ones every offset's run holds (the same updates)."""
  import jax
  import numpy as np
  from opd_jax.screening.admission import lagged_versions
  config = common.base_config("tiny")
  config.teacher, config.student = tiny_pair["teacher"], tiny_pair["student"]
  config.rollout.max_new_tokens = 12
  spec = screening_spec(config)
  every = lagged_versions(cal, spec, 3)
  kept = lagged_versions(cal, spec, 3, keep={0, 3})
  assert [v is None for v in kept] == [False, True, True, False] and all(v is not None for v in every)
  for i in (0, 3):
    for a, b in zip(jax.tree.leaves(every[i]), jax.tree.leaves(kept[i])):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert any(not np.array_equal(np.asarray(a), np.asarray(b))
             for a, b in zip(jax.tree.leaves(every[0]), jax.tree.leaves(every[3])))


@pytest.mark.slow
def test_lagged_versions_accumulate_over_the_runs_micro_batches_to_float_rounding(tiny_pair, cal):
  """Updates over the 16-row calibration batch in 4-row passes (the run's batch) equal whole-batch updates."""
  import jax
  import numpy as np
  from opd_jax.screening.admission import lagged_versions, update_micro_batch
  versions = {}
  for batch in (16, 4):
    config = common.base_config("tiny")
    config.teacher, config.student = tiny_pair["teacher"], tiny_pair["student"]
    config.rollout.max_new_tokens, config.train.batch_size = 12, batch
    assert update_micro_batch(screening_spec(config), 16) == (0 if batch == 16 else 4)
    versions[batch] = lagged_versions(cal, screening_spec(config), 2, keep={2})[2]
  for a, b in zip(jax.tree.leaves(versions[16]), jax.tree.leaves(versions[4])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_admission_k3_shares_one_lagged_run_between_staleness_points(tiny_pair, cal):
  """launch/admission_k3.py's staleness points read one lagged run (lags 1 and 3 kept) and measure what each
  measured alone; a point with another learning rate gets its own."""
  from opd_jax.experiments import admission_k3
  from opd_jax.screening import admission

  def config_for(pair):
    config = common.base_config("tiny")
    config.teacher, config.student = tiny_pair["teacher"], tiny_pair["student"]
    config.rollout.max_new_tokens = 12
    return config

  points = {"s1": {"rollout.staleness_steps": 1}, "s3": {"rollout.staleness_steps": 3},
            "s3_lr": {"rollout.staleness_steps": 3, "optimizer.learning_rate": 0.01}}
  rows = [{"pair": "tiny", "point": p, "overrides": o, "status": "ok"} for p, o in points.items()]
  calls = []
  real = admission.lagged_versions
  with pytest.MonkeyPatch.context() as m:
    m.setattr(admission, "lagged_versions", lambda *a, **k: calls.append((a[2], k.get("keep"))) or real(*a, **k))
    measured = {r["point"]: r["admission_k3"] for r in admission_k3.measure(rows, config_for, num_prompts=16)}
  assert calls == [(3, {0, 1, 3}), (3, {0, 3})]
  for point, overrides in points.items():
    config = config_for("tiny")
    for key, value in overrides.items():
      admission_k3.set_field(config, key, value)
    spec = screening_spec(config)
    alone = admission.measure_candidate(cal, spec, spec.rollout)["k3"]
    assert measured[point] == pytest.approx(alone, rel=1e-5), point
