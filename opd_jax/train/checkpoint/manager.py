"""Orbax checkpoints of a run: train state, snapshot store and the run metadata (opd_jax/train/resume.py).

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
Before any of these, a step's files are checked against its checksum manifest (`checksums.json`: the sha256 of
every file of the step, written by process 0 on a thread of its own once orbax has finished the save; the
Checkpointer's wait() and close() wait for it): a changed, missing or extra
file is damage. The manifest is what catches a flipped bit inside a chunk (zarr chunks carry no checksum, and
an uncompressed chunk of the right length reads back as other numbers). A step without a manifest (written
before manifests were kept, or by a process killed before the next save or its close wrote it) is read
without this check.

Damaged steps newer than the one restored are renamed to `<step>.corrupt-<YYYYmmdd-HHMMSS>`, outside orbax's
step pattern: `latest_step()` no longer sees them, a new save at that step works, and the files stay for a look
(delete them by hand; max_to_keep does not count them). Nothing is renamed when no step reads back: a failure
of every step more likely comes from the environment (memory, permissions) than from damage to all of them.

In a multi-process run the processes decide together, step by step: each checks a share of the step's files
against the manifest (process i the files i, i + n, ... of the sorted list) and reads the step; a step that is
damaged on any process is skipped by all, so every process lands on the same step, and process 0 alone renames
and warns (with the reason the process that found the damage gave). Processes that list different steps (a
workdir that is not one shared filesystem) stop the run with one line.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import gc
import json
import logging
import os
import re
import sys
import time
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging as absl_logging
from etils import epath

from opd_jax.errors import InputError
from opd_jax.train.checkpoint.agreement import DAMAGED, INTACT, MISMATCH, agree, check_same_listing
from opd_jax.train.checkpoint.integrity import REQUIRED_FILES, Unreadable, verify_manifest, write_manifest_if_kept


class CheckpointMismatch(InputError):
  """A checkpoint that reads back but whose arrays do not fit this run's state (another model or config)."""


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
    self._unsealed: list[int] = []  # saved steps whose checksum manifest is not written yet
    # Manifests are hashed on a thread of their own (file reads only, no orbax call), so a save's checksums do
    # not hold up the training loop; wait() and close() wait for them.
    self._hashing = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="opd-checksums")
    self._manifests: list[concurrent.futures.Future] = []
    self._waited = False  # finish_save() waited for a save since the last save() (_OwnWaitWarning)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, arrays, meta: dict) -> None:
    """arrays: pytree of jax arrays (train state, snapshots); meta: JSON (data iterator state, versions).

    Orbax writes `meta` on a background thread, so it is copied (and checked to be JSON) here: the caller may
    keep mutating the objects it passed.
    """
    meta = json.loads(json.dumps(meta))
    self._seal()  # the previous save's manifest (orbax waits for that save before it starts this one anyway)
    waited, self._waited = self._waited, False
    quiet, absl_logger = _OwnWaitWarning(), absl_logging.get_absl_logger()
    if waited:
      absl_logger.addFilter(quiet)
    try:
      self._manager.save(step, args=ocp.args.Composite(arrays=ocp.args.StandardSave(arrays),
                                                      meta=ocp.args.JsonSave(meta)), force=True)
    finally:
      absl_logger.removeFilter(quiet)
    self._unsealed.append(step)

  def _seal(self) -> None:
    """Waits for the saves in flight, then hands each finished step to the hashing thread (process 0)."""
    if not self._unsealed:
      return
    self._manager.wait_until_finished()
    if jax.process_index() == 0:
      self._manifests += [self._hashing.submit(write_manifest_if_kept, os.path.join(self.directory, str(step)))
                          for step in self._unsealed]
    self._unsealed = []

  def _wait_for_manifests(self) -> None:
    for future in self._manifests:
      future.result()  # a failure to write a manifest (disk full, permissions) surfaces here
    self._manifests = []

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
    steps = sorted(self._manager.all_steps(), reverse=True)
    check_same_listing(steps, self.directory)
    for step in steps:
      # Two decisions per step, each taken by all processes together: the files (manifest, metadata), then the
      # arrays (orbax's restore, which every process enters together).
      status, reason, _ = agree(*self._check_files(step))
      if status == INTACT:
        status, reason, restored = agree(*self._read(step, make_abstract))
      if status == MISMATCH:
        raise CheckpointMismatch(reason)
      if status == DAMAGED:
        skipped.append((step, reason))
        continue
      arrays, meta = restored
      self._move_aside(skipped, fallback_step=step)
      return Restored(step=step, arrays=arrays, meta=meta, skipped=skipped)
    if not skipped:
      return None
    newest, reason = skipped[0]
    older = f"; the {len(skipped) - 1} older steps are unreadable too" if len(skipped) > 1 else ""
    raise InputError(f"no checkpoint in {self.directory!r} reads back (step {newest}: {reason}{older}); "
                     f"use a new --workdir, or delete {self.directory!r} to start this run over")

  def _check_files(self, step: int) -> tuple[int, str, None]:
    """(status, reason, None) of this process's own checks of step's files, without orbax (whose reads hold
    collectives every process must enter): required files, its share of the checksum manifest."""
    step_dir = os.path.join(self.directory, str(step))
    try:
      for name in REQUIRED_FILES:
        path = os.path.join(step_dir, name)
        if not os.path.isfile(path):
          item = os.path.dirname(name)  # a whole item directory gone is named as such
          raise Unreadable(f"{item}/ is missing" if item and not os.path.isdir(os.path.dirname(path)) else
                            f"{name} is missing")
      verify_manifest(step_dir, share=(jax.process_index(), jax.process_count()))
    except Unreadable as e:
      return DAMAGED, str(e), None
    return INTACT, "", None

  def _read(self, step: int, make_abstract: Callable[[dict], Any]) -> tuple[int, str, tuple | None]:
    """(status, reason, (arrays, meta)) of reading step through orbax into make_abstract(meta)."""
    try:
      return INTACT, "", self._restore_checked(step, make_abstract)
    except CheckpointMismatch as e:
      return MISMATCH, str(e), None
    except Unreadable as e:
      return DAMAGED, str(e), None

  def _restore_checked(self, step: int, make_abstract: Callable[[dict], Any]):
    step_dir = os.path.join(self.directory, str(step))
    meta = _read("meta: ", step_dir, self.restore_meta, step)
    if not isinstance(meta, dict):
      raise Unreadable(f"meta holds a JSON {type(meta).__name__}, not an object")
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
                               f"{differences[0]}{more}; {_layout_hint(differences)}use a new --workdir, or the "
                               "config that wrote it")
    arrays, _ = _read("", step_dir, self.restore, step, abstract)  # shapes fit: a failure is in the data files
    return arrays, meta

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

  def finish_save(self) -> None:
    """Waits for the saves in flight (not for their checksum manifests, which are hashed on their own thread)."""
    self._seal()
    self._waited = True

  def wait(self) -> None:
    self._manager.wait_until_finished()
    self._seal()
    self._wait_for_manifests()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._seal()
    self._wait_for_manifests()
    self._hashing.shutdown()
    self._manager.close()


