"""Budget fitting and verdicts, sweep bookkeeping (resume, failures, deltas) and the report, on synthetic data."""

import json
import os
import warnings

import ml_collections
import numpy as np
import pytest

from study.analysis import plots, report
from opd_jax.experiments.calibrate_report import build_budget, load_rows
from opd_jax.experiments.files import read_jsonl
from opd_jax.experiments.sweep import fill_deltas, run_sweep
from study.analysis.validation import group_seeds, is_held_out, validate, wilson_interval
from opd_jax.mismatch import budget as budget_lib


def test_hinge_fit_recovers_knee_and_slope():
  m = np.geomspace(1e-5, 1e-1, 17)
  q = 0.05 * np.maximum(0, np.log10(m / 1e-3))
  fit = budget_lib.fit_hinge(m, q)
  assert fit.knee == pytest.approx(1e-3, rel=0.2) and fit.slope == pytest.approx(0.05, rel=0.05) and fit.r2 > 0.99
  assert fit.budget(0.02, m.max()) == pytest.approx(1e-3 * 10 ** 0.4, rel=0.25)


def test_no_observed_loss_gives_the_largest_tested_mismatch():
  m = np.array([1e-5, 1e-4, 1e-3])
  fit = budget_lib.fit_hinge(m, np.array([0.0, -0.01, 0.0]))
  assert fit.slope == 0 and fit.budget(0.02, 1e-3) == 1e-3


def test_budget_never_passes_a_point_beyond_tolerance():
  """A steep collapse pulls the hinge knee up; the budget must still stop before the tested point at m=1.3
  (loss 0.086 > 0.05): the observed crossing, log-interpolated between m=0.75 (0.047) and m=1.3, caps it."""
  m = np.array([1e-4, 1e-3, 1e-2, 0.18, 0.75, 1.3, 1.9, 3.2, 3.9])
  q = np.array([-0.03, -0.02, -0.02, 0.004, 0.047, 0.086, 0.14, 0.40, 0.63])
  assert budget_lib.fit_hinge(m, q).budget(0.05, m.max()) > 1.3  # the rigid fit alone overshoots
  assert budget_lib.observed_crossing(m, q, 0.05) == pytest.approx(0.75 * (1.3 / 0.75) ** (0.003 / 0.039))
  rows = [{"pair": "p", "point": f"x{i}", "status": "ok", "delta_final_accuracy": -qi, "final_accuracy": 0.6 - qi,
           "mismatch": {"mismatch/k3": mi}} for i, (mi, qi) in enumerate(zip(m, q))]
  result = budget_lib.calibrate(rows, tolerance=0.05, bootstrap=50)
  assert 0.75 < result["budget"] < 0.8 and result["bounded"]
  # The file says what set it: the crossing between the two points it interpolates, and the empty range around it.
  set_by = result["set_by"]
  assert set_by["rule"].startswith("observed crossing") and [p["point"] for p in set_by["between"]] == ["p/x4", "p/x5"]
  assert set_by["empty_range"]["ratio"] == pytest.approx(1.3 / 0.75)
  assert not result["fit"]["sets_budget"] and result["fit"]["note"].startswith("not used")
  # Without a point beyond the tolerance nothing is crossed: the budget is the largest mismatch tested.
  flat = budget_lib.calibrate(rows[:5], tolerance=0.05, bootstrap=5)
  assert flat["set_by"]["rule"].startswith("largest mismatch tested") and flat["set_by"]["point"]["point"] == "p/x4"
  assert budget_lib.isotonic(np.array([0.0, 0.2, 0.1, 0.3])).tolist() == pytest.approx([0.0, 0.15, 0.15, 0.3])


def _rows(seed=0, pair="pair1"):
  rng = np.random.default_rng(seed)
  rows = [{"pair": pair, "point": "baseline", "status": "ok", "final_accuracy": 0.8, "best_accuracy": 0.8,
           "mismatch": {"mismatch/k3": 0.0, "mismatch/k1": 0.0, "mismatch/tv": 0.0, "mismatch/mult_prob_error": 1.0},
           "rollout": {}, "overrides": {}, "wall_seconds": 1.0}]
  for i, k3 in enumerate(np.geomspace(1e-5, 3e-1, 12)):
    loss = 0.06 * max(0.0, np.log10(k3 / 2e-3)) + rng.normal(0, 0.003)
    rows.append({"pair": pair, "point": f"noise_{i}", "status": "ok", "final_accuracy": 0.8 - loss,
                 "best_accuracy": 0.8 - loss, "rollout": {"noise_sigma": float(k3)}, "overrides": {},
                 "mismatch": {"mismatch/k3": float(k3), "mismatch/k1": float(-k3), "mismatch/tv": float(np.sqrt(k3)),
                              "mismatch/mult_prob_error": float(1 + np.sqrt(k3))}, "wall_seconds": 1.0})
  return fill_deltas(rows)


