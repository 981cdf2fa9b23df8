"""Server processes (launch/serve_teacher.py, or a test's stand-in): started, their URL read from the line they
print ("serving ... at http://HOST:PORT/v1" on stderr), and always stopped."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

_URL = re.compile(r"serving .* at (http://[\w.\-:\[\]]+/v1)")


def start(args: list[str], *, cwd: str, env: dict | None = None, timeout_s: float = 180.0
          ) -> tuple[subprocess.Popen, str]:
  """(process, base URL) of `python ARGS` once it has printed its URL; its stderr keeps being drained (so it
  never blocks on a full pipe) into `process.stderr_lines`."""
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
