"""What a run checkpoints besides its arrays, and resuming from it.

A checkpoint holds the learner's TrainState and the kept weight snapshots (arrays), and this metadata: the step,
the prompt pipeline's state after the last batch, the metrics of the steps since the last log row (so a resumed
interval averages the same), the kept snapshot versions, the run's identity (pair, steps, batch size, mode,
staleness: a checkpoint of another run is an error, never a fallback) and the training wall-clock so far.
"""

from __future__ import annotations

import dataclasses
import os

import jax

from opd_jax.errors import InputError
from opd_jax.spec import RunSpec
from opd_jax.train.checkpoint.manager import Checkpointer
from opd_jax.train.step import TrainState
from opd_jax.train.versions import WeightVersions


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
