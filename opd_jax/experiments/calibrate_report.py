"""Budget calibration as a command: per-pair and pooled budgets on every scale, written to budget.json."""

from __future__ import annotations

import numpy as np


from opd_jax.experiments.files import read_admission_k3, read_results, write_json
from opd_jax.experiments.sweep import check_one_objective, fill_deltas
from opd_jax.errors import InputError
from opd_jax.files import check_output_file
from opd_jax.mismatch import budget as budget_lib
from opd_jax.screening import k3_conversion

PRIMARY = "k3"


def load_rows(results_paths: list[str]) -> list[dict]:
  rows = []
  for path in results_paths:
    rows += fill_deltas(read_results(path))
  check_one_objective(rows)
  return rows


def horizon_key(pair: str, steps, main_steps) -> str:
  """budget.json key of a pair's budget at a run length: "pair1" at the main horizon, "pair1@75" otherwise."""
  return pair if steps == main_steps else f"{pair}@{steps}"


def main_horizon(rows: list[dict]):
  """The run length most rows have (the longest on a tie); None for rows that predate the `steps` field."""
  counts = {}
  for r in rows:
    counts[r.get("steps")] = counts.get(r.get("steps"), 0) + 1
  return max(counts, key=lambda h: (counts[h], h or 0))


# Which k3 the budgets are in (the admission check's is another: see docs/study.md, "Two k3 quantities").
SCALE_MEASURED_AS = ("run mean: the training step's mismatch/k3 averaged over a run's logged steps; the admission "
                     "check measures k3 once at step 0 on a calibration batch and compares it with these budgets "
                     "unconverted (their ratio on the held-out points: docs/study.md, two k3 quantities)")
SCALE_CONVERTED = ("run mean: the training step's mismatch/k3 averaged over a run's logged steps; the admission "
                   "check measures k3 once at step 0 on a calibration batch and divides it by k3_conversion's "
                   "factor (measured on these calibration points) before comparing it with these budgets")


QUALITY_FIELDS = ("delta_final_accuracy", "final_accuracy", "delta_final_reverse_kl", "final_reverse_kl")


def seed_mean_rows(rows: list[dict]) -> list[dict]:
  """One row per (pair, point, run length): the seed mean of its runs' mismatch and accuracy delta, with the runs
  kept as `seed_rows` (budget_lib.calibrate then bootstraps seeds within points). Runs of one point must share
  their overrides and differ in seed."""
  groups: dict[tuple, list[dict]] = {}
  for r in rows:
    groups.setdefault((r["pair"], r["point"], r.get("steps")), []).append(r)
  out = []
  for (pair, point, _), runs in groups.items():
    seeds = [r.get("seed", 0) for r in runs]
    if len(set(seeds)) != len(seeds) or any(r["overrides"] != runs[0]["overrides"] for r in runs):
      raise InputError(f"{pair}/{point}: its runs must share one configuration and differ in seed (seeds {seeds}); "
                       "pass each seed's results file once")
    keys = set.intersection(*(set(k for k, v in r["mismatch"].items() if isinstance(v, float)) for r in runs))
    # The quality fields are seed means too (a reverse-KL point's loss is its mean rise over its mean baseline).
    means = {k: float(np.mean([r[k] for r in runs])) for k in QUALITY_FIELDS
             if all(r.get(k) is not None for r in runs)}
    out.append({**runs[0], "mismatch": {k: float(np.mean([r["mismatch"][k] for r in runs])) for k in keys},
                **means, "seeds": sorted(seeds), "seed_rows": runs})
  return out


