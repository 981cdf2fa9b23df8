"""OPD training: python launch/train.py --config=configs/pair1.py [--workdir=DIR] [--config.x.y=v ...]

Writes DIR/metrics.jsonl, DIR/tensorboard/ and orbax checkpoints under DIR/checkpoints; rerunning with the
same workdir resumes. Exit code 2 on a config or input error (one line naming the culprit).

Multi-process (one process per host; DIR must be visible to all of them), e.g. two processes:
  python launch/train.py --config=... --config.distributed.coordinator=HOST0:8476 \
      --config.distributed.num_processes=2 --config.distributed.process_id=I      # I = 0 and 1
On Cloud TPU pod slices and SLURM, --config.distributed.coordinator=auto finds the rest itself.
"""

import os
import sys

from absl import flags
from ml_collections import config_flags

from launch import _cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/pair1.py[:runlocal].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<pair>).")


def main(argv):
  del argv
  config = _CONFIG.value
  missing = [section for section in ("pair", "train", "distributed") if section not in config]
  if missing:  # read below before the run's own checks
    _cli.fail(f"--config has no {missing[0]!r} field; build it on configs/common.py's base_config(pair), which "
              "carries every field")
  workdir = _WORKDIR.value or os.path.join("runs", config.pair)
  from opd_jax.train import malloc
  t = config.train
  # may start over, with the tunables in its environment
  _cli.run_or_exit(lambda: malloc.use_tunables(t.malloc_huge_pages, t.malloc_keep_freed, t.malloc_arena_max))
  from opd_jax.train import distributed
  _cli.run_or_exit(lambda: malloc.cap_arenas(t.malloc_arena_max))  # before jax starts its threads
  d = config.distributed
  _cli.run_or_exit(lambda: distributed.initialize(d.coordinator, d.num_processes, d.process_id))
  _cli.log_devices(workdir)
  from opd_jax.errors import TrainingStopped
  from opd_jax.train.loop import train
  from opd_jax.train.preemption import Preempted
  try:
    final = _cli.run_or_exit(lambda: train(config, workdir), log_dir=workdir)
  except TrainingStopped as e:
    _cli.fail(e, code=1)
  except Preempted as e:  # checkpointed at the step reached: one line, 128 + the signal's number
    print(e, file=sys.stderr, flush=True)
    sys.exit(e.status)
  if not final:  # no evaluation in this process: nothing was left to run, or stop_after_steps came first
    print(f"done: {workdir}/metrics.jsonl; " + ("stopped at train.stop_after_steps; rerun to go on"
                                                 if config.train.stop_after_steps else
                                                 f"the workdir already holds this run's {config.train.steps} steps"))
    return
  finished = config.train.export_dtype and config.train.steps and not config.train.stop_after_steps  # at the end
  exported = f"; student exported to {workdir}/export" if finished else ""
  print(f"done: {workdir}/metrics.jsonl; final held-out accuracy {final.get('eval/accuracy', float('nan')):.3f}"
        f"{exported}")


if __name__ == "__main__":
  _cli.run(main, required=("config",))
