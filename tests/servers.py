"""Server processes for tests: started on 127.0.0.1, their URL read from the line they print, always stopped."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_URL = re.compile(r"serving .* at (http://127\.0\.0\.1:\d+/v1)")


def start(args: list[str], timeout_s: float = 180.0) -> tuple[subprocess.Popen, str]:
  """(process, base URL) of `python ARGS` once it prints its "serving ... at URL" line (stderr)."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "OPD_JAX_COMPILATION_CACHE": "off"}
  proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  lines, found = [], []

  def read():  # keeps draining stderr so the server never blocks on a full pipe
    for line in proc.stderr:
      lines.append(line)
      match = _URL.search(line)
      if match and not found:
        found.append(match.group(1))

  threading.Thread(target=read, daemon=True).start()
  deadline = time.time() + timeout_s
  while not found:
    if proc.poll() is not None or time.time() > deadline:
      stop(proc)
      raise RuntimeError(f"server {args} did not start: {''.join(lines)[-2000:]}")
    time.sleep(0.05)
  proc.stderr_lines = lines
  return proc, found[0]


def stop(proc: subprocess.Popen) -> None:
  """SIGTERM (the servers shut down gracefully), then SIGKILL after 30 s."""
  if proc.poll() is None:
    proc.terminate()
    try:
      proc.wait(30)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait(30)


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
