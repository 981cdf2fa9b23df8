"""The learner's weight versions as the rollout engine sees them: snapshots, staleness and async publishing.

Versions count loop steps (batches consumed), also across skipped non-finite updates. A version's snapshot is
what the producer needs of it: the sampler's weights (`weight_sync`: noise + precision recipe, on the sampler's
mesh) and, when lag and precision / noise / KV knobs coexist, a dense copy of the learner's parameters that
splits the mismatch into its precision and staleness factors (one learner-dtype copy per kept version).

- sync, no lag: each step syncs the version it uses, and the copy is not kept through the train step (as the
  memory planner counts);
- sync with rollout.staleness_steps = s: the last s + 1 versions' snapshots are kept (and checkpointed) and
  batch t uses version t - s;
- async: a producer thread runs ahead of the learner (opd_jax.train.rollouts.AsyncRollouts); the learner
  publishes each new version's snapshot right after its update.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from opd_jax.rollout.snapshots import SnapshotStore
from opd_jax.train.rollouts import AsyncRollouts, Produced, RolloutProducer


class WeightVersions:

  def __init__(self, spec, weight_sync, producer: RolloutProducer, prompts):
    """spec: the RunSpec; weight_sync: the run's (programs.RunPrograms.weight_sync); prompts: its pipeline."""
    self._weight_sync, self._producer, self._prompts = weight_sync, producer, prompts
    self._staleness, self._mode = spec.rollout.staleness_steps, spec.train.mode
    self._max_staleness = spec.train.max_staleness
    self.split = spec.rollout.keeps_dense_copies(lagged=self._staleness > 0 or self._mode == "async")
    self.snapshots = SnapshotStore(capacity=self._staleness + 1, on=spec.rollout.snapshots_on)
    self._async: AsyncRollouts | None = None

  def snapshot_of(self, params, version: int) -> dict:
    """What produce() needs of one learner version; shares no buffer with `params` (the step donates them)."""
    snapshot = {"sampler": self._weight_sync(params, version)}
    if self.split:
      snapshot["dense"] = jax.tree.map(jnp.copy, params)
    return snapshot

  def abstract(self, params, versions: list[int]) -> dict:
    """The kept snapshots' abstract values (a checkpoint's restore target), for `versions`."""
    def one() -> dict:
      snapshot = {"sampler": self._weight_sync.abstract}
      if self.split:
        snapshot["dense"] = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                                         params)
      return snapshot
    return self.snapshots.abstract(versions, one)

  def start(self, params, step: int) -> None:
    """Before the first step of this process: the lagged sampler's first snapshot, or the producer thread."""
    if self._mode == "sync" and self._staleness and not self.snapshots.versions():
      self.snapshots.push(step, self.snapshot_of(params, step))
    if self._mode == "async":
      self._async = AsyncRollouts(self._producer, self._prompts, start_index=step, max_staleness=self._max_staleness,
                                  initial_version=step, initial_snapshot=self.snapshot_of(params, step))

  def next_batch(self, step: int, params) -> Produced:
    """The rollout batch learner step `step` trains on."""
    if self._async is not None:
      return self._async.get()
    if self._staleness:
      version, snapshot = self.snapshots.get(self._staleness)
    else:
      version, snapshot = step, self.snapshot_of(params, step)
    batch = self._producer.produce(step, version, snapshot, next(self._prompts))
    return Produced(step, version, batch, self._prompts.get_state(), self._producer.engine_stats())

  def publish(self, version: int, params) -> None:
    """The learner's new version, right after its update."""
    if self._async is not None:
      self._async.publish(version, self.snapshot_of(params, version))
    elif self._staleness:
      self.snapshots.push(version, self.snapshot_of(params, version))

  def close(self) -> None:
    if self._async is not None:
      self._async.close()
