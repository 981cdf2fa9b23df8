"""Host memory of a training run, measured and predicted, for the benchmark scripts (launch/bench/host_rss.py,
launch/bench/scale.py).

`run_guarded` runs launch/train.py (or any command) as a child and returns its own peak RSS (the kernel's
ru_maxrss of that child, exact, not a poll), killing it when it passes a memory cap or a timeout.
`predict_host_rss` asks launch/plan_memory.py --host_rss for the same config (opd_jax/planning/host_memory.py).
`write_row` keeps one row per run name in a JSONL results file, written whole (never a truncated file).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

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


def run_guarded(cmd: list[str], log_path: str, max_rss_bytes: int, timeout_s: float = 0,
                env: dict | None = None, cwd: str | None = None) -> dict:
  """Runs `cmd`, killing its process group when its RSS passes `max_rss_bytes` (or after `timeout_s`).

  Returns {"exit": code, "killed": reason or "", "peak_rss_bytes": ru_maxrss of that child, "wall_s": ...}.
  """
  start = time.time()
  with open(log_path, "w") as log:
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True)
  killed, done = [], threading.Event()

  def watch():
    while not done.wait(0.05):
      reason = ""
      if _rss_bytes(proc.pid) > max_rss_bytes:
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
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (ru_maxrss in KiB on Linux)
  except BaseException:  # e.g. Ctrl-C: the child runs in its own session, so end it here
    os.killpg(proc.pid, signal.SIGKILL)
    raise
  finally:
    done.set()
  watcher.join()
  proc.returncode = os.waitstatus_to_exitcode(status)
  return {"exit": proc.returncode, "killed": killed[0] if killed else "", "peak_rss_bytes": usage.ru_maxrss * 1024,
          "wall_s": time.time() - start}


def predict_host_rss(plan_memory_script: str, config_args: list[str], env: dict | None = None) -> dict:
  """launch/plan_memory.py --host_rss --json on a train command's --config arguments: the same run, planned."""
  plan = subprocess.run([sys.executable, plan_memory_script, *config_args, "--host_rss", "--json"],
                        capture_output=True, text=True, env=env)
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
