"""Admission-check validation: calibrate on part of the sweep, admit the held-out points, compare with reality.

Held-out points are either every point (baselines excluded) whose stable hash falls in `holdout_fraction`, or,
with `heldout` rows, configurations trained in separate sweeps, typically near the budget and once per seed
(configs/sweeps/boundary.py). For each, the admission check measures its rollout configuration on a
calibration batch (no training) and admits or rejects it against the budget fitted without it; the real
verdict is whether its quality loss stayed within the tolerance - with seeds, the mean over seeds of its
accuracy drop against the same seed's baseline. Agreement is the share of held-out configurations where the two
verdicts match, with a 95% Wilson interval (few configurations: the interval is the honest number).
"""

from __future__ import annotations

import hashlib
import math
import time

import numpy as np

from opd_jax.experiments.calibrate_report import build_budget
from opd_jax.experiments.sweep import BASELINE, set_field
from opd_jax.errors import InputError
from opd_jax.screening import admission
from opd_jax.screening.calibration import Calibration
from opd_jax.rollout.config import RolloutConfig


def is_held_out(pair: str, point: str, fraction: float) -> bool:
  digest = hashlib.blake2b(f"{pair}/{point}".encode(), digest_size=8).digest()
  return point != BASELINE and int.from_bytes(digest, "little") / 2.0 ** 64 < fraction


def wilson_interval(successes: int, n: int, z: float = 1.96) -> list[float]:
  """95% Wilson score interval of a binomial proportion (sound at 0 / n and n / n, unlike the normal one)."""
  if n == 0:
    return [0.0, 1.0]
  p = successes / n
  center = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return [0.0 if successes == 0 else max(0.0, center - half), 1.0 if successes == n else min(1.0, center + half)]


def group_seeds(rows: list[dict]) -> list[dict]:
  """Held-out rows (already given deltas against their own sweep's baseline) grouped per (pair, point) over
  seeds: the seed-mean quality loss and each seed's numbers."""
  groups: dict[tuple[str, str], list[dict]] = {}
  for row in rows:
    if row.get("status") == "ok" and "delta_final_accuracy" in row and row["point"] != BASELINE:
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
    losses = [-r["delta_final_accuracy"] for r in runs]
    out.append({**runs[0], "quality_loss": float(np.mean(losses)),
                "seeds": [{"seed": r.get("seed", 0), "quality_loss": -r["delta_final_accuracy"],
                           "final_accuracy": r["final_accuracy"], "run_k3": r["mismatch"].get("mismatch/k3")}
                          for r in sorted(runs, key=lambda r: r.get("seed", 0))],
                "run_k3": float(np.mean([r["mismatch"].get("mismatch/k3", np.nan) for r in runs])),
                "wall_seconds": float(np.mean([r["wall_seconds"] for r in runs]))})
  return out