def build_budget(rows: list[dict], *, tolerance: float, relative: bool, other_scales: bool = True,
                 seed_means: bool = False, admission_k3: list[dict] | None = None, quality: str = "accuracy") -> dict:
  """Per-pair and pooled budgets (primary scale) plus the other scales' fits (`other_scales`), from finished
  sweep rows, at every run length (horizon) the rows have: a budget is calibrated by runs of one length and is
  for that length. `seed_means`: each point is the mean over its seeds (runs of one pair, point and length from
  several results files), with a bootstrap that resamples points and then seeds within them. `admission_k3`
  (launch/admission_k3.py rows for these points) adds `k3_conversion`, the factor admission divides by. `quality`:
  what a point loses against its baseline (budget_lib.QUALITIES)."""
  budget_lib.check_quality(quality, relative)
  scales = [s for s in budget_lib.SCALES if s != PRIMARY] if other_scales else []
  usable = [r for r in rows if budget_lib.has_quality(r, quality)]
  if seed_means:
    usable = seed_mean_rows(usable)
  main = main_horizon(usable) if usable else None
  horizons = sorted({r.get("steps") for r in usable}, key=lambda h: h or 0)
  budgets, others = {}, {}
  for h in horizons:
    at_h = [r for r in usable if r.get("steps") == h]
    pairs = sorted({r["pair"] for r in at_h})
    for name, subset in [*((p, [r for r in at_h if r["pair"] == p]) for p in pairs), ("pooled", at_h)]:
      if len(subset) < 3:
        continue
      key = horizon_key(name, h, main)
      budgets[key] = {**budget_lib.calibrate(subset, scale=PRIMARY, tolerance=tolerance, relative=relative,
                                             quality=quality), "steps": h}
      others[key] = {s: {k: v for k, v in budget_lib.calibrate(subset, scale=s, tolerance=tolerance,
                                                                 relative=relative, quality=quality).items()
                         if k in ("budget", "interval", "set_by", "bounded")} for s in scales}
  if not budgets:
    needs = (" and a final held-out reverse KL (a sweep records it with train.eval_sampled=True)"
             if quality == "reverse_kl" else "")
    raise InputError(f"no pair has >= 3 finished sweep points with a baseline{needs}")
  main_rows = [r for r in usable if r.get("steps") == main]
  pairs = sorted({r["pair"] for r in main_rows})
  per_pair = {p: budgets[p]["budget"] for p in pairs if p in budgets}
  transfer = {"per_pair_budgets": per_pair,
              "max_over_min": (max(per_pair.values()) / min(per_pair.values())
                               if len(per_pair) > 1 and min(per_pair.values()) > 0 else None),
              "matrix": transfer_matrix(main_rows, budgets, per_pair, tolerance, relative, quality)}
  conversion = k3_conversion.fit(usable, admission_k3, main) if admission_k3 is not None else None
  return {"scale": PRIMARY, "scale_measured_as": SCALE_CONVERTED if conversion else SCALE_MEASURED_AS,
          **({"k3_conversion": conversion} if conversion else {}), "quality": quality, "tolerance": tolerance,
          "tolerance_relative": relative, "steps": main,
          "horizons": horizons, "budgets": budgets, "other_scales": others, "transfer": transfer,
          "runs": [{"pair": r["pair"], "point": r["point"], "steps": r.get("steps"),
                    **({"seeds": r["seeds"]} if seed_means else {})} for r in usable],
          **({"seed_means": True} if seed_means else {})}


def transfer_matrix(rows: list[dict], budgets: dict, per_pair: dict, tolerance: float, relative: bool,
                    quality: str = "accuracy") -> dict:
  """matrix[A][B]: pair A's budget judging pair B's runs - how many of B's points it admits or rejects the way
  B's real quality loss says (admit = k3 <= budget A; real ok = loss <= tolerance, B's own baseline)."""
  matrix = {}
  for a in per_pair:
    matrix[a] = {}
    for b in per_pair:
      subset = [r for r in rows if r["pair"] == b]
      m = [budget_lib.SCALES[PRIMARY](r["mismatch"]) for r in subset]
      q, tol = budget_lib.quality_losses(subset, tolerance, relative, quality)
      agree = [(mi <= budgets[a]["budget"]) == (qi <= tol) for mi, qi in zip(m, q)]
      matrix[a][b] = {"agree": int(sum(agree)), "n": len(agree),
                      "wrongly_admitted": [r["point"] for r, mi, qi in zip(subset, m, q)
                                           if mi <= budgets[a]["budget"] and qi > tol],
                      "wrongly_rejected": [r["point"] for r, mi, qi in zip(subset, m, q)
                                           if mi > budgets[a]["budget"] and qi <= tol]}
  return matrix


def pair_test_entry(path: str) -> dict:
  """budget.json's `per_pair_test`: the pre-registered per-pair decision (study/pair_budgets.py) in short."""
  from opd_jax.experiments.files import read_json
  test = read_json(path, "per-pair test file")
  if test.get("decision") not in ("per_pair", "pooled"):
    raise InputError(f"--pair_test={path!r}: 'decision' is {test.get('decision')!r}, expected 'per_pair' or "
                     "'pooled'; make the file with study/pair_budgets.py")
  keys = ("decision", "rule", "outcome", "decision_point", "tolerance")
  missing = [k for k in keys if k not in test]
  if missing:
    raise InputError(f"--pair_test={path!r} lacks {missing}; make the file with study/pair_budgets.py")
  return {"file": path, **{k: test[k] for k in keys}}


def set_by_text(b: dict) -> str:
  """One line: what set a budget and the empty k3 range it lies in (budget_lib.how_set)."""
  s = b.get("set_by")
  if not s:
    return "set by: not recorded (a budget file made before set_by)"
  if "between" in s:
    what = "crossing between " + " and ".join(f"{p['point']} (k3 {p['mismatch']:.3g})" for p in s["between"])
  elif "knee" in s:
    what = f"hinge fit (knee {s['knee']:.3g}, slope {s['slope']:.3g})"
  else:
    what = f"largest mismatch tested ({s['point']['point']})"
  gap = s["empty_range"]
  if gap["ratio"] is not None:
    what += (f"; no calibration point between k3 {gap['below']['mismatch']:.3g} and {gap['above']['mismatch']:.3g} "
             f"({gap['ratio']:.1f}x)")
  return what


