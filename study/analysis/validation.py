"""Admission-check validation: admit held-out configurations with the shipped rule, compare with reality.

Held-out points are either, with `heldout` rows, configurations trained in separate sweeps, typically near the
budget and once per seed (configs/sweeps/boundary.py), judged with the budget file users run admission with
(`budget_file`, e.g. results/budget.json, its pre-registered decisions included); or every point (baselines
excluded) whose stable hash falls in `holdout_fraction`, judged with a budget fitted without them that carries
`budget_file`'s decisions. For each, the admission check measures its rollout configuration on a calibration batch
(no training) and `judge` gives the verdict with admission.admit_value, the function launch/admit.py applies; the
real verdict is whether its quality loss stayed within the tolerance - with seeds, the mean over seeds of its
accuracy drop against the same seed's baseline. Agreement is the share of held-out configurations where the two
verdicts match, with a 95% Wilson interval over configurations (few of them: the interval is the honest number).
`rejudge` re-judges a stored validation's measurements with another budget file, without measuring again.
"""

from __future__ import annotations

import hashlib
import math
import time

import numpy as np

from opd_jax.errors import InputError
from opd_jax.experiments.calibrate_report import build_budget
from opd_jax.experiments.files import file_hash
from opd_jax.experiments.intervals import cluster_interval, wilson_interval
from opd_jax.experiments.sweep import BASELINE, set_field
from opd_jax.mismatch import budget as budget_lib
from opd_jax.screening import admission

DECISIONS = ("per_pair_test", "horizon_test")  # the pre-registered decisions a budget file carries


def is_held_out(pair: str, point: str, fraction: float) -> bool:
  digest = hashlib.blake2b(f"{pair}/{point}".encode(), digest_size=8).digest()
  return point != BASELINE and int.from_bytes(digest, "little") / 2.0 ** 64 < fraction


def group_seeds(rows: list[dict], quality: str = "accuracy") -> list[dict]:
  """Held-out rows (already given deltas against their own sweep's baseline) grouped per (pair, point) over
  seeds: the seed-mean quality loss (budget_lib.QUALITIES[quality]: the accuracy drop, or the final reverse KL's
  rise as a fraction of the same seed's baseline) and each seed's numbers."""
  loss = budget_lib.QUALITIES[quality][1]
  groups: dict[tuple[str, str], list[dict]] = {}
  for row in rows:
    if budget_lib.has_quality(row, quality) and row["point"] != BASELINE:
      groups.setdefault((row["pair"], row["point"]), []).append(row)
  out = []
  for (pair, point), runs in groups.items():
    overrides = [r["overrides"] for r in runs]
    if any(o != overrides[0] for o in overrides):
      raise InputError(f"held-out point {pair}/{point} has different overrides in different results files: "
                       f"{overrides}; give each configuration one name")
    seeds = sorted(r.get("seed", 0) for r in runs)
    if len(set(seeds)) != len(seeds):
      raise InputError(f"held-out point {pair}/{point} appears twice with seed(s) {seeds}; pass each seed's "
                       "results once")
    runs = sorted(runs, key=lambda r: r.get("seed", 0))
    losses = [float(loss(r)) for r in runs]
    out.append({**runs[0], "quality_loss": float(np.mean(losses)), "quality": quality,
                "seeds": [{"seed": r.get("seed", 0), "quality_loss": q,
                           "final_accuracy": r["final_accuracy"], "run_k3": r["mismatch"].get("mismatch/k3"),
                           **({"final_reverse_kl": r["final_reverse_kl"]} if r.get("final_reverse_kl") is not None
                              else {})}
                          for r, q in zip(runs, losses)],
                "run_k3": float(np.mean([r["mismatch"].get("mismatch/k3", np.nan) for r in runs])),
                "wall_seconds": float(np.mean([r["wall_seconds"] for r in runs]))})
  return out


