"""Admission check of a rollout configuration against a calibrated budget, without a training run.

  python launch/admit.py --config=configs/pair1.py [--budget=budget.json] [--weights=fp8] [--kv_cache=fp8]
      [--staleness=2] [--noise=SIGMA] [--config.rollout.weight_rules=...]
  python launch/admit.py --config=configs/pair1.py --budget=budget.json \
      --candidates="weights=fp8;weights=fp8,kv_cache=fp8;weights=int8,staleness=2" [--shape=qwen3-8b]

Prints ADMIT or REJECT with the measured mismatch, the budget, the margin and the confidence. The budgets are in
run-mean k3, so the step-0 k3 is divided by the budget file's measured factor (k3_conversion) before comparing.
With --candidates (a list, or a JSON / JSON-lines file; see opd_jax/screening/candidates.py) it screens them
all in one process and prints a ranked table: measured k3, verdict, margin, and the weight bytes and KV-cache
tokens each recipe gives at a real model shape (--shape, --device_memory_gb), admitted recipes first by KV
tokens, so the cheapest admitted recipe is on top.
With config.teacher_endpoint (a served teacher) it also measures the teacher side as the run's preflight does:
k3 of the served scores against config.teacher in this process on the calibration batch; above
served_teacher.preflight_max_k3 the run would be refused, so every candidate is rejected.
Exit code: 0 admit (with --candidates: at least one admitted), 1 reject (none), 2 bad input.
"""

import json
import sys
import time

from absl import flags
from ml_collections import config_flags

from launch import _cli
from opd_jax.errors import InputError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Pair config, e.g. configs/pair1.py.", lock_config=True)
_BUDGET = flags.DEFINE_string("budget", None, "budget.json from launch/calibrate.py; default: the config's "
                              "admission_budget (configs/smollm2.py names the real pair's own).")
_WEIGHTS = flags.DEFINE_string("weights", None, "Shorthand for --config.rollout.weights.")
_KV = flags.DEFINE_string("kv_cache", None, "Shorthand for --config.rollout.kv_cache.")
_STALENESS = flags.DEFINE_integer("staleness", None, "Shorthand for --config.rollout.staleness_steps.")
_NOISE = flags.DEFINE_float("noise", None, "Shorthand for --config.rollout.noise_sigma.")
_PROMPTS = flags.DEFINE_integer("prompts", 128, "Calibration prompts (held-out split).")
_SEED = flags.DEFINE_integer("seed", 0, "Calibration prompts and sampling key.")
_STEPS = flags.DEFINE_integer("steps", None, "Run length the candidate is for: picks the budget calibrated at the "
                              "nearest horizon (default: the config's train.steps).")
_JSON = flags.DEFINE_bool("json", False, "Also print the verdict as one JSON line.")
_CANDIDATES = flags.DEFINE_string("candidates", None, "Many candidates: 'a=1,b=2;c=3' or a JSON / JSONL file.")
_SHAPE = flags.DEFINE_string("shape", "qwen3-8b",
                             "--candidates: real shape for the memory columns (opd_jax.models.shapes).")
_DEVICE_GB = flags.DEFINE_float("device_memory_gb", 80.0, "--candidates: device memory for the KV-token column.")


def screen_candidates(start: float) -> bool:
  from opd_jax.experiments.files import read_budget
  from opd_jax.planning.plan_spec import GIB, resolve_model
  from opd_jax.rollout.config import RolloutConfig
  from opd_jax.screening import admission, candidates
  from opd_jax.screening.calibration import Calibration
  for value, flag in ((_WEIGHTS.value, "--weights"), (_KV.value, "--kv_cache"), (_STALENESS.value, "--staleness"),
                      (_NOISE.value, "--noise")):
    if value is not None:
      raise InputError(f"{flag} and --candidates do not mix; put {flag[2:]}=... into each candidate")
  if _DEVICE_GB.value <= 0:
    raise InputError(f"--device_memory_gb must be > 0, got {_DEVICE_GB.value:g}")
  if _PROMPTS.value < 1:
    raise InputError(f"--prompts={_PROMPTS.value} must be >= 1 (calibration prompts)")
  config = _CONFIG.value
  steps = run_steps(config)  # flags and config values first, then files
  listed = candidates.parse(_CANDIDATES.value)
  candidates.rollouts_for(RolloutConfig.from_config(config.rollout), listed)  # a bad one fails before measuring
  budget_file = read_budget(budget_path(config))
  admission.pick_budget(budget_file, config.pair, steps)
  shape = resolve_model(_SHAPE.value, "--shape")
  spec = spec_of(config)
  cal = Calibration.from_spec(spec, _PROMPTS.value, _SEED.value)
  teacher = teacher_side(cal, spec)
  setup = time.time() - start
  rows = candidates.screen(cal, spec, listed, budget_file, shape=shape, device_bytes=int(_DEVICE_GB.value * GIB),
                           seed=_SEED.value, steps=steps)
  if teacher is not None and not teacher["ok"]:
    for row in rows:
      row["admit"] = False
  print(candidates.format_table(rows, _SHAPE.value, _DEVICE_GB.value))
  print(budget_line(budget_file, config, steps))
  print(f"k3 is measured at step 0 and compared divided by the {rows[0]['conversion_note']}"
        if rows[0]["k3_factor"] != 1 else f"k3: {rows[0]['conversion_note']}")
  total = time.time() - start
  print(f"{len(rows)} candidates in {total:.1f} s: {setup:.1f} s start-up and calibration batch, "
        f"{(total - setup) / len(rows):.1f} s per candidate")
  if _JSON.value:
    print(json.dumps({"rows": rows, "teacher": teacher, "budget_file": budget_path(config), "setup_seconds": setup,
                      "total_seconds": total},
                     default=list))
  return any(r["admit"] for r in rows)