def horizon_test_entry(rows: list[dict], tolerance: float, seed_means: bool) -> dict:
  """budget.json's `horizon_test` (experiments/horizon.py) over the calibration rows; needs their seeds."""
  from opd_jax.experiments import horizon
  if not seed_means:
    raise InputError("--horizon_test needs --seed_means (the test reads each seed's run at every length)")
  return horizon.budget_entry(horizon.decide(rows, tolerance))


def run(results_paths: list[str], out: str, *, tolerance: float, relative: bool, holdout: list[str],
        pair_test: str | None = None, seed_means: bool = False, admission_k3: str | None = None,
        horizon_test: bool = False, quality: str = "accuracy") -> dict:
  budget_lib.check_quality(quality, relative)
  check_output_file(out, "--out", (*results_paths, pair_test, admission_k3), example="budget.json")
  if not 0 < tolerance < 1:
    raise InputError(f"--tolerance={tolerance:g} must be in (0, 1): accuracy points, with --relative a fraction "
                     "of the baseline accuracy (e.g. 0.02), with --quality=reverse_kl a fraction of the baseline's "
                     "reverse KL (e.g. 0.05)")
  if horizon_test and quality != "accuracy":
    raise InputError("--horizon_test judges accuracy losses; run it without --quality (or with --quality=accuracy)")
  pair_test_summary = pair_test_entry(pair_test) if pair_test else None  # a bad file fails before any work
  measurements = read_admission_k3(admission_k3) if admission_k3 else None
  rows = load_rows(results_paths)
  unknown = sorted(set(holdout) - {r["point"] for r in rows})
  if unknown:
    raise InputError(f"--holdout names points that are in no results file: {', '.join(unknown)}")
  rows = [r for r in rows if r["point"] not in holdout]
  horizon_summary = horizon_test_entry(rows, tolerance, seed_means) if horizon_test else None
  try:
    result = build_budget(rows, tolerance=tolerance, relative=relative, seed_means=seed_means,
                          admission_k3=measurements, quality=quality)
  except InputError as e:
    if "no pair has" not in str(e):
      raise
    read = ", ".join(f"{path} ({len(read_results(path))} rows)" for path in results_paths)
    raise InputError(f"{e} in {read}; a budget needs finished sweep points of one pair with their baseline "
                     "(launch/sweep.py writes them)") from None
  result.update(results=list(results_paths), holdout_points=holdout)
  if admission_k3:
    result["k3_conversion"]["file"] = admission_k3
  if pair_test_summary:
    result["per_pair_test"] = pair_test_summary
  if horizon_summary:
    result["horizon_test"] = horizon_summary
  budgets, other_scales, transfer = result["budgets"], result["other_scales"], result["transfer"]
  write_json(out, result)
  unit = "of baseline" if relative else budget_lib.QUALITIES[quality][2]
  print(f"budget on {PRIMARY} (quality {quality}, tolerance {tolerance:g} {unit}):")
  for key, b in budgets.items():
    lo, hi = b["interval"]
    name = f"{key} ({b['steps']} steps)" if b.get("steps") is not None else key
    note = "" if b["bounded"] else "  (no quality loss observed: budget = largest mismatch tested)"
    print(f"  {name:<18} {b['budget']:.3g}  90% interval [{lo:.3g}, {hi:.3g}]  n={len(b['points'])}{note}")
    print(f"           {set_by_text(b)}")
    for scale, s in other_scales[key].items():
      print(f"           {scale:<16} budget {s['budget']:.3g}")
  if transfer["max_over_min"] is not None:
    print(f"per-pair budgets differ by {transfer['max_over_min']:.2f}x (max / min)")
    for a, row in transfer["matrix"].items():
      cells = "  ".join(f"{b} {c['agree']}/{c['n']}" for b, c in row.items())
      print(f"  {a}'s budget judges: {cells}")
  for steps, entry in result.get("k3_conversion", {}).get("by_steps", {}).items():
    cells = "  ".join(f"{name} {f['factor']:.3g} [{f['interval'][0]:.3g}, {f['interval'][1]:.3g}] (n={f['n']})"
                      for name, f in entry.items())
    print(f"admission k3 / run-mean k3 at {steps} steps: {cells}")
  if pair_test:
    print(f"per-pair test ({pair_test}): admission uses {result['per_pair_test']['decision']} budgets")
  if horizon_summary:
    print(f"horizon test: {horizon_summary['decision']} ({horizon_summary['outcome']}); admission uses "
          f"{horizon_summary['used']}")
  print(f"wrote {out}")
  return result
