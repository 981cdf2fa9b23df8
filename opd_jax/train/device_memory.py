"""Peak accelerator memory of this process, for the metrics rows: what a run really took on a GPU or TPU, beside
what launch/plan_memory.py predicted for it. XLA:CPU keeps no such count (host RSS is the measure there)."""

from __future__ import annotations

import jax


def peak_gib(devices=None) -> dict[str, float]:
  """{"memory/device_peak_gib": the largest `peak_bytes_in_use` over this process's devices, in GiB (2^30 bytes)},
  or {} where the backend reports no memory statistics."""
  peaks = []
  for device in jax.local_devices() if devices is None else devices:
    stats = device.memory_stats()  # None on XLA:CPU
    if stats and "peak_bytes_in_use" in stats:
      peaks.append(stats["peak_bytes_in_use"])
  return {"memory/device_peak_gib": max(peaks) / 2**30} if peaks else {}