def budget_path(config) -> str:
  """--budget, else the config's admission_budget; an error when neither names one."""
  path = _BUDGET.value or config.get("admission_budget", "")
  if not path:
    raise InputError("no budget file: pass --budget=PATH (a launch/calibrate.py budget.json) or set the config's "
                     "admission_budget")
  return path


def budget_line(budget_file: dict, config, steps: int) -> str:
  """Which budget judged: its key in which file (and where the path came from), with pick_budget's note."""
  from opd_jax.screening import admission
  key, entry, note = admission.pick_budget(budget_file, config.pair, steps)
  source = "--budget" if _BUDGET.value else "the config's admission_budget"
  quality = budget_file.get("quality", "accuracy")
  return (f"budget: {key} ({entry['budget']:.3g}, quality {quality}) from {budget_path(config)} ({source})"
          + (f"; {note}" if note else ""))


def spec_of(config):
  """The run's spec, its pair prepared first (GGUF import / pruning, when the config says how)."""
  from opd_jax.prepare.pair import prepare_pair
  from opd_jax.spec import screening_spec
  prepare_pair(config)
  return screening_spec(config)


def teacher_side(cal, spec) -> dict | None:
  """The served teacher's k3 against config.teacher (None when the teacher is in process), printed as a line."""
  from opd_jax.screening.teacher_check import served_teacher_mismatch
  teacher = served_teacher_mismatch(cal, spec, _SEED.value)
  if teacher is not None:
    print(f"teacher {'ok' if teacher['ok'] else 'REFUSED'}  served at {teacher['endpoint']}: k3 {teacher['k3']:.3g} "
          f"against config.teacher in this process (repeat {teacher['repeat_k3']:.3g}) vs "
          f"served_teacher.preflight_max_k3={teacher['max_k3']:g}")
  return teacher


def run_steps(config) -> int:
  if _STEPS.value is not None and _STEPS.value < 1:
    raise InputError(f"--steps={_STEPS.value} must be >= 1 (the run length the candidate is for)")
  return _STEPS.value or config.train.steps


def run() -> bool:
  start = time.time()
  if _CANDIDATES.value is not None:
    return screen_candidates(start)
  from opd_jax.experiments.files import read_budget
  if _PROMPTS.value < 1:
    raise InputError(f"--prompts={_PROMPTS.value} must be >= 1 (calibration prompts)")
  config = _CONFIG.value
  with config.unlocked():
    for value, field in ((_WEIGHTS.value, "weights"), (_KV.value, "kv_cache"), (_STALENESS.value, "staleness_steps"),
                         (_NOISE.value, "noise_sigma")):
      if value is not None:
        config.rollout[field] = value
  from opd_jax.screening import admission
  from opd_jax.screening.calibration import Calibration
  from opd_jax.rollout.config import RolloutConfig
  rollout = RolloutConfig.from_config(config.rollout)  # flags and config values first, then files
  steps = run_steps(config)
  budget_file = read_budget(budget_path(config))  # checked before any measuring
  admission.pick_budget(budget_file, config.pair, steps)  # fail on a missing budget before any work
  spec = spec_of(config)
  cal = Calibration.from_spec(spec, _PROMPTS.value, _SEED.value)
  rollout.validate_for(cal.params)
  teacher = teacher_side(cal, spec)
  measured = admission.measure_candidate(cal, spec, rollout, _SEED.value)
  result = admission.admit(measured, budget_file, config.pair, steps)
  if teacher is not None:
    result["teacher"] = teacher
    result["admit"] = result["admit"] and teacher["ok"]
  result["wall_seconds"] = time.time() - start
  word = "ADMIT" if result["admit"] else "REJECT"
  source = result["budget_source"] + (f"; {result['budget_note']}" if result["budget_note"] else "")
  converted = (f" / {result['k3_factor']:.3g} = {result['compared']:.3g} as a run mean ({result['conversion_note']})"
               if result["k3_factor"] != 1 else "")
  print(f"{word}  {config.pair}: measured {result['scale']} {result['measured']:.3g}{converted} vs budget "
        f"{result['budget']:.3g} "
        f"[{result['interval'][0]:.3g}, {result['interval'][1]:.3g}] ({source}); margin "
        f"{result['margin']:+.0%}; confidence {result['confidence']:.0%}; {result['wall_seconds']:.1f} s"
        + ("; the served teacher fails the preflight" if teacher is not None and not teacher["ok"] else ""))
  print(budget_line(budget_file, config, steps))
  result["budget_file"] = budget_path(config)
  if _JSON.value:
    print(json.dumps({**result, "rollout": {k: v for k, v in dict(config.rollout).items()}}, default=list))
  return result["admit"]


def main(argv):
  del argv
  _cli.quiet_logs()
  admitted = _cli.run_or_exit(run)
  sys.exit(0 if admitted else 1)


if __name__ == "__main__":
  _cli.run(main, required=("config",))
