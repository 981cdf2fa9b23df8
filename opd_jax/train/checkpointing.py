"""Orbax checkpoints of a run: train state, snapshot store, data iterator state and run metadata.

Orbax writes each step to a temporary directory and renames it when complete, so an interrupted save never
leaves a checkpoint that restore would pick up.
"""

from __future__ import annotations

import json
import os

import jax
import orbax.checkpoint as ocp


class Checkpointer:

  def __init__(self, directory: str, keep: int):
    self.directory = os.path.abspath(directory)
    self._manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, arrays, meta: dict) -> None:
    """arrays: pytree of jax arrays (train state, snapshots); meta: JSON (data iterator state, versions).

    Orbax writes `meta` on a background thread, so it is copied (and checked to be JSON) here: the caller may
    keep mutating the objects it passed.
    """
    meta = json.loads(json.dumps(meta))
    self._manager.save(step, args=ocp.args.Composite(arrays=ocp.args.StandardSave(arrays),
                                                    meta=ocp.args.JsonSave(meta)), force=True)

  def restore(self, step: int, abstract_arrays):
    """(arrays, meta); abstract_arrays carries the target structure, shapes, dtypes and shardings."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_arrays)
    restored = self._manager.restore(step, args=ocp.args.Composite(
        arrays=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    return restored.arrays, restored.meta

  def restore_meta(self, step: int) -> dict:
    return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()
