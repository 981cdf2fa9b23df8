"""Runs launch scripts as real processes that skip the import of jax and the package.

  python tests/preloaded.py JOBS.json > RESULTS.json

JOBS.json is a list of {"argv": [script, args...] or ["-m", module, args...], "stdout": path, "stderr": path}. This process imports jax,
flax, optax and opd_jax once (without starting a backend: no array is made here), then forks one child per job,
at most --parallel at a time. Each child redirects its stdout / stderr to the job's files and runs the script as
`__main__`, the way `python script args...` (or `python -m module args...`) would; its exit status is what the script's process exits with. The
result is a list of {"returncode": int, "seconds": float} in job order (-9: killed after the job's timeout).

Why: the error-contract table has ~70 cases; each plain `python launch/x.py` spends ~2 s importing jax and the
package before it parses a flag, which made that table the slowest module of the suite. Forking from a process
that has imported them already keeps every case a process of its own (own exit code, own stderr, own files).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PATH = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]


def _preload() -> None:
  import jax  # noqa: F401
  import jax.numpy  # noqa: F401
  import flax.nnx  # noqa: F401
  import optax  # noqa: F401
  import ml_collections  # noqa: F401
  from absl import app, flags  # noqa: F401
  sys.path.insert(0, REPO)
  import opd_jax.train.loop  # noqa: F401
  import study.analysis.report  # noqa: F401
  import opd_jax.screening.admission  # noqa: F401


def _child(job: dict) -> None:
  """Never returns: becomes the script's process."""
  code = 1
  try:
    for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
      out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
      os.dup2(out, fd)
      os.close(out)
    os.chdir(REPO)
    argv = list(job["argv"])
    try:
      if argv[0] == "-m":  # as `python -m module` sets them: the folder it runs in first, argv[0] the module's file
        sys.path[:] = [REPO, *_PATH]
        sys.argv = [os.path.join(REPO, *argv[1].split(".")) + ".py", *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
      else:
        sys.argv = argv
        sys.path[:] = [os.path.dirname(os.path.abspath(sys.argv[0])), *_PATH]  # as `python script` sets it
        runpy.run_path(sys.argv[0], run_name="__main__")
      code = 0
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
      if e.code is not None and not isinstance(e.code, int):
        print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the interpreter would print it and exit 1
      traceback.print_exc()
      code = 1
  finally:
    try:
      sys.stdout.flush()
      sys.stderr.flush()
    finally:
      os._exit(code)


def main(jobs_file: str, parallel: int, timeout_s: float) -> list[dict]:
  with open(jobs_file) as f:
    jobs = json.load(f)
  _preload()
  sys.stdout.flush()
  sys.stderr.flush()
  results: list[dict | None] = [None] * len(jobs)
  running: dict[int, tuple[int, float]] = {}  # pid -> (job index, deadline)
  started: dict[int, float] = {}  # job index -> when it started
  pending = list(range(len(jobs)))
  while pending or running:
    while pending and len(running) < parallel:
      i = pending.pop(0)
      started[i] = time.monotonic()
      pid = os.fork()
      if pid == 0:
        _child(jobs[i])
      running[pid] = (i, started[i] + timeout_s)
    pid, status = os.waitpid(-1, os.WNOHANG)
    if pid == 0:
      for child, (i, deadline) in list(running.items()):
        if time.monotonic() > deadline:
          os.kill(child, 9)
      time.sleep(0.02)
      continue
    i, _ = running.pop(pid)
    results[i] = {"returncode": os.waitstatus_to_exitcode(status), "seconds": time.monotonic() - started[i]}
  return results


if __name__ == "__main__":
  import argparse
  parser = argparse.ArgumentParser()
  parser.add_argument("jobs")
  parser.add_argument("--parallel", type=int, default=2)
  parser.add_argument("--timeout_s", type=float, default=300)
  args = parser.parse_args()
  json.dump(main(args.jobs, args.parallel, args.timeout_s), sys.stdout)
