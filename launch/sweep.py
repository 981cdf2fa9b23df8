"""Resumable sweep of short OPD runs: python launch/sweep.py --config=configs/sweeps/<name>.py --workdir=DIR

Writes DIR/results.jsonl (one row per point) and DIR/runs/<pair>/<point>/ (each run's metrics and checkpoints).
Rerun the same command to continue: finished points are skipped, failed ones retried.
"""

import os
import sys

from absl import flags
from ml_collections import config_flags

from launch import _cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Sweep config, e.g. configs/sweeps/quantization.py.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Sweep directory (default runs/sweep_<name>).")


def run() -> int:
  from configs import common
  from opd_jax.experiments.sweep import run_sweep
  from opd_jax.train.loop import train
  sweep = _CONFIG.value
  out = _WORKDIR.value or os.path.join("runs", f"sweep_{sweep.name}")
  rows = run_sweep(sweep, out, common.config_for, train)
  ok = [r for r in rows if r["status"] == "ok"]
  print(f"{len(ok)}/{len(rows)} points ok -> {out}/results.jsonl")
  for r in sorted(ok, key=lambda r: (r["pair"], r["mismatch"].get("mismatch/k3", 0.0))):
    print(f"  {r['pair']:<6} {r['point']:<22} k3 {r['mismatch'].get('mismatch/k3', 0.0):9.3g}  "
          f"final acc {r['final_accuracy']:.3f}  delta {r.get('delta_final_accuracy', float('nan')):+.3f}  "
          f"{r['wall_seconds']:.0f} s")
  failed = [r for r in rows if r["status"] != "ok"]
  for r in failed:
    print(f"  FAILED {r['pair']:<6} {r['point']:<22} {r.get('error', '')}", file=sys.stderr)
  if failed:
    print(f"{len(failed)} point(s) failed; rerun the same command to retry them", file=sys.stderr)
  return len(failed)


def main(argv):
  del argv
  _cli.log_devices()
  from opd_jax.train.preemption import Preempted
  try:
    failed = _cli.run_or_exit(run)
  except Preempted as e:  # the point checkpointed; the sweep stops (rerun the same command to resume it)
    print(f"sweep {e}", file=sys.stderr, flush=True)
    sys.exit(e.status)
  sys.exit(1 if failed else 0)


if __name__ == "__main__":
  _cli.run(main, required=("config",))
