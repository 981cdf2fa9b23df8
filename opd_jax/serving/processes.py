"""Server processes (launch/serve_teacher.py, or a test's stand-in): started, their URL read from the line they
print ("serving ... at http://HOST:PORT/v1" on stderr), always stopped, and gone with the process that started
them (exit_with_parent) even when that one dies without stopping them (SIGKILL, a crash)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

_URL = re.compile(r"serving .* at (http://[\w.\-:\[\]]+/v1)")
PARENT_ENV = "OPD_JAX_EXIT_WITH_PARENT"  # set by start(): the pid whose death ends the server


def exit_with_parent(poll_s: float = 1.0) -> None:
  """If this process was started by start() (PARENT_ENV holds the starter's pid), SIGTERM itself (a graceful stop)
  once that process is gone, checked every `poll_s` seconds on a daemon thread: a server whose starter crashed or
  was killed does not outlive it holding memory and a port. A server started by hand (a shell, nohup) is left
  alone."""
  parent = os.environ.get(PARENT_ENV, "")
  if not parent.isdigit():
    return

  def watch():
    while os.getppid() == int(parent):
      time.sleep(poll_s)
    os.kill(os.getpid(), signal.SIGTERM)

  threading.Thread(target=watch, daemon=True, name="exit_with_parent").start()


def start(args: list[str], *, cwd: str, env: dict | None = None, timeout_s: float = 180.0
          ) -> tuple[subprocess.Popen, str]:
  """(process, base URL) of `python ARGS` once it has printed its URL; its stderr keeps being drained (so it
  never blocks on a full pipe) into `process.stderr_lines`. A server that calls exit_with_parent() stops once this
  process is gone."""
  env = {**(os.environ if env is None else env), PARENT_ENV: str(os.getpid())}
  proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  lines, found = [], []

  def drain():
    for line in proc.stderr:
      lines.append(line)
      match = _URL.search(line)
      if match and not found:
        found.append(match.group(1))

  threading.Thread(target=drain, daemon=True).start()
  proc.stderr_lines = lines
  deadline = time.time() + timeout_s
  while not found:
    if proc.poll() is not None or time.time() > deadline:
      stop(proc)
      raise RuntimeError(f"server {' '.join(args)} did not start: {''.join(lines)[-2000:]}")
    time.sleep(0.05)
  return proc, found[0]


def stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
  """SIGTERM (our server finishes the requests in flight and exits), then SIGKILL after `grace_s`."""
  if proc.poll() is None:
    proc.terminate()
    try:
      proc.wait(grace_s)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait(grace_s)