def judge(row: dict, budget_file: dict, tolerance: float | None = None) -> dict:
  """A held-out configuration (`pair`, `measured`: the admission check's value on the budget file's scale,
  `quality_loss`: the seed-mean loss, optional `steps`) judged as launch/admit.py judges it: admission.admit_value
  with `budget_file`; the real verdict is the loss against the chosen budget's tolerance, or against `tolerance`
  when given (a budget calibrated elsewhere judged by this pair's own quality measure: the transfer question)."""
  result = admission.admit_value(row["measured"], budget_file, row["pair"], row.get("steps"))
  limit = budget_file["budgets"][result["budget_source"]]["tolerance_abs"] if tolerance is None else tolerance
  real_ok = row["quality_loss"] <= limit
  return {"measured": result["measured"], "compared": result["compared"], "k3_factor": result["k3_factor"],
          "admit": result["admit"], "real_ok": bool(real_ok), "agree": result["admit"] == real_ok,
          "budget": result["budget"], "budget_source": result["budget_source"],
          "measured_over_budget": result["compared"] / result["budget"] if result["budget"] else math.inf}


def summary(rows: list[dict]) -> dict:
  agreed = sum(r["agree"] for r in rows)
  return {"agreement": agreed / len(rows), "agreement_interval": wilson_interval(agreed, len(rows)),
          "agreed": agreed, "n": len(rows)}


def rejudge(validation: dict, budget_file: dict, budget_path: str) -> dict:
  """`validation` (a stored validate() result) with every row judged again by `judge` with `budget_file` (read
  from `budget_path`), from the stored measurements: no measuring, no training."""
  rows = [{**r, **judge(r, budget_file)} for r in validation["rows"]]
  return {**validation, **summary(rows), "rows": rows, "budget": budget_file, "budget_file": budget_path,
          "budget_sha256": file_hash(budget_path)}


def validate(rows: list[dict], load_pair_config, *, holdout_fraction: float, tolerance: float, relative: bool,
             num_prompts: int, budget_file: dict | None = None, seed: int = 0, heldout: list[dict] | None = None,
             seed_means: bool = False, admission_k3: list[dict] | None = None, log=print) -> dict:
  """`budget_file`: the budget file admission reads (required with `heldout`: the held-out points are judged
  with it; with the hash hold-out its pre-registered decisions go into the budget fitted without the held-out
  points). `admission_k3`: launch/admission_k3.py rows of the calibration points, for the hash hold-out's budget
  (its measured step-0 / run-mean k3 factor, opd_jax.screening.k3_conversion)."""
  from opd_jax.prepare.pair import prepare_pair
  from opd_jax.screening.calibration import Calibration
  from opd_jax.spec import screening_spec
  rows = [r for r in rows if r.get("status") == "ok" and "delta_final_accuracy" in r]
  if heldout:
    if budget_file is None:
      raise InputError("validating given held-out results needs the budget file admission uses (--budget)")
    held = group_seeds(heldout, budget_file.get("quality", "accuracy"))
    if not held:
      raise InputError("the held-out results have no finished point with a baseline")
    clash = sorted({f"{r['pair']}/{r['point']}" for r in rows for h in held
                    if (r["pair"], r["overrides"]) == (h["pair"], h["overrides"]) and r["point"] != BASELINE})
    if clash:
      raise InputError(f"held-out configuration(s) {', '.join(clash)} are also calibration points; validation "
                       "needs configurations the budget has not seen")
  else:
    held = [{**r, "quality_loss": -r["delta_final_accuracy"], "run_k3": r["mismatch"].get("mismatch/k3")}
            for r in rows if is_held_out(r["pair"], r["point"], holdout_fraction)]
    if not held:
      raise InputError(f"no sweep point falls in holdout_fraction={holdout_fraction}; raise it")
    keys = {(r["pair"], r["point"]) for r in held}
    decisions = {k: budget_file[k] for k in DECISIONS if budget_file and k in budget_file}
    budget_file = {**build_budget([r for r in rows if (r["pair"], r["point"]) not in keys], tolerance=tolerance,
                                  relative=relative, seed_means=seed_means, admission_k3=admission_k3),
                   **decisions}
  calibrations, out = {}, []
  for row in held:
    config = load_pair_config(row["pair"])
    for key, value in row["overrides"].items():
      set_field(config, key, value)
    prepare_pair(config)
    spec = screening_spec(config)
    if row["pair"] not in calibrations:
      calibrations[row["pair"]] = Calibration.from_spec(spec, num_prompts, seed)
    start = time.time()
    measured = admission.measure_candidate(calibrations[row["pair"]], spec, spec.rollout, seed)
    value = budget_lib.SCALES[budget_file["scale"]]({f"mismatch/{k}": v for k, v in measured.items()})
    verdict = judge({"pair": row["pair"], "measured": value, "quality_loss": row["quality_loss"],
                     "steps": row.get("steps")}, budget_file)
    out.append({"pair": row["pair"], "point": row["point"], "steps": row.get("steps"), **verdict,
                "quality_loss": row["quality_loss"], "run_k3": row["run_k3"],
                "seeds": row.get("seeds", [{"seed": row.get("seed", 0), "quality_loss": row["quality_loss"],
                                            "final_accuracy": row["final_accuracy"], "run_k3": row["run_k3"]}]),
                "wall_seconds": time.time() - start, "run_wall_seconds": row["wall_seconds"]})
    log(f"  {row['pair']}/{row['point']}: admission {'ADMIT' if verdict['admit'] else 'REJECT'} "
        f"(k3 {verdict['measured']:.3g} / {verdict['k3_factor']:.3g}, {verdict['measured_over_budget']:.2f}x the "
        f"{verdict['budget_source']} budget), real quality loss "
        f"{row['quality_loss']:+.3f} over {len(out[-1]['seeds'])} seed(s) -> "
        f"{'agree' if verdict['agree'] else 'DISAGREE'}")
  return {**summary(out), "holdout": "given" if heldout else f"hash {holdout_fraction:g}",
          "holdout_fraction": holdout_fraction, "tolerance": tolerance, "relative": relative,
          "admission_seconds_per_candidate": float(np.mean([r["wall_seconds"] for r in out])),
          "run_seconds_per_seed": float(np.mean([r["run_wall_seconds"] for r in out])),
          "rows": out, "budget": budget_file}