class _OwnWaitWarning(logging.Filter):
  """Drops orbax's "Waiting for previous save to complete took X seconds. If this number is high, consider
  checkpointing less frequently." at a save that follows finish_save(): orbax counts every wait for a save on the
  main thread, so the loop's deliberate wait after a save (train.malloc_trim) would be reported at the next save
  as a save that held training up. Without finish_save() the warning stays: it is then a real wait."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Waiting for previous save to complete took")


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


def _layout_hint(differences: list[str]) -> str:
  """What a mismatch between stacked ([L, ...]) and per-layer decoder storage means, else that another model or
  config wrote the checkpoint (opd_jax.models.layer_stack)."""
  names = [d.split(" is ")[0] for d in differences]
  per_layer = any(re.search(r"(^|\.)layers\.\d+\.", n) for n in names)
  stacked = any(re.search(r"(^|\.)layers\.[a-z_]", n) for n in names)
  if per_layer and stacked:
    return ("the checkpoint and this run store the decoder layers differently (one by one with "
            "model.scan_layers=False, stacked [L, ...] with model.scan_layers=True; checkpoints written before "
            "layers were stored stacked hold them one by one): ")
  return "it was written for another model or config: "


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
  """read(*args), where any failure (but memory) is damage: Unreadable with `what` + a one-line reason."""
  try:
    return read(*args)
  except MemoryError:
    raise
  except Exception as e:  # noqa: BLE001
    reason = what + _short_reason(e, step_dir)
  gc.collect()  # the failed read's exception, and with it most abandoned reads, before the next step is tried
  raise Unreadable(reason)