def validate(rows: list[dict], load_pair_config, *, holdout_fraction: float, tolerance: float, relative: bool,
             num_prompts: int, seed: int = 0, heldout: list[dict] | None = None, seed_means: bool = False,
             admission_k3: list[dict] | None = None, log=print) -> dict:
  """`admission_k3`: launch/admission_k3.py rows of the calibration points; the budget then carries the measured
  step-0 / run-mean k3 factor and admission divides by it (opd_jax.screening.k3_conversion)."""
  rows = [r for r in rows if r.get("status") == "ok" and "delta_final_accuracy" in r]
  if heldout:
    held = group_seeds(heldout)
    if not held:
      raise InputError("the held-out results have no finished point with a baseline")
    clash = sorted({f"{r['pair']}/{r['point']}" for r in rows for h in held
                    if (r["pair"], r["overrides"]) == (h["pair"], h["overrides"]) and r["point"] != BASELINE})
    if clash:
      raise InputError(f"held-out configuration(s) {', '.join(clash)} are also calibration points; validation "
                       "needs configurations the budget has not seen")
    calibration_rows = rows
  else:
    held = [{**r, "quality_loss": -r["delta_final_accuracy"], "run_k3": r["mismatch"].get("mismatch/k3")}
            for r in rows if is_held_out(r["pair"], r["point"], holdout_fraction)]
    if not held:
      raise InputError(f"no sweep point falls in holdout_fraction={holdout_fraction}; raise it")
    keys = {(r["pair"], r["point"]) for r in held}
    calibration_rows = [r for r in rows if (r["pair"], r["point"]) not in keys]
  budget_file = build_budget(calibration_rows, tolerance=tolerance, relative=relative, seed_means=seed_means,
                             admission_k3=admission_k3)
  calibrations, out = {}, []
  for row in held:
    config = load_pair_config(row["pair"])
    for key, value in row["overrides"].items():
      set_field(config, key, value)
    if row["pair"] not in calibrations:
      calibrations[row["pair"]] = Calibration.from_config(config, num_prompts, seed)
    start = time.time()
    measured = admission.measure_candidate(calibrations[row["pair"]], config,
                                           RolloutConfig.from_config(config.rollout), seed)
    result = admission.admit(measured, budget_file, row["pair"], row.get("steps"))
    source = budget_file["budgets"][result["budget_source"]]
    real_ok = row["quality_loss"] <= source["tolerance_abs"]
    out.append({"pair": row["pair"], "point": row["point"], "measured": result["measured"],
                "compared": result["compared"], "k3_factor": result["k3_factor"], "admit": result["admit"], "quality_loss": row["quality_loss"], "real_ok": bool(real_ok),
                "agree": result["admit"] == real_ok, "budget": result["budget"],
                "measured_over_budget": result["compared"] / result["budget"] if result["budget"] else math.inf,
                "run_k3": row["run_k3"], "seeds": row.get("seeds", [{"seed": row.get("seed", 0),
                                                                      "quality_loss": row["quality_loss"],
                                                                      "final_accuracy": row["final_accuracy"],
                                                                      "run_k3": row["run_k3"]}]),
                "wall_seconds": time.time() - start, "run_wall_seconds": row["wall_seconds"]})
    log(f"  {row['pair']}/{row['point']}: admission {'ADMIT' if result['admit'] else 'REJECT'} "
        f"(k3 {result['measured']:.3g} / {result['k3_factor']:.3g}, {out[-1]['measured_over_budget']:.2f}x the "
        f"budget), real quality loss "
        f"{row['quality_loss']:+.3f} over {len(out[-1]['seeds'])} seed(s) -> "
        f"{'agree' if out[-1]['agree'] else 'DISAGREE'}")
  agreed = sum(r["agree"] for r in out)
  return {"agreement": agreed / len(out), "agreement_interval": wilson_interval(agreed, len(out)),
          "agreed": agreed, "n": len(out), "holdout": "given" if heldout else f"hash {holdout_fraction:g}",
          "holdout_fraction": holdout_fraction, "tolerance": tolerance, "relative": relative,
          "admission_seconds_per_candidate": float(np.mean([r["wall_seconds"] for r in out])),
          "run_seconds_per_seed": float(np.mean([r["run_wall_seconds"] for r in out])),
          "rows": out, "budget": budget_file}


def compared(row: dict) -> float:
  """What admission compared with the budget: the step-0 k3 over the conversion factor (validation files made
  before the conversion compared the measured k3 itself)."""
  return row.get("compared", row["measured"])


def compare_with_rules(validation: dict) -> dict:
  """The admission check's agreement next to what rules that measure less would score on the same held-out
  configurations: reject all, admit all, the pooled budget for every pair, and the best single k3 threshold in
  hindsight (with the ranges of thresholds that score it); and agreement seed by seed (each seed's own quality
  loss against the tolerance, judged by the same admission verdict) next to the seed-mean one. A validation
  that a trivial rule matches does not tell budgets apart."""
  rows, budgets = validation["rows"], validation["budget"]["budgets"]
  n = len(rows)
  pooled = budgets["pooled"]["budget"]

  def entry(agreed: int, total: int) -> dict:
    return {"agreed": agreed, "n": total, "agreement": agreed / total if total else 0.0,
            "interval": wilson_interval(agreed, total)}

  rules = {"admission check (per-pair budgets)": entry(sum(r["agree"] for r in rows), n),
           "reject all": entry(sum(not r["real_ok"] for r in rows), n),
           "admit all": entry(sum(r["real_ok"] for r in rows), n),
           "pooled budget for every pair": entry(sum((compared(r) <= pooled) == r["real_ok"] for r in rows), n)}
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
  rules["best constant k3 threshold (hindsight)"] = {**entry(best, n), "thresholds": ranges}
  seed_agreed = seed_total = straddling = 0
  for r in rows:
    tolerance = budgets.get(r["pair"], budgets["pooled"])["tolerance_abs"]
    losses = [seed["quality_loss"] for seed in r["seeds"]]
    seed_total += len(losses)
    seed_agreed += sum(r["admit"] == (loss <= tolerance) for loss in losses)
    straddling += min(losses) <= tolerance < max(losses)
  return {"rules": rules, "seed_level": entry(seed_agreed, seed_total), "straddling": straddling}


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
