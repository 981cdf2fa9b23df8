"""Server processes for tests, on 127.0.0.1 (opd_jax/serving/processes.py), always stopped."""

from __future__ import annotations

import contextlib
import os

from opd_jax.serving import processes
from opd_jax.serving.processes import stop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "OPD_JAX_COMPILATION_CACHE": "off"}


def start(args: list[str]):
  """(process, base URL) of `python ARGS` run from the repository."""
  return processes.start(args, cwd=REPO, env=ENV)


@contextlib.contextmanager
def running(args: list[str]):
  proc, url = start(args)
  try:
    yield proc, url
  finally:
    stop(proc)


def teacher(*flags: str):
  """launch/serve_teacher.py on a free port of 127.0.0.1 (a context manager yielding (process, URL))."""
  return running(["launch/serve_teacher.py", "--port=0", *flags])
