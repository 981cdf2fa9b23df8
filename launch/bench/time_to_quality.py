"""Time to a held-out accuracy target: sync bf16 rollouts vs async fp8 rollouts, side by side.

  python launch/bench/time_to_quality.py --config=configs/pair1.py --target=0.75 [--workdir=DIR]
  XLA_FLAGS=--xla_force_host_platform_device_count=2 python launch/bench/time_to_quality.py ...  # 1 + 1

Runs (a) sync, colocated, bf16 weights + bf16 KV and (b) fp8 weights + fp8 KV + async (disaggregated when
there are >= 2 devices) until each reaches --target greedy accuracy, and prints the wall-clock time to target
of each (compilation included, evaluations excluded), their ratio, and each run's tokens/s and s/step. See
opd_jax/bench/time_to_quality.py. Writes DIR/time_to_quality.json.
"""

import tempfile

from absl import flags
from ml_collections import config_flags

from launch import _cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Pair config, e.g. configs/pair1.py.", lock_config=False)
_TARGET = flags.DEFINE_float("target", 0.75, "Held-out greedy accuracy both runs train to.")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 20, "Steps between evaluations (the resolution of the timing).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where the two runs go (default: a new temp dir).")


def main(argv):
  del argv
  _cli.quiet_logs()  # no backend in this process: each run is a child with the devices to itself
  from opd_jax.bench import time_to_quality
  root = _WORKDIR.value or tempfile.mkdtemp(prefix="opd_ttq_")
  results = _cli.run_or_exit(lambda: time_to_quality.run(_CONFIG.value, _TARGET.value, root, _EVAL_EVERY.value))
  print(f"{'run':<10} {'reached':>8} {'step':>6} {'accuracy':>9} {'time to target s':>17} {'tokens/s':>9} "
        f"{'s/step':>7}")
  for phase in time_to_quality.PHASES:
    r = results[phase]
    print(f"{phase:<10} {str(r['reached']):>8} {r['step']:>6} {r['accuracy']:>9.3f} {r['train_s']:>17.1f} "
          f"{r['tokens_per_s']:>9.0f} {r['step_s']:>7.3f}")
  speedup = results["speedup"]
  print(f"speedup (sync_bf16 / async_fp8 time to {_TARGET.value:.2f}): "
        + (f"{speedup:.2f}x" if speedup else "n/a (a run did not reach the target within train.steps)")
        + f" on {results['devices']} device(s); results in {root}/time_to_quality.json")


if __name__ == "__main__":
  _cli.run(main, required=("config",))
