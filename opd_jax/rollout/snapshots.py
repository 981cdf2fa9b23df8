"""Lagged parameter snapshots: the sampler reads learner version t - staleness_steps.

The store keeps the last `capacity` learner parameter versions (version = number of updates applied). Asking
for staleness s at version t returns version max(t - s, oldest kept); the version actually used is returned
with the parameters so every rollout batch can record it. Snapshots are device arrays (copies that later
updates do not touch, since jax arrays are immutable); the store is a plain dict, checkpointed with the run
so staleness resumes exactly.
"""

from __future__ import annotations

from typing import Any

from opd_jax.errors import InputError


class SnapshotStore:

  def __init__(self, capacity: int):
    if capacity < 1:
      raise InputError(f"snapshot capacity must be >= 1, got {capacity}")
    self.capacity = capacity
    self._versions: dict[int, Any] = {}

  def push(self, version: int, params) -> None:
    if self._versions and version <= max(self._versions):
      raise InputError(f"snapshot version {version} is not newer than {max(self._versions)}")
    self._versions[version] = params
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
    return target, self._versions[target]

  def state_dict(self) -> dict[str, Any]:
    return {str(v): p for v, p in self._versions.items()}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    self._versions = {int(v): p for v, p in state.items()}
