"""The admission check's k3 on every calibration point: the measurements behind budget.json's `k3_conversion`.

Each distinct configuration of a calibration sweep (baselines excepted) is measured as `launch/admit.py` would
measure it - its sampler on the pair's calibration batch, scored by the unquantized learner, at step 0 - and
written as one JSONL row per configuration. `opd_jax.screening.k3_conversion.fit` then sets these step-0 values
against the same points' run-mean k3 (the quantity the budgets are fitted on).
"""

from __future__ import annotations

import json
import time

from opd_jax.errors import InputError
from opd_jax.experiments.sweep import BASELINE, set_field
from opd_jax.prepare.pair import prepare_pair
from opd_jax.screening import admission, k3_conversion
from opd_jax.screening.calibration import Calibration
from opd_jax.spec import screening_spec


def distinct_points(rows: list[dict]) -> list[dict]:
  """One row per (pair, configuration) over finished non-baseline rows (seeds and run lengths share one)."""
  seen, out = set(), []
  for r in rows:
    if r.get("status") != "ok" or r["point"] == BASELINE:
      continue
    key = k3_conversion.point_key(r)
    if key not in seen:
      seen.add(key)
      out.append(r)
  if not out:
    raise InputError("the results have no finished non-baseline point to measure")
  return out


def _staleness(row: dict) -> int:
  return int(row["overrides"].get("rollout.staleness_steps", 0))


# The rollout fields admission.lagged_versions reads (the rest of a recipe does not change the learner's updates).
_LEARNER_ROLLOUT = ("rollout.temperature", "rollout.max_new_tokens")


def _learner_key(row: dict) -> str:
  """What a lagged run depends on: the pair and the overrides that change the learner's updates."""
  kept = {k: v for k, v in row["overrides"].items() if not k.startswith("rollout.") or k in _LEARNER_ROLLOUT}
  return json.dumps([row["pair"], sorted(kept.items())], default=str)


def measure(rows: list[dict], load_pair_config, *, num_prompts: int, seed: int = 0, log=print) -> list[dict]:
  """Admission k3 (step 0, `num_prompts` held-out prompts, sampling key `seed`) of every distinct point."""
  calibrations, lagged, out = {}, {}, []
  points = distinct_points(rows)
  for r in points:
    config = load_pair_config(r["pair"])
    if r["pair"] not in calibrations:  # the pair's own batch, before any override touches the config
      prepare_pair(config)
      calibrations[r["pair"]] = Calibration.from_spec(screening_spec(config), num_prompts, seed)
    for key, value in r["overrides"].items():
      set_field(config, key, value)
    start = time.time()
    spec = screening_spec(config)
    lag, key = spec.rollout.staleness_steps, _learner_key(r)
    if lag and key not in lagged:  # one lagged run serves every staleness point of the same learner (as screen's)
      lags = {_staleness(p) for p in points if _learner_key(p) == key} - {0}
      lagged[key] = admission.lagged_versions(calibrations[r["pair"]], spec, max(lags), seed, keep={0} | lags)
    measured = admission.measure_candidate(calibrations[r["pair"]], spec, spec.rollout, seed,
                                           lagged.get(key) if lag else None)
    out.append({"pair": r["pair"], "point": r["point"], "overrides": r["overrides"],
                "admission_k3": float(measured["k3"]), "prompts": num_prompts, "seed": seed,
                "seconds": time.time() - start})
    log(f"  {r['pair']}/{r['point']}: admission k3 {out[-1]['admission_k3']:.4g} ({out[-1]['seconds']:.1f} s)")
  return out