def compared(row: dict) -> float:
  """What admission compared with the budget: the step-0 k3 over the conversion factor (validation files made
  before the conversion compared the measured k3 itself)."""
  return row.get("compared", row["measured"])


SHIPPED = "admission check (the shipped rule: budget.json as launch/admit.py reads it)"
PER_PAIR = "per-pair budgets (counterfactual: the pre-registered test chose pooled)"
ORACLE = "best constant k3 threshold (oracle: chosen in hindsight)"
FITTED = "constant k3 threshold fitted on the calibration points only"


def compare_with_rules(validation: dict) -> dict:
  """The shipped admission rule's agreement (the rows' verdicts, `judge` with the validation's budget file) next to
  rules a skeptic would name on the same held-out configurations: reject all, admit all, per-pair budgets where
  the pre-registered test chose the pooled one (a labelled counterfactual: the same admit path on the budget file
  without that decision), and the best single k3 threshold in hindsight (an oracle, with the ranges of thresholds
  that score it); each with a 95% Wilson interval over configurations. Seed by seed (each seed's own quality loss
  against the tolerance, judged by the same admission verdict) the interval is over configurations too (seeds of
  one configuration are a cluster): a t-interval on the configurations' seed shares. Where the budget file holds
  its calibration points' admission k3, also the constant threshold fitted on those points alone
  (heldout.calibration_constant), and under "near" the same rules on the configurations whose compared k3 is
  within x/÷ heldout.NEAR of their budget. A validation that a trivial rule matches does not tell budgets
  apart."""
  rows, budget_file = validation["rows"], validation["budget"]
  n = len(rows)

  def entry(agreed: int, total: int) -> dict:
    return {"agreed": agreed, "n": total, "agreement": agreed / total if total else 0.0,
            "interval": wilson_interval(agreed, total), "interval_kind": "95% Wilson over configurations"}

  rules = {SHIPPED: entry(sum(r["agree"] for r in rows), n),
           "reject all": entry(sum(not r["real_ok"] for r in rows), n),
           "admit all": entry(sum(r["real_ok"] for r in rows), n)}
  if (budget_file.get("per_pair_test") or {}).get("decision") == "pooled":
    per_pair_file = {k: v for k, v in budget_file.items() if k != "per_pair_test"}
    rules[PER_PAIR] = entry(sum(judge(r, per_pair_file)["agree"] for r in rows), n)
  # The best constant threshold: admit iff compared <= t (the value admission compares with a budget; the
  # measured one where no conversion applies); only the order of the values matters.
  values = sorted({compared(r) for r in rows})
  cuts = [values[0] / 2] + [(a + b) / 2 for a, b in zip(values, values[1:])] + [values[-1] * 2]
  scores = [sum((compared(r) <= t) == r["real_ok"] for r in rows) for t in cuts]
  best = max(scores)
  ranges = []  # [low, high): the thresholds that score `best`, one range per run of winning cuts
  for i, score in enumerate(scores):
    if score == best:
      low, high = (values[i - 1] if i > 0 else 0.0), (values[i] if i < len(values) else math.inf)
      if ranges and ranges[-1][1] == low:
        ranges[-1][1] = high
      else:
        ranges.append([low, high])
  rules[ORACLE] = {**entry(best, n), "thresholds": ranges}
  from study.analysis import heldout
  try:  # needs the budget file's calibration points with their admission k3 (k3_conversion)
    threshold = heldout.calibration_constant(budget_file)["threshold"]
  except (InputError, KeyError):
    threshold = None
  if threshold is not None:
    rules[FITTED] = {**entry(sum((compared(r) <= threshold) == r["real_ok"] for r in rows), n),
                     "threshold": threshold}
  # The configurations where a verdict is hard: compared k3 within x/÷ heldout.NEAR of the budget it is judged by.
  near = [r for r in rows if 1 / heldout.NEAR <= compared(r) / r["budget"] <= heldout.NEAR]
  near_rules = {SHIPPED: entry(sum(r["agree"] for r in near), len(near)),
                "reject all": entry(sum(not r["real_ok"] for r in near), len(near)),
                "admit all": entry(sum(r["real_ok"] for r in near), len(near))}
  if threshold is not None:
    near_rules[FITTED] = entry(sum((compared(r) <= threshold) == r["real_ok"] for r in near), len(near))
  per_config, straddling = [], 0
  for r in rows:
    tolerance = budget_file["budgets"][r.get("budget_source", "pooled")]["tolerance_abs"]
    losses = [seed["quality_loss"] for seed in r["seeds"]]
    per_config.append((sum(r["admit"] == (loss <= tolerance) for loss in losses), len(losses)))
    straddling += min(losses) <= tolerance < max(losses)
  agreed, total = sum(a for a, _ in per_config), sum(t for _, t in per_config)
  seed_level = {"agreed": agreed, "n": total, "agreement": agreed / total,
                "interval": cluster_interval(*zip(*per_config)),
                "interval_kind": f"95% t-interval over the {n} configurations' seed shares (seeds are clusters)"}
  return {"rules": rules, "seed_level": seed_level, "straddling": straddling, "near": near_rules}


