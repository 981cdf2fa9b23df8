"""The pre-registered per-pair budget test (opd_jax/experiments/pair_budgets.py) on synthetic rows: the decision
follows the rule, the interval is a t-interval of the seed mean, and admission follows the decision in
budget.json."""

import pytest

from opd_jax.errors import InputError
from opd_jax.experiments.pair_budgets import decide, seed_interval, side
from opd_jax.experiments.sweep import fill_deltas
from opd_jax.screening.admission import pick_budget


def _seed_rows(seed: int, losses: dict[str, float]) -> list[dict]:
  """One results file of the sweep: every pair's baseline and k3_high, deltas filled as load_rows does."""
  rows = []
  for pair, loss in losses.items():
    for point, acc in (("baseline", 0.60 + 0.01 * seed), ("k3_high", 0.60 + 0.01 * seed - loss)):
      rows.append({"pair": pair, "point": point, "status": "ok", "seed": seed, "final_accuracy": acc, "best_accuracy": acc,
                   "overrides": {} if point == "baseline" else {"rollout.noise_sigma": 0.1},
                   "mismatch": {"mismatch/k3": 0.6}, "rollout": {"noise_seed": seed}})
  return fill_deltas(rows)


def _rows(per_seed: list[dict[str, float]]) -> list[dict]:
  return [r for seed, losses in enumerate(per_seed) for r in _seed_rows(seed, losses)]


def test_the_interval_is_a_t_interval_of_the_seed_mean():
  """mean +- t(0.975, 2) * sd / sqrt(3): on three seeds it reaches well past their min-max (a percentile bootstrap
  would be [0.02, 0.09] here, and fail this test)."""
  lo, hi = seed_interval([0.02, 0.04, 0.09])
  half = 4.3027 * 0.036055513 / 3 ** 0.5  # sd of (0.02, 0.04, 0.09) = sqrt(0.0013)
  assert [lo, hi] == pytest.approx([0.05 - half, 0.05 + half], abs=1e-6)
  assert lo < 0.02 and hi > 0.09
  assert seed_interval([0.03, 0.03, 0.03]) == pytest.approx([0.03, 0.03])
  assert [side(i, 0.05) for i in ([0.0, 0.04], [0.06, 0.1], [0.04, 0.06])] == ["inside", "beyond", "straddles"]


def test_per_pair_budgets_are_kept_only_when_the_pairs_separate():
  apart = _rows([{"pair1": 0.09, "pair2": 0.01, "pair3": 0.08}, {"pair1": 0.10, "pair2": 0.02, "pair3": 0.09},
                 {"pair1": 0.08, "pair2": 0.00, "pair3": 0.11}])
  result = decide(apart, 0.05)
  assert result["decision"] == "per_pair" and "pair2 loses 1.0 points" in result["outcome"]
  assert [s["quality_loss"] for s in result["points"][1]["seeds"]] == pytest.approx([0.01, 0.02, 0.0])
  # One seed of pair3 inside the tolerance: its interval straddles it, so the pairs are not told apart.
  close = _rows([{"pair1": 0.09, "pair2": 0.01, "pair3": 0.02}, {"pair1": 0.10, "pair2": 0.02, "pair3": 0.09},
                 {"pair1": 0.08, "pair2": 0.00, "pair3": 0.11}])
  assert decide(close, 0.05)["decision"] == "pooled"


def test_the_decision_refuses_too_few_seeds():
  two = _rows([{"pair1": 0.09, "pair2": 0.01, "pair3": 0.08}, {"pair1": 0.10, "pair2": 0.02, "pair3": 0.09}])
  with pytest.raises(InputError, match=r"missing or short: \['pair2', 'pair1', 'pair3'\]"):
    decide(two, 0.05)


def test_admission_uses_the_pooled_budget_when_the_test_says_pooled():
  own, pooled = {"budget": 0.7, "bounded": True}, {"budget": 0.39, "bounded": True}
  budget = {"budgets": {"pair2": own, "pooled": pooled}}
  assert pick_budget(budget, "pair2")[0] == "pair2"
  budget["per_pair_test"] = {"decision": "per_pair", "file": "t.json"}
  assert pick_budget(budget, "pair2")[0] == "pair2"
  budget["per_pair_test"] = {"decision": "pooled", "file": "t.json"}
  source, chosen, note = pick_budget(budget, "pair2")
  assert (source, chosen) == ("pooled", pooled) and "indistinguishable (t.json)" in note


def test_admission_uses_the_main_length_when_the_horizon_test_does_not_show_it_moves():
  budget = {"steps": 150, "horizons": [40, 150], "budgets": {"pooled": {"budget": 0.4}, "pooled@40": {"budget": 1.2}}}
  assert pick_budget(budget, "pair1", 40)[0] == "pooled@40"  # no test recorded: the nearest length
  budget["horizon_test"] = {"decision": "moves"}
  assert pick_budget(budget, "pair1", 40)[0] == "pooled@40"
  budget["horizon_test"] = {"decision": "not shown"}
  source, _, note = pick_budget(budget, "pair1", 40)
  assert source == "pooled" and "horizon test did not show" in note


def _horizon_rows(losses_by_steps: dict[int, list[float]]) -> list[dict]:
  """pair1's baseline and noise_0.15 at each run length, one results file per (length, seed)."""
  rows = []
  for steps, losses in losses_by_steps.items():
    for seed, loss in enumerate(losses):
      runs = [{"pair": "pair1", "point": point, "status": "ok", "seed": seed, "steps": steps, "final_accuracy": acc,
               "best_accuracy": acc, "overrides": {} if point == "baseline" else {"rollout.noise_sigma": 0.15},
               "mismatch": {"mismatch/k3": 0.7}, "rollout": {"noise_seed": seed}}
              for point, acc in (("baseline", 0.6), ("noise_0.15", 0.6 - loss))]
      rows += fill_deltas(runs)
  return rows


def test_the_horizon_test_needs_one_length_inside_and_another_beyond():
  from opd_jax.experiments import horizon
  moves = horizon.decide(_horizon_rows({40: [0.0, 0.01, 0.02], 75: [0.03, 0.06, 0.07], 150: [0.09, 0.1, 0.11]}),
                         0.05)
  assert moves["decision"] == "moves" and [p["side"] for p in moves["lengths"]] == ["inside", "straddles", "beyond"]
  assert moves["outcome"].startswith("40 steps: 1.0 points [-1.5, 3.5] (inside)")  # t-interval, not [0.0, 2.0]
  # Seeds all beyond the tolerance are not enough when their spread leaves the t-interval straddling it.
  spread = horizon.decide(_horizon_rows({40: [0.0, 0.01, 0.02], 75: [0.03, 0.06, 0.07], 150: [0.051, 0.051, 0.117]}),
                          0.05)
  assert spread["decision"] == "not shown" and spread["lengths"][-1]["side"] == "straddles"
  # Straddling at one end is not enough: no length is wholly inside.
  flat = horizon.decide(_horizon_rows({40: [0.03, 0.06, 0.07], 75: [0.03, 0.06, 0.07], 150: [0.06, 0.08, 0.1]}),
                        0.05)
  assert flat["decision"] == "not shown"
  with pytest.raises(InputError, match=r"three run lengths .* have lengths \[75, 150\], short of seeds: \[75\]"):
    horizon.decide(_horizon_rows({75: [0.03, 0.06], 150: [0.06, 0.08, 0.1]}), 0.05)