def test_calibrate_and_verdict():
  result = budget_lib.calibrate(_rows(), tolerance=0.03, bootstrap=200)
  assert result["bounded"] and 2e-3 < result["budget"] < 2e-2
  lo, hi = result["interval"]
  assert lo <= result["budget"] <= hi
  inside = budget_lib.verdict(result["budget"] / 10, result)
  outside = budget_lib.verdict(result["budget"] * 10, result)
  assert inside["admit"] and inside["margin"] == pytest.approx(0.9) and inside["confidence"] > 0.9
  assert not outside["admit"] and outside["confidence"] > 0.9
  with pytest.raises(ValueError, match=">= 3 finished"):
    budget_lib.calibrate(_rows()[:2])


def test_seed_mean_calibration_pools_seeds_per_point_and_bootstraps_them():
  """--seed_means: one point per configuration, the mean over its seeds, with their count and losses; one seed
  per point gives exactly the single-run budget (the same bootstrap draws)."""
  from opd_jax.experiments.calibrate_report import seed_mean_rows
  one = build_budget(_rows(), tolerance=0.03, relative=False, other_scales=False)
  again = build_budget(_rows(), tolerance=0.03, relative=False, other_scales=False, seed_means=True)
  assert again["budgets"]["pair1"]["budget"] == one["budgets"]["pair1"]["budget"]
  assert again["budgets"]["pair1"]["interval"] == one["budgets"]["pair1"]["interval"]
  seeds = [_with(_rows(s), seed=s) for s in (0, 1, 2)]
  merged = seed_mean_rows([r for rows in seeds for r in rows])
  assert len(merged) == 13 and all(r["seeds"] == [0, 1, 2] for r in merged)
  point = next(r for r in merged if r["point"] == "noise_11")
  assert point["delta_final_accuracy"] == pytest.approx(np.mean([rows[12]["delta_final_accuracy"] for rows in seeds]))
  budget = build_budget([r for rows in seeds for r in rows], tolerance=0.03, relative=False, other_scales=False,
                        seed_means=True)
  entry = budget["budgets"]["pair1"]
  assert entry["fit"]["n"] == 13 and entry["points"][-1]["seeds"] == 3 and budget["seed_means"]
  assert entry["interval"][0] <= entry["budget"] <= entry["interval"][1]
  with pytest.raises(ValueError, match="differ in seed"):
    seed_mean_rows(seeds[0] + seeds[0])


def _kl_rows(seed=0, pair="smollm2"):
  """Rows whose accuracy never moves but whose final reverse KL rises 10% per decade of k3 above 1e-2."""
  rng = np.random.default_rng(seed)
  rows = [{"pair": pair, "point": "baseline", "status": "ok", "final_accuracy": 0.5, "best_accuracy": 0.5,
           "final_reverse_kl": 0.8,
           "mismatch": {"mismatch/k3": 0.0}, "rollout": {}, "overrides": {}, "seed": seed}]
  for i, k3 in enumerate(np.geomspace(1e-4, 3.0, 10)):
    rise = 0.10 * max(0.0, np.log10(k3 / 1e-2)) + rng.normal(0, 0.002)
    rows.append({"pair": pair, "point": f"noise_{i}", "status": "ok", "final_accuracy": 0.5, "best_accuracy": 0.5,
                 "final_reverse_kl": 0.8 * (1 + rise), "mismatch": {"mismatch/k3": float(k3)}, "rollout": {},
                 "overrides": {"rollout.noise_sigma": float(k3)}, "seed": seed})
  return fill_deltas(rows)


def test_reverse_kl_quality_budgets_on_the_relative_rise_of_the_final_reverse_kl():
  """quality="reverse_kl": a point's loss is its final reverse KL's rise over its baseline's, as a fraction of the
  baseline's; a 5% tolerance crosses at k3 = 1e-2 * 10^0.5. Accuracy (flat here) sees no loss at all."""
  rows = _kl_rows()
  kl = budget_lib.calibrate(rows, tolerance=0.05, bootstrap=20, quality="reverse_kl")
  assert kl["quality"] == "reverse_kl" and kl["bounded"] and kl["budget"] == pytest.approx(10 ** -1.5, rel=0.35)
  assert kl["points"][-1]["quality_loss"] == pytest.approx((rows[-1]["final_reverse_kl"] - 0.8) / 0.8)
  assert not budget_lib.calibrate(rows, tolerance=0.05, bootstrap=5)["bounded"]  # accuracy: nothing lost
  seeds = [_kl_rows(s) for s in (0, 1)]
  budget = build_budget([r for rows in seeds for r in rows], tolerance=0.05, relative=False, other_scales=False,
                        seed_means=True, quality="reverse_kl")
  assert budget["quality"] == "reverse_kl" and budget["budgets"]["smollm2"]["points"][-1]["seeds"] == 2
  with pytest.raises(ValueError, match="already relative"):
    budget_lib.calibrate(rows, relative=True, quality="reverse_kl")
  with pytest.raises(ValueError, match="not one of"):
    budget_lib.calibrate(rows, quality="bleu")
  no_kl = [{k: v for k, v in r.items() if "reverse_kl" not in k} for r in rows]
  with pytest.raises(ValueError, match=">= 3 finished"):  # rows without the measure are not points of it
    budget_lib.calibrate(no_kl, quality="reverse_kl")


