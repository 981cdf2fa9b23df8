"""Orbax checkpoints of a run: train state, snapshot store, data iterator state and run metadata.

Orbax writes each step to a temporary directory (`<step>.orbax-checkpoint-tmp-*`) and renames it when complete,
so an interrupted save never leaves a checkpoint that restore would pick up; the Checkpointer deletes such
leftovers when it is created (take the WorkdirLock first, so this never races a live trainer's save).

A finished checkpoint can still be damaged later (a disk filling up, a copy cut short, a hand-deleted file).
`restore_latest_intact` then falls back to the newest step that reads back whole. It tells a damaged step from
one that does not fit this run in this order, per step, newest first:
  1. damaged: a file orbax writes at every save is missing (_CHECKPOINT_METADATA, arrays/_METADATA,
     meta/metadata, or a whole item directory), the run metadata is not JSON, or the stored array metadata
     (names, shapes, dtypes; read from _METADATA and each array's zarr header) cannot be read;
  2. mismatch: the stored array names, shapes and dtypes differ from the target that `make_abstract(meta)`
     builds: a CheckpointMismatch (an InputError) at once, no fallback: an older step of the same run would not
     fit either, the config differs (another model, another optimizer);
  3. damaged: reading the array data fails (a truncated or missing data file), with shapes already known to fit.
Damaged steps newer than the one restored are renamed to `<step>.corrupt-<YYYYmmdd-HHMMSS>`, outside orbax's
step pattern: `latest_step()` no longer sees them, a new save at that step works, and the files stay for a look
(delete them by hand; max_to_keep does not count them). Nothing is renamed when no step reads back: a failure
of every step more likely comes from the environment (memory, permissions) than from damage to all of them.
Data damaged inside a file whose length is intact may read back unnoticed: zarr chunks carry no checksum.
In a multi-process run every process checks and reads; they must land on the same step (checked with an
all-gather), and process 0 alone renames and warns.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import sys
import time
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from opd_jax.errors import InputError

# Files that every finished step holds (relative to the step directory), whatever the arrays are.
_REQUIRED_FILES = ("_CHECKPOINT_METADATA", "arrays/_METADATA", "meta/metadata")


class CheckpointMismatch(InputError):
  """A checkpoint that reads back but whose arrays do not fit this run's state (another model or config)."""


class _Unreadable(Exception):
  """A damaged checkpoint step; the message is the short reason."""


@dataclasses.dataclass(frozen=True)
class Restored:
  step: int
  arrays: Any
  meta: dict
  skipped: list[tuple[int, str]]  # (step, reason) of newer damaged steps, newest first; they were moved aside


class Checkpointer:

  def __init__(self, directory: str, keep: int):
    self.directory = os.path.abspath(directory)
    self._manager = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True, cleanup_tmp_directories=True))

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

  def restore_latest_intact(self, make_abstract: Callable[[dict], Any]) -> Restored | None:
    """The newest checkpoint that reads back whole, or None when there are no checkpoints.

    make_abstract(meta) builds the arrays target (structure, shapes, dtypes, shardings) from that step's meta.
    Damaged newer steps are skipped with a warning on stderr and moved aside (module docstring). Raises
    CheckpointMismatch when a readable step does not fit the target, and InputError when no step reads back.
    """
    skipped = []
    for step in sorted(self._manager.all_steps(), reverse=True):
      try:
        arrays, meta = self._restore_checked(step, make_abstract)
      except _Unreadable as e:
        skipped.append((step, str(e)))
        continue
      _check_processes_agree(step, self.directory)
      self._move_aside(skipped, fallback_step=step)
      return Restored(step=step, arrays=arrays, meta=meta, skipped=skipped)
    if not skipped:
      return None
    newest, reason = skipped[0]
    older = f"; the {len(skipped) - 1} older steps are unreadable too" if len(skipped) > 1 else ""
    raise InputError(f"no checkpoint in {self.directory!r} reads back (step {newest}: {reason}{older}); "
                     f"use a new --workdir, or delete {self.directory!r} to start this run over")

  def _restore_checked(self, step: int, make_abstract: Callable[[dict], Any]):
    step_dir = os.path.join(self.directory, str(step))
    for name in _REQUIRED_FILES:
      path = os.path.join(step_dir, name)
      if not os.path.isfile(path):
        item = os.path.dirname(name)  # a whole item directory gone is named as such
        raise _Unreadable(f"{item}/ is missing" if item and not os.path.isdir(os.path.dirname(path)) else
                          f"{name} is missing")
    meta = _read("meta: ", step_dir, self.restore_meta, step)
    if not isinstance(meta, dict):
      raise _Unreadable(f"meta holds a JSON {type(meta).__name__}, not an object")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, make_abstract(meta))
    handler = ocp.StandardCheckpointHandler()
    try:
      stored = _read("array metadata: ", step_dir, lambda: handler.metadata(epath.Path(step_dir) / "arrays").tree)
    finally:
      handler.close()
    differences = _differences(stored, abstract)
    if differences:
      more = f" (and {len(differences) - 1} more differences)" if len(differences) > 1 else ""
      raise CheckpointMismatch(f"checkpoint step {step} in {self.directory!r} does not fit this run's state: "
                               f"{differences[0]}{more}; it was written for another model or config: use a "
                               "new --workdir, or the config that wrote it")
    return _read("", step_dir, self.restore, step, abstract)  # shapes fit: a failure is in the data files

  def _move_aside(self, skipped: list[tuple[int, str]], fallback_step: int) -> None:
    """Renames damaged step directories out of orbax's step pattern (process 0) and warns once per step."""
    if not skipped:
      return
    if jax.process_index() == 0:
      stamp = time.strftime("%Y%m%d-%H%M%S")
      for step, reason in skipped:
        source = os.path.join(self.directory, str(step))
        target = f"{source}.corrupt-{stamp}"
        os.rename(source, target)
        print(f"warning: checkpoint step {step} in {self.directory} is unreadable ({reason}); falling back to "
              f"step {fallback_step}; moved it aside to {os.path.basename(target)}", file=sys.stderr, flush=True)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices("opd_jax checkpoint fallback: damaged steps moved aside")
    self._manager.reload()

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def _differences(stored_tree, abstract) -> list[str]:
  """One phrase per array whose name, shape or dtype differs between the checkpoint and the target."""
  stored = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(stored_tree)[0]:
    stored[getattr(leaf, "name", None) or ".".join(ocp.tree.str_keypath(path))] = leaf
  wanted = {".".join(ocp.tree.str_keypath(path)): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]}
  differences = [f"{name} is in the checkpoint but not in this run" for name in stored if name not in wanted]
  differences += [f"{name} is in this run but not in the checkpoint" for name in wanted if name not in stored]
  for name in stored.keys() & wanted.keys():
    have, want = stored[name], wanted[name]
    if not hasattr(have, "shape") or not hasattr(have, "dtype"):
      continue
    have_sd = (tuple(have.shape), np.dtype(have.dtype).name)
    want_sd = (tuple(want.shape), np.dtype(want.dtype).name)
    if have_sd != want_sd:
      differences.append(f"{name} is {have_sd[1]}{list(have_sd[0])} in the checkpoint but "
                         f"{want_sd[1]}{list(want_sd[0])} in this run")
  return sorted(differences)


