"""Lagged parameter snapshots: the sampler reads learner version t - staleness_steps.

The store keeps the last `capacity` versions (version = number of updates applied) of whatever the sampler
needs per version -- its weights at the rollout recipe's precision (rollout.weight_sync), plus a dense learner
copy when the mismatch split is on. Asking for staleness s at version t returns version max(t - s, oldest
kept); the version actually used is returned with the snapshot so every rollout batch can record it. The
store is a plain dict, checkpointed with the run so staleness resumes exactly.

`on="host"` keeps snapshots in host memory (each array's sharding with memory kind `pinned_host`, so every
device's shard stays on its own host) and brings one back to device memory when it is read: device memory
then holds only the version in use, at the cost of one host-to-device copy per read.
"""

from __future__ import annotations

from typing import Any

import jax

from opd_jax.errors import InputError

PLACES = ("device", "host")


def move(tree, memory_kind: str):
  """Every array of `tree` in `memory_kind` memory, each shard on the host / device it is on now."""
  return jax.device_put(tree, jax.tree.map(lambda a: a.sharding.with_memory_kind(memory_kind), tree))


class SnapshotStore:

  def __init__(self, capacity: int, on: str = "device"):
    if capacity < 1:
      raise InputError(f"snapshot capacity must be >= 1, got {capacity}")
    if on not in PLACES:
      raise InputError(f"snapshots can be kept on {PLACES}, got {on!r}")
    self.capacity, self.on = capacity, on
    self._versions: dict[int, Any] = {}

  def push(self, version: int, params) -> None:
    if self._versions and version <= max(self._versions):
      raise InputError(f"snapshot version {version} is not newer than {max(self._versions)}")
    self._versions[version] = move(params, "pinned_host") if self.on == "host" else params
    for old in sorted(self._versions)[:-self.capacity]:
      del self._versions[old]

  @property
  def latest_version(self) -> int:
    if not self._versions:
      raise InputError("snapshot store is empty; push the initial parameters first")
    return max(self._versions)

  def versions(self) -> list[int]:
    return sorted(self._versions)

  def get(self, staleness_steps: int) -> tuple[int, Any]:
    """(version, params) for `staleness_steps` behind the latest (clamped to the oldest kept)."""
    if staleness_steps < 0:
      raise InputError(f"staleness_steps must be >= 0, got {staleness_steps}")
    target = max(self.latest_version - staleness_steps, min(self._versions))
    snapshot = self._versions[target]
    return target, move(snapshot, "device") if self.on == "host" else snapshot

  def state_dict(self) -> dict[str, Any]:
    """Version -> snapshot as stored (host snapshots are checkpointed from host memory)."""
    return {str(v): p for v, p in self._versions.items()}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    self._versions = {int(v): move(p, "pinned_host") if self.on == "host" else p for v, p in state.items()}

  def abstract(self, versions, make_abstract) -> dict[str, Any]:
    """The restore target of `state_dict()` for `versions`; make_abstract() gives one snapshot's abstract
    arrays (with device shardings)."""
    def place(a):
      sharding = a.sharding.with_memory_kind("pinned_host") if self.on == "host" else a.sharding
      return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)
    return {str(v): jax.tree.map(place, make_abstract()) for v in versions}