@pytest.mark.slow
def test_budget_file_has_pairs_pooled_and_transfer():
  budget = build_budget(_rows(0, "pair1") + _rows(1, "pair2"), tolerance=0.03, relative=False)
  assert set(budget["budgets"]) == {"pair1", "pair2", "pooled"}
  assert budget["scale"] == "k3" and budget["scale_measured_as"].startswith("run mean")  # which k3: the file says
  assert set(budget["other_scales"]["pooled"]) == {"k1", "tv", "mult_prob_error"}
  per_pair = budget["transfer"]["per_pair_budgets"]
  assert per_pair == {p: budget["budgets"][p]["budget"] for p in ("pair1", "pair2")}  # not the pooled one
  assert budget["transfer"]["max_over_min"] == pytest.approx(max(per_pair.values()) / min(per_pair.values()))


def _with(rows, **fields):
  return [{**r, **fields} for r in rows]


@pytest.mark.slow
def test_budgets_per_horizon_and_the_transfer_matrix():
  """Rows of two run lengths give a budget per (pair, horizon); the main horizon (most rows) keeps plain keys.
  admission picks the horizon nearest the run it judges and says so."""
  from opd_jax.screening.admission import pick_budget
  long = _with(_rows(0, "pair1"), steps=150) + _with(_rows(1, "pair2"), steps=150)
  short = [{**r, "steps": 75, "delta_final_accuracy": r["delta_final_accuracy"] * 2,
            "final_accuracy": 0.8 + 2 * r["delta_final_accuracy"]} for r in _rows(2, "pair1")]
  budget = build_budget(long + short, tolerance=0.03, relative=False)
  assert set(budget["budgets"]) == {"pair1", "pair2", "pooled", "pair1@75", "pooled@75"}
  assert (budget["steps"], budget["horizons"]) == (150, [75, 150])
  assert budget["budgets"]["pair1"]["steps"] == 150 and budget["budgets"]["pair1@75"]["steps"] == 75
  assert budget["budgets"]["pair1@75"]["budget"] < budget["budgets"]["pair1"]["budget"]  # losses doubled
  key, chosen, note = pick_budget(budget, "pair1", 80)
  assert key == "pair1@75" and note == "calibrated on 75-step runs, this run trains 80"
  assert pick_budget(budget, "pair1", 150)[0] == "pair1" and pick_budget(budget, "pair1")[2] == \
      "calibrated on 150-step runs"
  assert pick_budget(budget, "pair2", 70)[0] == "pooled@75"  # pair2 has no 75-step runs
  matrix = budget["transfer"]["matrix"]
  assert set(matrix) == {"pair1", "pair2"} and matrix["pair1"]["pair1"]["n"] == 13
  for a in matrix:
    for b, cell in matrix[a].items():
      assert cell["agree"] + len(cell["wrongly_admitted"]) + len(cell["wrongly_rejected"]) == cell["n"]


def test_validation_groups_seeds_and_refuses_calibration_points():
  assert wilson_interval(6, 6)[1] == 1.0 and 0.5 < wilson_interval(6, 6)[0] < 0.7
  assert wilson_interval(0, 0) == [0.0, 1.0]
  lo, hi = wilson_interval(5, 10)
  assert lo == pytest.approx(1 - hi) and 0.2 < lo < 0.25
  seeds = [_with(fill_deltas([{**r, "final_accuracy": r["final_accuracy"] - 0.01 * s * (r["point"] != "baseline")}
                             for r in _rows(0)]), seed=s) for s in range(3)]
  grouped = {g["point"]: g for g in group_seeds([r for rows in seeds for r in rows])}
  assert "baseline" not in grouped and len(grouped["noise_3"]["seeds"]) == 3
  single = -seeds[0][4]["delta_final_accuracy"]
  assert grouped["noise_3"]["quality_loss"] == pytest.approx(single + 0.01)  # mean of +0, +0.01, +0.02
  with pytest.raises(ValueError, match="appears twice"):
    group_seeds(seeds[0] + seeds[0])
  with pytest.raises(ValueError, match="also calibration points"):
    validate(_rows(0), lambda pair: None, holdout_fraction=0.3, tolerance=0.03, relative=False, num_prompts=8,
             heldout=seeds[1], budget_file={"scale": "k3"})
  with pytest.raises(ValueError, match="needs the budget file admission uses"):
    validate(_rows(0), lambda pair: None, holdout_fraction=0.3, tolerance=0.03, relative=False, num_prompts=8,
             heldout=seeds[1])


