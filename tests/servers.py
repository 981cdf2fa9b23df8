"""Server processes for tests, on 127.0.0.1 (opd_jax/serving/processes.py), always stopped."""

from __future__ import annotations

import contextlib
import os
import socket

from opd_jax.serving import processes
from opd_jax.serving.processes import stop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": os.environ["OPD_JAX_TEST_XLA_FLAGS"]}  # as conftest.py


def start(args: list[str], env: dict | None = None):
  """(process, base URL) of `python ARGS` run from the repository (in ENV unless `env` is given)."""
  return processes.start(args, cwd=REPO, env=env or ENV)


@contextlib.contextmanager
def running(args: list[str], env: dict | None = None):
  proc, url = start(args, env)
  try:
    yield proc, url
  finally:
    stop(proc)


def free_port() -> int:
  """A port of 127.0.0.1 that nothing listens on (just now)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def teacher(*flags: str):
  """launch/serve_teacher.py on a free port of 127.0.0.1 (a context manager yielding (process, URL))."""
  return running(["launch/serve_teacher.py", "--port=0", *flags])
