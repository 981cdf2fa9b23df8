"""What a run checkpoints besides its arrays, and resuming from it.

A checkpoint holds the learner's TrainState and the kept weight snapshots (arrays), and this metadata: the step,
the prompt pipeline's state after the last batch, the metrics of the steps since the last log row (so a resumed
interval averages the same), the kept snapshot versions, the run's identity (pair, steps, batch size, mode,
staleness: a checkpoint of another run is an error, never a fallback) and the training wall-clock so far.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax

from opd_jax.errors import InputError
from opd_jax.spec import RunSpec
from opd_jax.train.checkpoint.manager import Checkpointer
from opd_jax.train.step import TrainState
from opd_jax.train.versions import WeightVersions
from opd_jax.train.workdir_lock import check_workdir


def run_meta(spec: RunSpec, *, step: int, data_state: dict, pending: list, versions: WeightVersions,
             train_s: float) -> dict:
  """The metadata stored with checkpoint `step` (module docstring); pending: the interval's metric rows."""
  saved_pending = [{k: float(v) for k, v in row.items()} for row in jax.device_get(pending)]  # JSON form
  return {"step": step, "data_state": data_state, "pending_metrics": saved_pending,
          "snapshot_versions": versions.snapshots.versions(), "pair": spec.pair.name, "steps": spec.train.steps,
          "batch_size": spec.train.batch_size, "mode": spec.train.mode,
          "staleness_steps": spec.rollout.staleness_steps, "train_s": train_s}


@dataclasses.dataclass
class Resumed:
  state: TrainState
  step: int | None  # the checkpoint's step; None = a fresh run
  pending: list  # metric rows of the interval in flight
  train_s: float  # training wall-clock of the earlier processes


def resume(checkpointer: Checkpointer, spec: RunSpec, state: TrainState, versions: WeightVersions,
           prompts) -> Resumed:
  """The newest intact checkpoint restored into `state`, `versions` and `prompts` (a damaged newer one is moved
  aside with a warning naming it); the run as it is when there is none."""
  latest = checkpointer.latest_step()
  if latest is None:
    return Resumed(state, None, [], 0.0)
  if not spec.train.resume:
    raise InputError(f"workdir {os.path.dirname(checkpointer.directory)!r} already holds checkpoints (step {latest}) and "
                     "train.resume=False; use a new --workdir, or resume")

  def abstract_for(meta: dict):
    check_same_run(meta, spec)
    return {"train": state, "snapshots": versions.abstract(state.params, meta["snapshot_versions"])}

  restored = checkpointer.restore_latest_intact(abstract_for)
  if restored is None:
    return Resumed(state, None, [], 0.0)
  versions.snapshots.load_state_dict(restored.arrays["snapshots"])
  prompts.set_state(restored.meta["data_state"])
  return Resumed(restored.arrays["train"], int(restored.meta["step"]), restored.meta["pending_metrics"],
                 float(restored.meta.get("train_s", 0.0)))  # absent in checkpoints of older versions


# What a run's numbers depend on, beyond its pair: a workdir's config.json must agree on these with a config run
# into it again (a resume, or a finished run asked again), or that run's record would describe another run.
_SAME_RUN_FIELDS = ("seed", "teacher_param_dtype", "teacher_compute_dtype", "student_param_dtype",
                    "student_compute_dtype", "objective", "optimizer", "rollout", "train.steps", "train.batch_size",
                    "train.mode", "train.max_staleness", "data.source", "data.mix", "data.max_prompt_tokens",
                    "data.prompt_format", "data.use_chat_template", "data.seed")


def check_new_or_same_run(workdir: str, spec: RunSpec) -> None:
  """Before anything is written: the workdir can be written, and a config.json already in it (a run's record, with
  or without checkpoints) is of this pair, teacher and student, and agrees on every _SAME_RUN_FIELDS field."""
  check_workdir(workdir)
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    return
  try:
    with open(path, encoding="utf-8") as f:
      old = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError):
    raise InputError(f"workdir {workdir!r} holds a config.json that cannot be read as JSON; use a new --workdir, "
                     "or remove that run's files") from None
  new = json.loads(spec.config_json)
  if old.get("pair") != new.get("pair"):
    raise InputError(f"workdir holds a run of pair {old.get('pair')!r}, but this config is pair {new.get('pair')!r}; "
                     "use a new --workdir")
  for field in ("teacher", "student"):  # the model, not where it lies: a moved checkout or models dir is the same
    a, b = (os.path.basename(os.path.normpath(str(c.get(field, "")))) for c in (old, new))
    if a != b:
      raise InputError(f"workdir holds a run with {field} {a!r}, but this config's is {b!r}; use a new --workdir")
  for field in _SAME_RUN_FIELDS:
    changed = _first_difference(field, _get(old, field), _get(new, field))
    if changed:
      raise InputError(f"workdir holds a run with {changed[0]}={changed[1]!r}, but this config has {changed[2]!r}; "
                       f"use a new --workdir, or the run's own {changed[0]}")


def _get(record: dict, dotted: str):
  """record["a"]["b"] for "a.b" in a stored config.json (None where a level is missing)."""
  for key in dotted.split("."):
    record = record.get(key) if isinstance(record, dict) else None
  return record


def _first_difference(field: str, old, new) -> tuple | None:
  """(dotted field, old, new) of the first leaf where the stored record differs from the new config; None when
  they agree. A field the record lacks (written by a version of opd_jax before the field existed) is not compared."""
  if old is None:
    return None
  if isinstance(old, dict) and isinstance(new, dict):
    return next(filter(None, (_first_difference(f"{field}.{key}", old[key], new.get(key)) for key in sorted(old))),
                None)
  return None if old == new else (field, old, new)


def check_same_run(meta: dict, spec: RunSpec) -> None:
  if meta.get("pair") != spec.pair.name:
    raise InputError(f"workdir holds a run of pair {meta.get('pair')!r}, but this config is pair "
                     f"{spec.pair.name!r}; use a new --workdir")
  t = spec.train
  for key, field, value in (("batch_size", "train.batch_size", t.batch_size), ("steps", "train.steps", t.steps),
                            ("mode", "train.mode", t.mode),
                            ("staleness_steps", "rollout.staleness_steps", spec.rollout.staleness_steps)):
    if meta.get(key) != value:
      raise InputError(f"workdir holds a checkpoint of a run with {field}={meta.get(key)}, but this config "
                       f"has {value}; use a new --workdir or the run's own {field}")
