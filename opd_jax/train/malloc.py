"""glibc's malloc settings for a training process (Linux): the arena cap, huge pages, and keeping freed memory.

glibc gives each thread that contends for the heap an arena of its own, up to 8 per core, and memory a thread
frees stays in its arena, so how much freed memory a run keeps depends on thread timing. On pair1 (60 steps,
the same numbers every time, no compilation cache) runs capped at two arenas peaked at 1.32-1.37 GB (four runs)
and runs with glibc's default at 1.35 and 1.46 GB (GB = 1e9 bytes), in the same time within this host's noise. A
bounded retention is what lets the planner predict host memory (opd_jax/planning/host_memory.py).
`cap_arenas` must run before jax starts its thread pools (launch/train.py calls it first).

Huge pages: XLA:CPU allocates a step's temporaries with malloc, and glibc serves every large block with a fresh
mmap, so each step page-faults its temporaries in 4 KiB at a time (the kernel zeroes every page). With glibc's
`glibc.malloc.hugetlb=1` tunable (glibc >= 2.35) malloc asks for transparent huge pages (madvise), and the real
pair's train step ran in 6.0 / 6.6 s against 10.1 / 9.3 s without it (launch/bench/learner.py --configs=smollm2,
runs interleaved ABBA, 2-core host; docs/benchmarks.md). Tunables are read when a process starts, so
`use_tunables` re-executes the launch script once with the tunables added (before jax is imported).

Keeping freed memory: huge pages made each fault cheaper, not rarer. In 12 s (about a step) a real-pair run
mmapped 2.3 GB of fresh blocks (one of 2.0 GB; strace) and unmapped them again, and on days when this host's
kernel zeroed pages slowly, 58% of the training process's samples were in `clear_page_erms` (perf, 10 s, at
13-14 s per step). With `glibc.malloc.mmap_max=0` and a 1 TiB `glibc.malloc.trim_threshold`, malloc serves
large blocks from its heap and keeps what is freed, so the next step reuses the same pages without faulting
them in. A thread's own
arena cannot hold a block over 64 MiB and maps it anyway, so this needs one arena (`train.malloc_arena_max=1`).
The cost: the process keeps its high-water mark until it exits. launch/bench/malloc.py measures both settings
side by side on the whole loop (results/bench/malloc.json; docs/benchmarks.md has the table).

Trimming: a kept heap also keeps what phases other than the step allocate. An orbax save runs on threads of its
own while the next step allocates, so its host buffers and the step's temporaries are live at once and the heap
grows by both; an evaluation's generation buffers stay too. With `train.malloc_trim` the loop waits for each
save to finish before the next step, and calls `trim` (malloc_trim(0): the free pages of every chunk go back to
the kernel) after each save and evaluation and before the export; the next step faults its pool in once more. A
30-step int4 real-pair run with a save every 5 steps peaked at 5.67 GB with it against 9.16 GB without, the steps
after saves taking about 6 s more each (results/bench/rss_trim.json). It does not bound every run: one of the first
two 300-step real-pair runs with it peaked at 11.04 GB, the other at 6.20 GB (docs/benchmarks.md).

Growth between saves: the per-step RSS of real-pair runs shows the kept heap rising by about 2 GB in one step, with no
save or evaluation, a few times a run, and each trim after a save bringing it back (docs/benchmarks.md). The likely
cause is fragmentation: a step's largest block (one of 2.0 GB there, strace above) no longer fits in the freed space
that smaller blocks have split, so the heap grows by a whole block while the old space stays resident
(tests/test_memory_plan.py shows this on glibc at 400 MB). `HeapTrim` with `train.malloc_trim_growth_gb` > 0 (default 1)
trims after a step whose resident size rose that much above the level the heap settled at after the last trim; the next
step faults its pool in once more. On the real-pair seed that grew, a 1 GB threshold took the peak from 10.15 to 7.43
GB, the level of the seeds that never grew, with two such trims in 320 steps costing about 5.5 s each
(results/smollm2/heap_trim_growth/).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys

from opd_jax.errors import InputError
from opd_jax.train import process_memory

_M_ARENA_MAX = -8  # mallopt parameter number, from glibc's malloc.h


def _check_arenas(arenas: int) -> None:
  if isinstance(arenas, bool) or not isinstance(arenas, int) or arenas < 0:
    raise InputError(f"train.malloc_arena_max must be an integer >= 0 (0 = glibc's default), got {arenas!r}")


def _libc(function: str):
  """The C library's `function` through ctypes, or None where there is none (macOS, musl without it)."""
  try:
    return getattr(ctypes.CDLL(ctypes.util.find_library("c")), function)
  except (OSError, AttributeError, TypeError):
    return None


