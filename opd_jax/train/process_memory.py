"""This process's resident memory (Linux), for the metrics rows and the memory planner: what a run holds on the
host, beside what opd_jax/planning/host_memory.py predicted for it. GB here is 1e9 bytes, as in docs/benchmarks.md."""

from __future__ import annotations

import os
import resource


def rss_bytes() -> tuple[int, int]:
  """(current, peak) resident set size of this process."""
  with open("/proc/self/statm") as f:
    current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  return current, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: ru_maxrss in KiB


_seen_peak = 0  # the largest resident size host_gb has reported in this process


def host_gb() -> dict[str, float]:
  """{"perf/host_rss_gb": resident now, "perf/host_peak_rss_gb": the most resident so far}, or {} off Linux. Under
  perf/ with the timings: they depend on the machine and on thread timing, not on what was learned."""
  global _seen_peak
  try:
    current, peak = rss_bytes()
  except OSError:  # no /proc (macOS)
    return {}
  # The kernel's two counts lag each other by a few pages per thread, so the current size can pass the kernel's
  # peak: the peak reported is the largest of both counts seen so far, and it never falls.
  _seen_peak = max(_seen_peak, current, peak)
  return {"perf/host_rss_gb": current / 1e9, "perf/host_peak_rss_gb": _seen_peak / 1e9}
