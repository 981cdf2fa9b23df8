"""glibc's malloc settings for a training process (Linux): the arena cap and transparent huge pages.

glibc gives each thread that contends for the heap an arena of its own, up to 8 per core, and memory a thread
frees stays in its arena, so how much freed memory a run keeps depends on thread timing. On pair1 (60 steps,
the same numbers every time, no compilation cache) capped runs peaked at 1.32-1.37 GB (four runs) and runs with
glibc's default at 1.35 and 1.46 GB (GB = 1e9 bytes), in the same time within this host's noise. A bounded retention is what
lets the planner predict host memory (opd_jax/planning/host_memory.py).
`cap_arenas` must run before jax starts its thread pools (launch/train.py calls it first).

Huge pages: XLA:CPU allocates a step's temporaries with malloc, and glibc serves every large block with a fresh
mmap, so each step page-faults its temporaries in 4 KiB at a time (the kernel zeroes every page). With glibc's
`glibc.malloc.hugetlb=1` tunable (glibc >= 2.35) malloc asks for transparent huge pages (madvise), and the real
pair's train step ran in 6.0 / 6.6 s against 10.1 / 9.3 s without it (launch/bench/learner.py --configs=smollm2,
runs interleaved ABBA, 2-core host; docs/benchmarks.md). Tunables are read when a process starts, so
`use_huge_pages` re-executes the launch script once with the tunable added (before jax is imported).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys

from opd_jax.errors import InputError

_M_ARENA_MAX = -8  # mallopt parameter number, from glibc's malloc.h


def cap_arenas(arenas: int) -> bool:
  """mallopt(M_ARENA_MAX, arenas); 0 keeps glibc's default. Returns whether the cap was set (False off glibc)."""
  if isinstance(arenas, bool) or not isinstance(arenas, int) or arenas < 0:
    raise InputError(f"train.malloc_arena_max must be an integer >= 0 (0 = glibc's default), got {arenas!r}")
  if not arenas:
    return False
  name = ctypes.util.find_library("c")
  try:
    mallopt = ctypes.CDLL(name).mallopt
  except (OSError, AttributeError, TypeError):  # not glibc (macOS, musl without mallopt)
    return False
  return bool(mallopt(_M_ARENA_MAX, arenas))


HUGETLB = "glibc.malloc.hugetlb=1"  # glibc tunable: malloc madvises transparent huge pages for its memory


def _glibc_at_least(major: int, minor: int) -> bool:
  name, version = platform.libc_ver()
  if name != "glibc" or not version:
    return False
  return tuple(int(x) for x in version.split(".")[:2]) >= (major, minor)


def use_huge_pages(enabled: bool) -> bool:
  """Re-executes this process (same interpreter and argv) with GLIBC_TUNABLES holding glibc.malloc.hugetlb=1,
  unless it is off, already set by the user (who then decides), or not glibc >= 2.35 on Linux. Returns whether
  the tunable is in effect; call it before jax is imported, since the process starts over."""
  if not isinstance(enabled, bool):
    raise InputError(f"train.malloc_huge_pages must be True or False, got {enabled!r}")
  tunables = os.environ.get("GLIBC_TUNABLES", "")
  if "glibc.malloc.hugetlb" in tunables:
    return HUGETLB in tunables.split(":")
  if not enabled or sys.platform != "linux" or not _glibc_at_least(2, 35):
    return False
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  if spec is not None:  # python -m package.module
    argv = [sys.executable, "-m", spec.name, *sys.argv[1:]]
  elif os.path.isfile(sys.argv[0]):  # python script.py
    argv = [sys.executable, *sys.argv]
  else:  # python -c / an embedded interpreter: nothing to start again
    return False
  os.environ["GLIBC_TUNABLES"] = ":".join(filter(None, (tunables, HUGETLB)))
  sys.stdout.flush(), sys.stderr.flush()
  os.execv(sys.executable, argv)
