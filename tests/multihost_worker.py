"""One process of a test training run: python -m tests.multihost_worker TEACHER STUDENT WORKDIR DEVICES
[COORDINATOR NUM_PROCESSES PROCESS_ID]. Uses DEVICES simulated CPU devices; the run config is the tests' tiny
smoke run (configs.common shrink_for_local_run). With OPD_JAX_TEST_SIGTERM_AT=N this process sends itself a
SIGTERM while it samples step N + 1's rollouts, as a scheduler would, and holds that step for 3 s so the notice
spreads before the run ends; a preempted run prints its one line and exits with its status, as launch/train.py.
"""

import os
import sys

teacher, student, workdir, devices = sys.argv[1:5]
# Replaces the parent's flags: its compiler flags (tests/conftest.py), this process's own device count.
os.environ["XLA_FLAGS"] = (os.environ.get("OPD_JAX_TEST_XLA_FLAGS", "") +
                           f" --xla_force_host_platform_device_count={devices}").strip()
os.environ["JAX_PLATFORMS"] = "cpu"

from configs import common  # noqa: E402
from opd_jax.train import distributed  # noqa: E402
from opd_jax.train.loop import train  # noqa: E402
from opd_jax.train.preemption import Preempted  # noqa: E402
from opd_jax.train.rollouts import RolloutProducer  # noqa: E402

coordinator, num_processes, process_id = (sys.argv[5], int(sys.argv[6]), int(sys.argv[7])) if len(sys.argv) > 5 \
    else ("", 1, 0)
distributed.initialize(coordinator, num_processes, process_id)
import jax  # noqa: E402

print(f"processes={jax.process_count()} devices={jax.device_count()}", flush=True)
config = common.base_config("tiny")
common.shrink_for_local_run(config)
config.teacher, config.student = teacher, student
config.rollout.max_new_tokens = 12
config.rollout.weights = "int8"  # a mismatch knob, so the mismatch metrics are nonzero and compared too
config.train.progress_bar = False
config.train.eval_sampled = False  # fewer programs to compile; the sampled eval and the multi-process export
config.train.export_dtype = ""  # are covered by tests/test_train.py and tests/test_export.py
config.model.attention = "reference"  # as the other loop tests: fused attention / scanned layers are covered
config.model.scan_layers = False  # by tests/test_models.py, and compile 2x slower on XLA:CPU

if os.environ.get("OPD_JAX_TEST_SIGTERM_AT"):
  import signal
  import time
  produce, signal_at = RolloutProducer.produce, int(os.environ["OPD_JAX_TEST_SIGTERM_AT"])

  def preempting_produce(self, index, *args):
    if index == signal_at:
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(3)
    return produce(self, index, *args)
  RolloutProducer.produce = preempting_produce
try:
  train(config, workdir)
except Preempted as stopped:
  print(stopped, flush=True)
  sys.exit(stopped.status)
