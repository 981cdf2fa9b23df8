"""Admission-check validation: calibrate on part of the sweep, admit the held-out points, compare with reality.

Held-out points are every point (baselines excluded) whose stable hash falls in `holdout_fraction`. For each,
the admission check measures its rollout configuration on a calibration batch (no training) and admits or
rejects it against the budget fitted without it; the real run's verdict is whether its quality loss stayed
within the tolerance. Agreement is the share of held-out points where the two verdicts match.
"""

from __future__ import annotations

import hashlib
import time

from opd_jax.analysis.calibrate_report import build_budget
from opd_jax.analysis.sweep import BASELINE, set_field
from opd_jax.errors import InputError
from opd_jax.screening import admission
from opd_jax.screening.calibration import Calibration
from opd_jax.rollout.config import RolloutConfig


def is_held_out(pair: str, point: str, fraction: float) -> bool:
  digest = hashlib.blake2b(f"{pair}/{point}".encode(), digest_size=8).digest()
  return point != BASELINE and int.from_bytes(digest, "little") / 2.0 ** 64 < fraction


def validate(rows: list[dict], load_pair_config, *, holdout_fraction: float, tolerance: float, relative: bool,
             num_prompts: int, seed: int = 0, log=print) -> dict:
  rows = [r for r in rows if r.get("status") == "ok" and "delta_final_accuracy" in r]
  held = [r for r in rows if is_held_out(r["pair"], r["point"], holdout_fraction)]
  if not held:
    raise InputError(f"no sweep point falls in holdout_fraction={holdout_fraction}; raise it")
  budget_file = build_budget([r for r in rows if r not in held], tolerance=tolerance, relative=relative)
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
    quality_loss = -row["delta_final_accuracy"]
    real_ok = quality_loss <= source["tolerance_abs"]
    out.append({"pair": row["pair"], "point": row["point"], "measured": result["measured"],
                "admit": result["admit"], "quality_loss": quality_loss, "real_ok": bool(real_ok),
                "agree": result["admit"] == real_ok, "run_k3": row["mismatch"].get("mismatch/k3"),
                "wall_seconds": time.time() - start, "run_wall_seconds": row["wall_seconds"]})
    log(f"  {row['pair']}/{row['point']}: admission {'ADMIT' if result['admit'] else 'REJECT'} "
        f"(k3 {result['measured']:.3g}), real quality loss {quality_loss:+.3f} -> "
        f"{'agree' if out[-1]['agree'] else 'DISAGREE'}")
  agreement = sum(r["agree"] for r in out) / len(out)
  return {"agreement": agreement, "holdout_fraction": holdout_fraction, "tolerance": tolerance,
          "relative": relative, "rows": out, "budget": budget_file}