def _sweep():
  c = ml_collections.ConfigDict()
  c.name = "toy"
  c.pairs = ("pair1",)
  c.base_overrides = (("train.steps", 3),)
  c.points = (("baseline", ()), ("bad", (("rollout.noise_sigma", -1.0),)), ("fp8", (("rollout.weights", "fp8"),)))
  return c


def _fake_pair_config(pair):
  config = ml_collections.ConfigDict({"pair": pair, "seed": 0, "optimizer": {"learning_rate": 1e-3},
                                      "train": {"steps": 10, "progress_bar": True, "resume": False, "mode": "sync"},
                                      "rollout": {"weights": "none", "noise_sigma": 0.0},
                                      "objective": {"name": "reverse_kl"}})
  return config


def _fake_train(calls):
  def train(config, workdir):
    calls.append(workdir)
    if config.rollout.noise_sigma < 0:
      raise ValueError("rollout.noise_sigma must be >= 0")
    os.makedirs(workdir, exist_ok=True)
    acc = 0.5 if config.rollout.weights == "none" else 0.45
    rows = [{"step": 0, "eval/accuracy": 0.3}, {"step": 3, "loss": 1.0, "mismatch/k3": 0.01 * (acc < 0.5)},
            {"step": 3, "eval/accuracy": acc}]
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
  return train


def test_sweep_records_failures_and_resumes(tmp_path):
  calls = []
  rows = run_sweep(_sweep(), str(tmp_path), _fake_pair_config, _fake_train(calls), log=lambda *_: None)
  by_point = {r["point"]: r for r in rows}
  assert by_point["bad"]["status"] == "failed" and "noise_sigma" in by_point["bad"]["error"]
  assert by_point["fp8"]["delta_final_accuracy"] == pytest.approx(-0.05)
  assert by_point["fp8"]["rollout"]["weights"] == "fp8" and by_point["fp8"]["mismatch"]["mismatch/k3"] == 0.01
  assert by_point["fp8"]["objective"] == "reverse_kl"
  assert (by_point["fp8"]["steps"], by_point["fp8"]["learning_rate"], by_point["fp8"]["seed"]) == (3, 1e-3, 0)
  assert len(calls) == 3
  rows = run_sweep(_sweep(), str(tmp_path), _fake_pair_config, _fake_train(calls), log=lambda *_: None)
  assert len(calls) == 4  # only the failed point ran again
  assert len(read_jsonl(os.path.join(tmp_path, "results.jsonl"))) == 4
  with pytest.raises(ValueError, match="needs a point named 'baseline'"):
    bad = _sweep()
    bad.points = (("fp8", ()),)
    run_sweep(bad, str(tmp_path / "x"), _fake_pair_config, _fake_train([]))
  # a typo in a point's field, or an objective that does not exist: one error before anything runs or is written
  for field, value, message in (("rollout.weigths", "fp8", "no field 'weigths'"),
                                ("objective.name", "revrse_kl", "'revrse_kl' is unknown")):
    typo = _sweep()
    typo.points = (("baseline", ()), ("typo", ((field, value),)))
    with pytest.raises(ValueError, match=f"point 'typo' on pair1: .*{message}"):
      run_sweep(typo, str(tmp_path / "typo"), _fake_pair_config, _fake_train(calls))
  assert len(calls) == 4 and not os.path.exists(tmp_path / "typo")


def test_a_preempted_point_stops_the_sweep_and_resumes_on_rerun(tmp_path):
  """SIGTERM reaches the point's run, which checkpoints and raises Preempted: the sweep stops there (it went on to
  the next points before, so a stopped sweep kept training), writes no row for it, and the rerun runs it."""
  from opd_jax.train.preemption import Preempted
  calls, train = [], _fake_train([])

  def preempted_at_fp8(config, workdir):
    calls.append(workdir)
    if config.rollout.weights == "fp8" and len(calls) < 3:
      raise Preempted("preempted: SIGTERM received; stopped after step 1", 143)
    train(config, workdir)
  sweep = _sweep()
  sweep.points = (("baseline", ()), ("fp8", (("rollout.weights", "fp8"),)), ("last", (("rollout.weights", "int8"),)))
  with pytest.raises(Preempted):
    run_sweep(sweep, str(tmp_path), _fake_pair_config, preempted_at_fp8, log=lambda *_: None)
  assert [r["point"] for r in read_jsonl(os.path.join(tmp_path, "results.jsonl"))] == ["baseline"]
  assert len(calls) == 2  # "last" never started
  rows = run_sweep(sweep, str(tmp_path), _fake_pair_config, preempted_at_fp8, log=lambda *_: None)
  assert [(r["point"], r["status"]) for r in rows] == [("baseline", "ok"), ("fp8", "ok"), ("last", "ok")]


