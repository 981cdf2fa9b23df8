"""Shared bits of the launch scripts: device logging and the one-line error contract (exit code 2)."""

import sys


def quiet_logs() -> None:
  import os
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  from absl import logging
  logging.set_verbosity(logging.WARNING)  # orbax and jax log every checkpoint step at INFO


def log_devices() -> None:
  quiet_logs()
  import jax
  print(f"jax {jax.__version__}: {jax.device_count()} x {jax.devices()[0].platform} device(s)", file=sys.stderr)


def run_or_exit(fn):
  """Runs fn; a ValueError / FileNotFoundError (bad config or input) becomes one line on stderr + exit 2."""
  from opd_jax.models import CheckpointError
  try:
    return fn()
  except (ValueError, FileNotFoundError, CheckpointError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