def cap_arenas(arenas: int) -> bool:
  """mallopt(M_ARENA_MAX, arenas); 0 keeps glibc's default. Returns whether the cap was set (False off glibc)."""
  _check_arenas(arenas)
  if not arenas:
    return False
  mallopt = _libc("mallopt")
  return False if mallopt is None else bool(mallopt(_M_ARENA_MAX, arenas))


def trim() -> bool:
  """malloc_trim(0): glibc hands the free pages of its heaps back to the kernel. False off glibc."""
  malloc_trim = _libc("malloc_trim")
  if malloc_trim is None:
    return False
  malloc_trim(0)
  return True


class HeapTrim:
  """The loop's trims (enabled: train.malloc_trim). `trim()` after each save and evaluation and before the export,
  so that what those phases allocated does not stack on a heap that keeps freed memory; `after_step(report)`
  trims when the resident size has risen more than `growth_gb` GB (train.malloc_trim_growth_gb; 0 = never) above
  its level after the first step since the last trim, and passes `report` one line saying so. `wait` runs before
  each trim (the checkpointer's finish_save: a save in flight still holds its buffers)."""

  def __init__(self, enabled: bool, growth_gb: float, wait=lambda: None):
    self._enabled, self._growth, self._wait = enabled, growth_gb * 1e9 if enabled else 0.0, wait
    self._settled: int | None = None  # bytes resident after the first step since the last trim

  def trim(self) -> None:
    if self._enabled:
      self._wait()
      trim()
      self._settled = None

  def after_step(self, report) -> None:
    if not self._growth:
      return
    current = process_memory.rss_bytes()[0]
    if self._settled is None:
      self._settled = current
    elif current > self._settled + self._growth:
      settled = self._settled
      self.trim()
      report(f"the heap grew to {current / 1e9:.2f} GB resident, {(current - settled) / 1e9:.2f} GB above the "
             f"{settled / 1e9:.2f} GB it settled at: trimmed (train.malloc_trim_growth_gb)")


HUGETLB = "glibc.malloc.hugetlb=1"  # glibc tunable: malloc madvises transparent huge pages for its memory
# glibc tunables: no block gets its own mmap, and freed memory at the heap's top is kept up to 1 TiB (not trimmed)
KEEP_FREED = ("glibc.malloc.mmap_max=0", "glibc.malloc.trim_threshold=1099511627776")


def _glibc_at_least(major: int, minor: int) -> bool:
  name, version = platform.libc_ver()
  if name != "glibc" or not version:
    return False
  return tuple(int(x) for x in version.split(".")[:2]) >= (major, minor)


def _name(tunable: str) -> str:
  return tunable.split("=", 1)[0]


def use_tunables(huge_pages: bool, keep_freed: bool, arena_max: int) -> tuple[str, ...]:
  """Re-executes this process (same interpreter and argv) with GLIBC_TUNABLES holding HUGETLB (if huge_pages)
  and KEEP_FREED (if keep_freed), beside the user's own tunables; a tunable the user names wins. Nothing happens
  off glibc >= 2.35 on Linux. Returns the tunables of ours in effect. Call it before jax is imported: the
  process starts over. keep_freed needs arena_max == 1 (opd_jax/train/malloc.py says why)."""
  for field, value in (("malloc_huge_pages", huge_pages), ("malloc_keep_freed", keep_freed)):
    if not isinstance(value, bool):
      raise InputError(f"train.{field} must be True or False, got {value!r}")
  _check_arenas(arena_max)
  if keep_freed and arena_max != 1:
    raise InputError(f"train.malloc_keep_freed=True needs train.malloc_arena_max=1 (got {arena_max!r}): a thread's "
                     "own arena maps blocks over 64 MiB afresh anyway; set malloc_arena_max=1 or "
                     "malloc_keep_freed=False")
  tunables = os.environ.get("GLIBC_TUNABLES", "")
  present = tunables.split(":") if tunables else []
  wanted = ((HUGETLB,) if huge_pages else ()) + (KEEP_FREED if keep_freed else ())
  missing = [t for t in wanted if _name(t) not in {_name(p) for p in present}]
  ours = tuple(t for t in (HUGETLB, *KEEP_FREED) if t in present)
  if not missing or sys.platform != "linux" or not _glibc_at_least(2, 35):
    return ours
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  if spec is not None:  # python -m package.module
    argv = [sys.executable, "-m", spec.name, *sys.argv[1:]]
  elif os.path.isfile(sys.argv[0]):  # python script.py
    argv = [sys.executable, *sys.argv]
  else:  # python -c / an embedded interpreter: nothing to start again
    return ours
  os.environ["GLIBC_TUNABLES"] = ":".join(present + missing)
  sys.stdout.flush(), sys.stderr.flush()
  os.execv(sys.executable, argv)
