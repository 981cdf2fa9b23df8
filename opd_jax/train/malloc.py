"""glibc's malloc arena cap for a training process (Linux).

glibc gives each thread that contends for the heap an arena of its own, up to 8 per core, and memory a thread
frees stays in its arena, so how much freed memory a run keeps depends on thread timing. On pair1 (60 steps,
the same numbers every time, no compilation cache) capped runs peaked at 1.32-1.37 GB (four runs) and runs with
glibc's default at 1.35 and 1.46 GB (GB = 1e9 bytes), in the same time within this host's noise. A bounded retention is what
lets the planner predict host memory (opd_jax/planning/host_memory.py).
`cap_arenas` must run before jax starts its thread pools (launch/train.py calls it first).
"""

from __future__ import annotations

import ctypes
import ctypes.util

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