def test_results_of_two_objectives_are_refused(tmp_path):
  paths = []
  for objective in ("reverse_kl", "grpo"):
    path = tmp_path / f"{objective}.jsonl"
    path.write_text("".join(json.dumps({**r, "objective": objective}) + "\n" for r in _rows(0)))
    paths.append(str(path))
  assert len(load_rows(paths[:1])) == 13
  with pytest.raises(ValueError, match=r"mix objectives \['grpo', 'reverse_kl'\]"):
    load_rows(paths)


def test_holdout_is_stable_and_excludes_baselines():
  assert not is_held_out("pair1", "baseline", 1.0)
  picks = [is_held_out("pair1", f"p{i}", 0.3) for i in range(200)]
  assert 0.2 < np.mean(picks) < 0.4 and picks == [is_held_out("pair1", f"p{i}", 0.3) for i in range(200)]


@pytest.mark.slow
def test_report_renders_every_given_section(tmp_path):
  results = tmp_path / "results.jsonl"
  results.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
  budget = build_budget(_rows(), tolerance=0.03, relative=False)
  (tmp_path / "budget.json").write_text(json.dumps(budget))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    path = report.build([str(results)], str(tmp_path / "report"), budget=str(tmp_path / "budget.json"))
  assert [str(w.message) for w in caught if issubclass(w.category, UserWarning)] == []  # e.g. an empty legend
  page = open(path).read()
  assert page.count("data:image/png;base64") == 2  # noise only: no quantization-per-pair figure
  for section in ("Quality vs mismatch", "Budget", "KV-cache capacity", "Not included", "No data for staleness",
                  "Not drawn (no data in the given results): quantization mismatch per pair"):
    assert section in page
  assert "Qwen3-8B" in page
  with pytest.raises(ValueError, match="does not exist"):
    report.build([str(tmp_path / "missing.jsonl")], str(tmp_path / "r2"))


def test_unbounded_pair_budget_borrows_the_pooled_one():
  from opd_jax.screening.admission import pick_budget
  own = {"budget": 0.004, "bounded": False}
  pooled = {"budget": 0.8, "bounded": True}
  source, chosen, note = pick_budget({"budgets": {"pair2": own, "pooled": pooled}}, "pair2")
  assert source == "pooled" and chosen is pooled and note == "pair2 lost nothing up to 0.004"
  bounded_own = {"budget": 0.1, "bounded": True}
  assert pick_budget({"budgets": {"pair2": bounded_own, "pooled": pooled}}, "pair2") == ("pair2", bounded_own, "")
  assert pick_budget({"budgets": {"pooled": pooled}}, "pair3") == ("pooled", pooled, "")
  with pytest.raises(ValueError, match="no budget for pair 'pair3'"):
    pick_budget({"budgets": {"pair2": own}}, "pair3")


