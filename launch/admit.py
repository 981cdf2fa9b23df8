"""Admission check of a rollout configuration against a calibrated budget, without a training run.

  python launch/admit.py --config=configs/pair1.py --budget=budget.json [--weights=fp8] [--kv_cache=fp8]
      [--staleness=2] [--noise=SIGMA] [--config.rollout.weight_rules=...]

Prints ADMIT or REJECT with the measured mismatch, the budget, the margin and the confidence.
Exit code: 0 admit, 1 reject, 2 bad input.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from launch import _cli  # noqa: E402
from opd_jax.errors import InputError  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Pair config, e.g. configs/pair1.py.", lock_config=True)
_BUDGET = flags.DEFINE_string("budget", None, "budget.json from launch/calibrate.py.")
_WEIGHTS = flags.DEFINE_string("weights", None, "Shorthand for --config.rollout.weights.")
_KV = flags.DEFINE_string("kv_cache", None, "Shorthand for --config.rollout.kv_cache.")
_STALENESS = flags.DEFINE_integer("staleness", None, "Shorthand for --config.rollout.staleness_steps.")
_NOISE = flags.DEFINE_float("noise", None, "Shorthand for --config.rollout.noise_sigma.")
_PROMPTS = flags.DEFINE_integer("prompts", 128, "Calibration prompts (held-out split).")
_SEED = flags.DEFINE_integer("seed", 0, "Calibration prompts and sampling key.")
_JSON = flags.DEFINE_bool("json", False, "Also print the verdict as one JSON line.")


def run() -> bool:
  start = time.time()
  from opd_jax.analysis.files import read_budget
  if _PROMPTS.value < 1:
    raise InputError(f"--prompts={_PROMPTS.value} must be >= 1 (calibration prompts)")
  budget_file = read_budget(_BUDGET.value)  # checked before any measuring
  config = _CONFIG.value
  with config.unlocked():
    for value, field in ((_WEIGHTS.value, "weights"), (_KV.value, "kv_cache"), (_STALENESS.value, "staleness_steps"),
                         (_NOISE.value, "noise_sigma")):
      if value is not None:
        config.rollout[field] = value
  from opd_jax.screening import admission
  from opd_jax.screening.calibration import Calibration
  from opd_jax.rollout.config import RolloutConfig
  rollout = RolloutConfig.from_config(config.rollout)
  admission.pick_budget(budget_file, config.pair)  # fail on a missing budget before any work
  cal = Calibration.from_config(config, _PROMPTS.value, _SEED.value)
  rollout.validate_for(cal.params)
  measured = admission.measure_candidate(cal, config, rollout, _SEED.value)
  result = admission.admit(measured, budget_file, config.pair)
  result["wall_seconds"] = time.time() - start
  word = "ADMIT" if result["admit"] else "REJECT"
  source = result["budget_source"] + (f"; {result['budget_note']}" if result["budget_note"] else "")
  print(f"{word}  {config.pair}: measured {result['scale']} {result['measured']:.3g} vs budget {result['budget']:.3g} "
        f"[{result['interval'][0]:.3g}, {result['interval'][1]:.3g}] ({source}); margin "
        f"{result['margin']:+.0%}; confidence {result['confidence']:.0%}; {result['wall_seconds']:.1f} s")
  if _JSON.value:
    print(json.dumps({**result, "rollout": {k: v for k, v in dict(config.rollout).items()}}, default=list))
  return result["admit"]


def main(argv):
  del argv
  _cli.quiet_logs()
  admitted = _cli.run_or_exit(run)
  sys.exit(0 if admitted else 1)


if __name__ == "__main__":
  _cli.run(main, required=("config", "budget"))
