"""Host memory of a training run, measured and predicted, for the benchmark scripts (launch/bench/host_rss.py,
launch/bench/scale.py).

`run_guarded` runs launch/train.py (or any command) as a grandchild and returns its own peak RSS (the kernel's
ru_maxrss of that process, exact, not a poll), killing it when it passes a memory cap or a timeout. The command
is forked by a small Python process (`_SPAWN`), not by the caller: Linux carries the memory high-water mark of
the process a child was forked from into the child's ru_maxrss (exec keeps the larger), so a command started
straight from a pytest worker holding 2.7 GB reported 2.7 GB whatever it used.
`predict_host_rss` asks launch/plan_memory.py --host_rss for the same config (opd_jax/planning/host_memory.py).
`write_row` keeps one row per run name in a JSONL results file, written whole (never a truncated file).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from opd_jax.errors import InputError
from opd_jax.experiments.files import write_text


def _rss_bytes(pid: int) -> int:
  """Current resident memory of `pid` from /proc; 0 once it is gone."""
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return int(line.split()[1]) * 1024
  except (FileNotFoundError, ProcessLookupError, PermissionError):
    pass
  return 0


# argv: PEAK_FILE CMD...: fork + exec CMD, wait for it, write its ru_maxrss (bytes) to PEAK_FILE, exit with its code.
_SPAWN = """import os, sys
pid = os.fork()
if pid == 0:
  os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
  f.write(str(usage.ru_maxrss * 1024))
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


def _group_rss_bytes(pgid: int) -> int:
  """The largest current resident memory among the processes of group `pgid` (the spawner and the command)."""
  largest = 0
  for pid in os.listdir("/proc"):
    if pid.isdigit():
      try:
        if os.getpgid(int(pid)) == pgid:
          largest = max(largest, _rss_bytes(int(pid)))
      except (ProcessLookupError, PermissionError):
        pass
  return largest


def run_guarded(cmd: list[str], log_path: str, max_rss_bytes: int, timeout_s: float = 0,
                env: dict | None = None, cwd: str | None = None) -> dict:
  """Runs `cmd` (through `_SPAWN`), killing its process group when its RSS passes `max_rss_bytes` (or after
  `timeout_s`).

  Returns {"exit": code, "killed": reason or "", "peak_rss_bytes": ru_maxrss of `cmd`, "wall_s": ...}.
  """
  start = time.time()
  handle, peak_file = tempfile.mkstemp(prefix="peak_rss_")
  os.close(handle)
  os.remove(peak_file)  # the spawner writes it when the command ends
  with open(log_path, "w") as log:
    proc = subprocess.Popen([sys.executable, "-c", _SPAWN, peak_file, *cmd], stdout=log, stderr=subprocess.STDOUT,
                            cwd=cwd, env=env, start_new_session=True)
  killed, done, seen = [], threading.Event(), [0]

  def watch():
    while not done.wait(0.05):
      reason = ""
      seen[0] = max(seen[0], _group_rss_bytes(proc.pid))
      if seen[0] > max_rss_bytes:
        reason = f"RSS > {max_rss_bytes / 1e9:.1f} GB"
      elif timeout_s and time.time() - start > timeout_s:
        reason = f"timeout {timeout_s:.0f} s"
      if reason:
        killed.append(reason)
        try:
          os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
        return

  watcher = threading.Thread(target=watch, daemon=True)
  watcher.start()
  try:
    proc.wait()
  except BaseException:  # e.g. Ctrl-C: the child runs in its own session, so end it here
    os.killpg(proc.pid, signal.SIGKILL)
    raise
  finally:
    done.set()
  watcher.join()
  peak = seen[0]  # killed before the command ended: the largest RSS the watcher saw
  if os.path.exists(peak_file):
    with open(peak_file) as f:
      peak = int(f.read())
    os.remove(peak_file)
  return {"exit": proc.returncode, "killed": killed[0] if killed else "", "peak_rss_bytes": peak,
          "wall_s": time.time() - start}


def predict_host_rss(plan_memory_script: str, config_args: list[str], env: dict | None = None) -> dict:
  """launch/plan_memory.py --host_rss --json on a train command's --config arguments: the same run, planned."""
  plan = subprocess.run([sys.executable, plan_memory_script, *config_args, "--host_rss", "--json"],
                        capture_output=True, text=True, env=env)
  errors = [line[len("error: "):] for line in plan.stderr.splitlines() if line.startswith("error: ")]
  if plan.returncode == 2 and errors:  # bad input to the planner: the same config would not run either
    raise InputError(f"plan_memory.py: {errors[-1]}")
  if plan.returncode:
    raise RuntimeError(f"plan_memory failed:\n{plan.stderr[-3000:]}")
  return json.loads(plan.stdout.strip().splitlines()[-1])["host_rss"]


def write_row(path: str, row: dict) -> None:
  """Replaces (or adds) the row with row["name"] in the JSONL file at `path`, written whole."""
  rows = []
  if os.path.exists(path):
    with open(path) as f:
      rows = [json.loads(line) for line in f if line.strip()]
  rows = [r for r in rows if r.get("name") != row["name"]] + [row]
  write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