def admission_vs_run_k3(validation: dict) -> dict:
  """The two k3 quantities side by side on the held-out rows that have both: the admission check's (step 0, a
  calibration batch, the candidate's sampler against the unquantized learner) and the run's mean of
  `mismatch/k3` over its logged steps (seed mean), which is the quantity the budgets are calibrated on.
  Returns per-row ratios, their geometric mean and geometric standard deviation; with the conversion the budget
  carried (each row's `k3_factor`, fitted on calibration points only), the out-of-sample residual ratio
  (admission k3 / factor / run k3) and how many verdicts the conversion changed against comparing unconverted."""
  rows = [r for r in validation["rows"] if r.get("run_k3")]
  if not rows:
    return {"n": 0, "rows": []}

  def geo(values):
    logs = np.log(values)
    return float(np.exp(logs.mean())), float(np.exp(logs.std(ddof=1))) if len(values) > 1 else 1.0

  factor, spread = geo([r["measured"] / r["run_k3"] for r in rows])
  residual, residual_spread = geo([compared(r) / r["run_k3"] for r in rows])
  flips = sum((r["measured"] <= r["budget"]) != r["admit"] for r in rows)
  return {"n": len(rows), "geo_mean": factor, "geo_sd": spread, "residual_geo_mean": residual,
          "residual_geo_sd": residual_spread, "converted": any(r.get("k3_factor", 1.0) != 1.0 for r in rows),
          "flips": flips,
          "rows": [{"pair": r["pair"], "point": r["point"], "admission_k3": r["measured"], "run_k3": r["run_k3"],
                    "ratio": r["measured"] / r["run_k3"], "factor": r.get("k3_factor", 1.0),
                    "residual": compared(r) / r["run_k3"]} for r in rows]}