def _short_reason(error: BaseException, step_dir: str) -> str:
  """The root cause's first line, without tensorstore specs or the step directory's path."""
  while error.__cause__ is not None or (error.__context__ is not None and not error.__suppress_context__):
    error = error.__cause__ or error.__context__
  text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
  text = (str(text).strip().splitlines() or [""])[0].split(" [tensorstore_spec")[0]
  text = text.replace(step_dir + os.sep, "").replace(step_dir, ".")
  text = text or type(error).__name__
  return text if len(text) <= 200 else text[:197] + "..."


def _read(what: str, step_dir: str, read: Callable, *args):
  """read(*args), where any failure (but memory) is damage: _Unreadable with `what` + a one-line reason."""
  try:
    return read(*args)
  except MemoryError:
    raise
  except Exception as e:  # noqa: BLE001
    reason = what + _short_reason(e, step_dir)
  _drop_abandoned_read_tracebacks()
  gc.collect()  # the failed read's exception, and with it most abandoned reads, before the next step is tried
  raise _Unreadable(reason)


def _drop_abandoned_read_tracebacks() -> None:
  """Silences the tracebacks that orbax's abandoned reads leave after a failed restore.

  When one array read fails, orbax abandons the concurrent reads of the other arrays and closes its event loop.
  Later, in other threads, each abandoned read raises again when it is garbage collected ("Exception ignored in
  <coroutine _read_array_index_and_device_put>" with a tensorstore spec dump), and tensorstore callbacks find the
  loop closed ("Event loop is closed"). The reason is already in the warning, so from the first failed read on,
  the process's unraisable hook drops those two messages and passes every other to the hook it wraps.
  """
  previous = sys.unraisablehook
  if getattr(previous, "drops_abandoned_reads", False):
    return

  def hook(unraisable):
    abandoned_read = "_read_array_index" in getattr(unraisable.object, "__qualname__", "")
    closed_loop = (unraisable.object is None and isinstance(unraisable.exc_value, RuntimeError)
                   and str(unraisable.exc_value) == "Event loop is closed")
    if not (abandoned_read or closed_loop):
      previous(unraisable)
  hook.drops_abandoned_reads = True
  sys.unraisablehook = hook


def _check_processes_agree(step: int, directory: str) -> None:
  """Every process must restore the same step; files that read differently per host would split the run."""
  if jax.process_count() == 1:
    return
  from jax.experimental import multihost_utils
  steps = sorted(set(np.asarray(multihost_utils.process_allgather(np.int64(step))).reshape(-1).tolist()))
  if len(steps) > 1:
    raise InputError(f"processes restored different checkpoint steps {steps} from {directory!r}: its files read "
                     "differently on different hosts; check the filesystem, or delete the damaged newer steps")
