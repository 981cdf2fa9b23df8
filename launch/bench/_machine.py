"""What the benchmarks measure about the machine and the code they ran: this process's float32 matmul ceiling
and memory read bandwidth, and the machine / versions / commit a results row records.

Imported by the benchmark scripts beside it as `import _machine` (their own directory comes first on sys.path),
so launch/bench/compare.py can run them against another revision's library with this tree's helpers.
"""

import datetime
import os
import platform
import subprocess
import time


def machine_limits(repeats: int = 5) -> tuple[float, float]:
  """(float32 matmul GFLOP/s, memory read GB/s) reached by XLA on this machine in this process, best of
  `repeats`: a 2048^3 matmul, and a sum over 512 MiB (far beyond any cache)."""
  import jax
  import jax.numpy as jnp
  a = jnp.ones((2048, 2048), jnp.float32)
  big = jnp.ones((128 * 2**20,), jnp.float32)
  dot, total = jax.jit(lambda x: x @ x), jax.jit(jnp.sum)
  flops, read = [], []
  for _ in range(repeats):
    jax.block_until_ready(dot(a)), jax.block_until_ready(total(big))
    start = time.perf_counter()
    jax.block_until_ready(dot(a))
    flops.append(2 * 2048 ** 3 / (time.perf_counter() - start))
    start = time.perf_counter()
    jax.block_until_ready(total(big))
    read.append(big.nbytes / (time.perf_counter() - start))
  return max(flops) / 1e9, max(read) / 1e9


def provenance() -> dict:
  """machine (cpu model, cores, jax platform), versions, the commit of the opd_jax imported (+dirty when its
  package has uncommitted changes) and when the run started (rows of one run share it)."""
  import jax
  import opd_jax
  cpu = platform.processor()
  if os.path.exists("/proc/cpuinfo"):
    with open("/proc/cpuinfo") as f:
      cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
  versions = {"jax": jax.__version__}
  for name in ("torch", "transformers"):
    try:
      versions[name] = __import__(name).__version__
    except ImportError:
      pass
  root = os.path.dirname(os.path.dirname(os.path.abspath(opd_jax.__file__)))
  git = lambda *args: subprocess.run(["git", "-C", root, *args], capture_output=True, text=True).stdout.strip()
  dirty = "+dirty" if git("status", "--porcelain", "--", "opd_jax") else ""
  return {"machine": {"cpu": cpu, "cores": os.cpu_count(), "platform": jax.devices()[0].platform},
          "versions": versions, "commit": git("rev-parse", "--short=12", "HEAD") + dirty,
          "run_started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
