"""Memory planner: does a teacher -> student OPD run fit the device? No GPU and no weights needed.

  python launch/plan_memory.py --config=configs/real/qwen3_1p7b_to_0p6b.py [--config.x.y=v ...] \
      [--devices=N] [--device_memory_gb=80] [--json] [--measure_rss] [--host_rss]

It plans exactly the run `launch/train.py --config=...` executes: the config becomes the run's RunSpec with the
same checks (the loop and the planner build their programs with the same functions, opd_jax/train/programs.py),
and any setting is changed the way a run's is, with `--config.x.y=v` overrides (for example
`--config.teacher=qwen3-8b --config.student=qwen3-1.7b --config.train.batch_size=32 --config.rollout.weights=fp8`).
config.teacher / config.student are HF checkpoint directories (their config.json) or shipped shape names
(opd_jax.models.shapes). Only planning's own settings are flags: --devices (default: the devices the config's
mesh and rollout placement name), --device_memory_gb. Compiles every program of the run with abstract shapes on
--devices simulated CPU devices and prints per-device argument / output / temp / alias / peak per program, the
resident bytes between programs, the verdict and the largest micro-batch that fits
(opd_jax/planning/memory_plan.py). --json prints one JSON object instead. --measure_rss also runs the train step
on real arrays on CPU and compares the prediction with the measured peak RSS (small configs only). --host_rss also
predicts the peak resident memory of the whole run on a CPU host (runtime + compile + device buffers + host
snapshots; opd_jax/planning/host_memory.py), at the cost of compiling the run's programs once more. Exit code 0
(fits or not), 2 on bad input.
"""

import json
import os
import sys

from absl import flags
from ml_collections import config_flags

from launch import _cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config to plan, e.g. configs/real/qwen3_8b_to_1p7b.py.",
                                          lock_config=True)
_MEMORY = flags.DEFINE_float("device_memory_gb", 80.0, "Memory of one device in GiB (2**30 bytes).")
_DEVICES = flags.DEFINE_integer("devices", None, "Simulated devices, all pools together (default: the devices the "
                                "config's mesh and rollout placement name).")
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object instead of the table.")
_MEASURE = flags.DEFINE_bool("measure_rss", False, "Also measure the train step's peak RSS on CPU (small configs).")
_HOST = flags.DEFINE_bool("host_rss", False, "Also predict the run's peak host RSS on CPU: compiles every program "
                          "at the run's settings in a child process (opd_jax/planning/host_memory.py).")


def _devices() -> int:
  """--devices, else what the config names; known before jax starts its backend (XLA_FLAGS is read then)."""
  from opd_jax.errors import InputError
  if _DEVICES.value is not None:
    if _DEVICES.value < 1:
      raise InputError(f"--devices must be an integer >= 1, got {_DEVICES.value}")
    return _DEVICES.value
  from opd_jax.rollout.config import RolloutConfig
  from opd_jax.spec import MeshSpec, devices_named
  return devices_named(MeshSpec.from_section(_CONFIG.value.mesh), RolloutConfig.from_config(_CONFIG.value.rollout))


def _tokenizer_dirs(spec) -> list[str]:
  """The tokenizers the run loads (the pair check reads both models' and config.tokenizer), where they exist."""
  pair = spec.pair
  return list(dict.fromkeys(d for d in (pair.teacher, pair.student, pair.tokenizer)
                            if d and os.path.isfile(os.path.join(d, "tokenizer_config.json"))))


def _print(plan, result, out: dict) -> None:
  from opd_jax.planning import plan_report
  print(f"teacher {plan.teacher.model_type} ({plan.teacher.num_params() / 1e6:,.1f}M params) -> student "
        f"{plan.student.model_type} ({plan.student.num_params() / 1e6:,.1f}M params)")
  print(plan_report.format_plan(result))
  if "host_rss" in out:
    host = out["host_rss"]
    print(f"host RSS on CPU: {host['peak_bytes'] / 1e9:.2f} GB = runtime {host['runtime_bytes'] / 1e9:.2f} + compile "
          f"{host['compile_bytes'] / 1e9:.2f} + device buffers {host['device_bytes'] / 1e9:.2f} + host snapshots "
          f"{host['snapshot_bytes'] / 1e9:.2f}")
  if "rss_check" in out:
    check = out["rss_check"]
    print(f"rss check: predicted {check['predicted_bytes'] / 2**20:.1f} MiB, measured "
          f"{check['measured_bytes'] / 2**20:.1f} MiB, relative error {check['relative_error']:+.1%}"
          + ("" if check["valid"] else " (INVALID: compilation set the peak RSS)"))


def run(devices: int) -> None:
  from opd_jax.planning import memory_plan as mp
  from opd_jax.planning import step_rss
  from opd_jax.planning.plan_spec import GIB, PlanSpec, shapes_of
  from opd_jax.spec import RunSpec
  # The config's own values are checked before a model is read (shapes_of runs last; errors name the field).
  spec = RunSpec.from_config(_CONFIG.value, device_count=devices, models=shapes_of)
  plan = PlanSpec(spec, *shapes_of(spec.pair), devices=devices, device_memory_bytes=int(_MEMORY.value * GIB))
  log = (lambda s: None) if _JSON.value else (lambda s: print(s, file=sys.stderr, flush=True))
  result = mp.plan_memory(plan, log=log)
  out = result.to_json()
  if _MEASURE.value:
    out["rss_check"] = step_rss.measure_train_step_rss(plan)
  if _HOST.value:
    from opd_jax.planning import host_memory
    log("  predicting host RSS: the run's imports and tokenizers, every program compiled at the run's settings")
    out["host_rss"] = host_memory.predict(result, _tokenizer_dirs(spec)).to_json()
  if _JSON.value:
    print(json.dumps(out))
  else:
    _print(plan, result, out)


def main(argv):
  del argv
  devices = _cli.run_or_exit(_devices)
  # Simulated devices must be configured before jax starts its backend (quiet_logs imports jax).
  flag = f"--xla_force_host_platform_device_count={devices}"
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  _cli.quiet_logs()
  _cli.run_or_exit(lambda: run(devices))


if __name__ == "__main__":
  _cli.run(main, required=("config",))