def _write_rows(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def _captured_figures(monkeypatch):
  """The report's figures by file name, kept after they are saved."""
  figures, save = {}, plots._save
  monkeypatch.setattr(plots, "_save", lambda fig, path: figures.setdefault(os.path.basename(path), fig) and
                      save(fig, path))
  return figures


def _axis(fig, title):
  return next(ax for ax in fig.axes if title in ax.get_title())


def _plotted(ax):
  """Artists on ax that hold data points (lines, scatter collections, bars)."""
  from matplotlib.collections import PathCollection
  lines = [line for line in ax.get_lines() if len(line.get_xdata())]
  return lines + [c for c in ax.collections if isinstance(c, PathCollection) and len(c.get_offsets())] + \
      list(ax.patches)


def test_report_says_no_data_instead_of_drawing_empty_panels(tmp_path, monkeypatch):
  """Rows without staleness or quantization runs: those panels say 'no data' (no axes scale, no legend, no points),
  the main legend lists no source without points, and matplotlib warns about no empty legend."""
  figures = _captured_figures(monkeypatch)
  results = _write_rows(tmp_path / "results.jsonl", _rows())
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    page = open(report.build([results], str(tmp_path / "report"))).read()
  assert [str(w.message) for w in caught if issubclass(w.category, UserWarning)] == []
  assert set(figures) == {"quality_vs_mismatch.png", "mismatch_sources.png"}
  assert not os.path.exists(tmp_path / "report" / "quantization_per_pair.png")
  assert "No data for staleness, quantization" in page and "quantization mismatch per pair" in page
  sources = figures["mismatch_sources.png"]
  for title in ("staleness", "quantization"):
    ax = _axis(sources, title)
    assert _plotted(ax) == [] and ax.get_legend() is None
    assert any(t.get_text().startswith("no data") for t in ax.texts)
  noise = _axis(sources, "noise")
  assert [t.get_text() for t in noise.get_legend().get_texts()] == ["pair1"] and _plotted(noise)
  labels = [t.get_text() for t in figures["quality_vs_mismatch.png"].axes[0].get_legend().get_texts()]
  assert "baseline" in labels and "noise" in labels and "pair1" in labels
  assert not {"staleness", "quantization", "combined", "pair2", "pair3"} & set(labels)


def _quantized(seed, pair):
  """_rows plus one int4 point whose k3 and accuracy move with the seed."""
  rows = _rows(seed, pair)
  k3 = (0.075 if pair == "pair1" else 0.13) * (1 + 0.1 * seed)
  rows.append({**rows[1], "point": "w_int4", "rollout": {"weights": "int4"}, "final_accuracy": 0.79 - 0.01 * seed,
               "best_accuracy": 0.79, "mismatch": {"mismatch/k3": k3}})
  return [{**r, "seed": seed, "steps": 150, "learning_rate": 1e-3} for r in rows]


def test_report_draws_magnitudes_as_points_with_seed_spread_and_every_pair(tmp_path, monkeypatch):
  """Log axes carry markers, never bars; every pair's quantization point is drawn, with a legend; three seeds of
  one configuration are one marker at the seed mean with the 95% t-interval of that mean as error bars."""
  from matplotlib.container import BarContainer, ErrorbarContainer
  from opd_jax.experiments.intervals import T_INTERVAL, t_interval
  figures = _captured_figures(monkeypatch)
  paths = [_write_rows(tmp_path / f"{pair}_{seed}.jsonl", _quantized(seed, pair))
           for pair in ("pair1", "pair2") for seed in range(3)]
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    page = open(report.build(paths + paths[:1], str(tmp_path / "report"))).read()  # a file given twice counts once
  assert [str(w.message) for w in caught if issubclass(w.category, UserWarning)] == []
  assert page.count("data:image/png;base64") == 3
  for fig in figures.values():
    for ax in fig.axes:
      if "log" in (ax.get_xscale(), ax.get_yscale()):
        assert not any(isinstance(c, BarContainer) for c in ax.containers), ax.get_title()
      if _plotted(ax) and ax.get_title() != "":
        assert ax.get_legend() is not None, ax.get_title()
  for fig, title in ((figures["mismatch_sources.png"], "quantization"),
                     (figures["quantization_per_pair.png"], "quantization mismatch per pair")):
    ax = _axis(fig, title)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["pair1", "pair2"]
    assert T_INTERVAL in ax.get_title() + ax.get_ylabel() + fig.get_suptitle()
    pair2 = [0.13 * (1 + 0.1 * s) for s in range(3)]
    markers = {round(float(y), 6) for line in ax.get_lines() if not line.get_label().startswith("_")
               for y in line.get_ydata()}  # the series, not the error bars' caps
    assert round(float(np.mean(pair2)), 6) in markers and round(pair2[0], 6) not in markers
    spans = [tuple(seg[:, 1]) for c in ax.containers if isinstance(c, ErrorbarContainer)
             for seg in c.lines[2][0].get_segments()]
    assert any(np.allclose(span, t_interval(pair2)) for span in spans)
  quality = figures["quality_vs_mismatch.png"].axes[0]
  points = [c for c in quality.containers if isinstance(c, ErrorbarContainer)]
  assert len(points) == 2 * 14  # one marker per pair and point (13 + w_int4), not one per seed
  assert all(c.has_yerr and c.has_xerr for c in points)  # every configuration here ran with 3 seeds
  assert T_INTERVAL in quality.figure.get_suptitle()


def test_rules_comparison_tells_per_pair_budgets_from_pooled_and_constants():
  """compare_with_rules on a made-up validation where the rules disagree. The budget file's per-pair test chose
  the pooled budget (0.5), so the shipped rule (rows judged by validation.judge, admit.py's function) gets one of
  three right; per-pair budgets (pair1 0.1, pair2 1.0), the labelled counterfactual, all three; reject-all two,
  admit-all one; no constant threshold gets all three, because pair1's harmful point measures below pair2's
  harmless one."""
  from study.analysis.validation import ORACLE, PER_PAIR, SHIPPED, compare_with_rules, judge
  entry = lambda b: {"budget": b, "tolerance_abs": 0.05, "interval": [b, b], "bootstrap_budgets": [b], "bounded": True}
  budget_file = {"scale": "k3", "budgets": {"pooled": entry(0.5), "pair1": entry(0.1), "pair2": entry(1.0)},
                 "per_pair_test": {"decision": "pooled", "file": "t.json"}}

  def row(pair, measured, losses):
    r = {"pair": pair, "measured": measured, "quality_loss": sum(losses) / len(losses),
         "seeds": [{"seed": i, "quality_loss": q} for i, q in enumerate(losses)]}
    return {**r, **judge(r, budget_file)}

  rows = [row("pair1", 0.3, [0.08, 0.09]), row("pair2", 0.6, [0.01, 0.07]), row("pair2", 2.0, [0.2, 0.3])]
  assert [r["budget_source"] for r in rows] == ["pooled"] * 3 and [r["admit"] for r in rows] == [True, False, False]
  compared = compare_with_rules({"rows": rows, "budget": budget_file})
  agreed = {rule: e["agreed"] for rule, e in compared["rules"].items()}
  assert agreed == {SHIPPED: 1, "reject all": 2, "admit all": 1, PER_PAIR: 3, ORACLE: 2}
  assert "counterfactual" in PER_PAIR and "oracle" in ORACLE
  # Two separate threshold ranges score 2 (reject all, or admit up to pair2's 0.6); the ones between score 1.
  assert compared["rules"][ORACLE]["thresholds"] == [[0.0, 0.3], [0.6, 2.0]]
  seeds = compared["seed_level"]  # shares per configuration 0/2, 1/2, 2/2: a t-interval over the 3 of them
  assert (seeds["agreed"], seeds["n"]) == (3, 6) and seeds["interval"] == [0.0, 1.0]
  assert compared["straddling"] == 1


def test_admission_and_run_mean_k3_side_by_side():
  """Ratios of the two k3 quantities, their geometric mean and spread, the out-of-sample residual once each row
  is divided by the factor its budget carried, and the verdicts that conversion changed: a point measured at 0.9
  against a 0.8 budget is rejected unconverted but admitted once divided by its 2x factor; rows without a run k3
  are left out."""
  import math
  from study.analysis.validation import admission_vs_run_k3
  rows = [{"pair": "pair1", "point": "a", "measured": 0.9, "compared": 0.45, "k3_factor": 2.0, "run_k3": 0.45,
           "budget": 0.8, "admit": True},
          {"pair": "pair1", "point": "b", "measured": 4.0, "compared": 2.0, "k3_factor": 2.0, "run_k3": 2.0,
           "budget": 0.8, "admit": False},
          {"pair": "pair2", "point": "c", "measured": 0.2, "compared": 0.05, "k3_factor": 4.0, "run_k3": 0.1,
           "budget": 0.8, "admit": True},
          {"pair": "pair2", "point": "d", "measured": 0.5, "run_k3": None, "budget": 0.8, "admit": True}]
  compared = admission_vs_run_k3({"rows": rows})
  assert compared["n"] == 3 and [r["ratio"] for r in compared["rows"]] == [2.0, 2.0, 2.0]
  assert math.isclose(compared["geo_mean"], 2.0) and math.isclose(compared["geo_sd"], 1.0)
  assert [r["residual"] for r in compared["rows"]] == [1.0, 1.0, 0.5] and compared["converted"]
  assert math.isclose(compared["residual_geo_mean"], 0.5 ** (1 / 3))
  assert compared["flips"] == 1
  assert admission_vs_run_k3({"rows": rows[3:]}) == {"n": 0, "rows": []}


def test_the_k3_conversion_is_measured_per_pair_and_admission_divides_by_it():
  """budget.json's k3_conversion: the geometric mean of admission k3 / run-mean k3 over the calibration points,
  per pair (pooled for a pair without points), and admission compares the step-0 k3 divided by it. A point
  measured at 1.5x the budget is admitted on pair1, whose step-0 k3 runs 2x its run mean."""
  from opd_jax.errors import InputError
  from opd_jax.screening import admission, k3_conversion

  def rows(seed, pair):
    return [{**r, "steps": 150, "overrides": {"rollout.noise_sigma": r["rollout"].get("noise_sigma", 0.0)}}
            for r in _rows(seed, pair)]

  calibration = rows(0, "pair1") + rows(1, "pair2")
  ratio = {"pair1": 2.0, "pair2": 0.5}
  measured = [{"pair": r["pair"], "point": r["point"], "overrides": r["overrides"],
               "admission_k3": ratio[r["pair"]] * r["mismatch"]["mismatch/k3"]}
              for r in calibration if r["point"] != "baseline"]
  budget = build_budget(calibration, tolerance=0.03, relative=False, admission_k3=measured)
  entry = budget["k3_conversion"]["by_steps"]["150"]
  assert entry["pair1"]["factor"] == pytest.approx(2.0) and entry["pair1"]["interval"] == pytest.approx([2.0, 2.0])
  assert entry["pair2"]["factor"] == pytest.approx(0.5) and entry["pooled"]["factor"] == pytest.approx(1.0)
  assert entry["pooled"]["n"] == 24 and entry["pooled"]["geo_sd"] > 1.5  # the pairs disagree: a wide spread
  assert "divides it by k3_conversion" in budget["scale_measured_as"]
  assert k3_conversion.factor_for(budget, "pair3", 150)[0] == pytest.approx(1.0)  # no points: pooled
  assert "pooled" in k3_conversion.factor_for(budget, "pair3", 150)[1]
  limit = budget["budgets"]["pair1"]["budget"]
  result = admission.admit({"k3": 1.5 * limit}, budget, "pair1", 150)
  assert result["admit"] and result["measured"] == pytest.approx(1.5 * limit)
  assert result["compared"] == pytest.approx(0.75 * limit) and result["k3_factor"] == pytest.approx(2.0)
  assert len(entry["pair1"]["bootstrap_factors"]) == len(budget["budgets"]["pair1"]["bootstrap_budgets"])
  # The confidence counts joint draws of budget and factor: a factor that is 1 in half the draws (where 1.5x the
  # budget is rejected) and 4 in the other half (admitted) halves it.
  uncertain = json.loads(json.dumps(budget))
  uncertain["k3_conversion"]["by_steps"]["150"]["pair1"]["bootstrap_factors"] = [1.0, 4.0] * 500
  assert admission.admit({"k3": 1.5 * limit}, uncertain, "pair1", 150)["confidence"] == pytest.approx(0.5, abs=0.05)
  assert result["confidence"] > 0.9
  empty = {**budget, "k3_conversion": {**budget["k3_conversion"], "by_steps": {}}}  # no point had a k3: unconverted
  assert admission.admit({"k3": 1.5 * limit}, empty, "pair1", 150)["k3_factor"] == 1.0
  unconverted = {k: v for k, v in budget.items() if k != "k3_conversion"}
  assert not admission.admit({"k3": 1.5 * limit}, unconverted, "pair1", 150)["admit"]
  assert k3_conversion.factor_for(unconverted, "pair1", 150) == (1.0, "admission k3 compared unconverted (the "
                                                                     "budget file has no k3_conversion)")
  from opd_jax.experiments.admission_k3 import distinct_points  # what launch/admission_k3.py measures: one row
  again = [{**r, "seed": 1, "steps": 75} for r in calibration]  # per configuration, over seeds and run lengths
  assert [(r["pair"], r["point"]) for r in distinct_points(calibration + again)] == \
         [(m["pair"], m["point"]) for m in measured]
  with pytest.raises(InputError, match=r"no measurement of calibration point\(s\) \['pair2/noise_3'\]"):
    build_budget(calibration, tolerance=0.03, relative=False,
                 admission_k3=[m for m in measured if (m["pair"], m["point"]) != ("pair2", "noise_3")])


def test_validation_reads_the_real_pairs_quality_and_judges_a_borrowed_budget_by_it():
  """Held-out rows of a reverse-KL budget: each seed's loss is its final reverse KL's rise over its own baseline's;
  a budget calibrated elsewhere (accuracy, tolerance 0.05 points) is judged by this pair's own tolerance when
  given one (the transfer question), by its own otherwise."""
  from study.analysis.validation import judge
  seeds = [_with(_kl_rows(s), seed=s, wall_seconds=1.0) for s in (3, 4)]
  grouped = {g["point"]: g for g in group_seeds([r for rows in seeds for r in rows], "reverse_kl")}
  top = grouped["noise_9"]
  rises = [(rows[-1]["final_reverse_kl"] - 0.8) / 0.8 for rows in seeds]
  assert top["quality"] == "reverse_kl" and top["quality_loss"] == pytest.approx(np.mean(rises))
  assert [s["final_reverse_kl"] for s in top["seeds"]] == [rows[-1]["final_reverse_kl"] for rows in seeds]
  borrowed = {"scale": "k3", "budgets": {"pooled": {"budget": 10.0, "interval": [5.0, 20.0],
                                                    "bootstrap_budgets": [5.0, 10.0, 20.0], "tolerance_abs": 0.05}}}
  row = {"pair": "smollm2", "measured": 3.0, "quality_loss": top["quality_loss"]}
  assert top["quality_loss"] > 0.1
  assert judge(row, borrowed)["admit"] and not judge(row, borrowed, tolerance=0.05)["real_ok"]
  assert not judge(row, borrowed, tolerance=0.05)["agree"] and judge(row, borrowed, tolerance=1.0)["agree"]
