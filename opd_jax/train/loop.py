"""The OPD training run as a recipe: the spec, the run's setup (opd_jax/train/setup.py), the workdir, resume, then a
short loop around the jitted train step with periodic work (metrics rows, evaluations, checkpoints) as hooks.

One step: the rollout batch of this step's weight version (opd_jax/train/versions.py: sampled with the mismatch
knobs, scored by its teacher), the train step, the new version published, then whatever hook is due.
Teardown runs through one ExitStack in reverse order of setup.
"""

from __future__ import annotations

import contextlib
import os
import time

import jax

from opd_jax.files import write_text
from opd_jax.prepare.pair import prepare_pair
from opd_jax.spec import RunSpec
from opd_jax.train import distributed
from opd_jax.train import malloc
from opd_jax.train import served as served_lib
from opd_jax.train.checkpoint.manager import Checkpointer
from opd_jax.train.evaluator import Evaluator
from opd_jax.train.export import export_student
from opd_jax.train.interval import Interval
from opd_jax.train.logging import MetricsWriter
from opd_jax.train.preemption import Preemption
from opd_jax.train.resume import check_new_or_same_run, resume, run_meta
from opd_jax.train.setup import Run, build_run
from opd_jax.train.skip_guard import SkipGuard
from opd_jax.train.versions import WeightVersions
from opd_jax.train.workdir_lock import WorkdirLock


def train(config, workdir: str) -> dict:
  """Runs OPD as configured (a RunSpec, or a ConfigDict: its pair is prepared and its spec made here, the entry
  points' boundary); writes workdir/metrics.jsonl, TensorBoard events and checkpoints. Returns the final
  evaluation row."""
  if not isinstance(config, RunSpec):
    prepare_pair(config)  # a config that says how makes its teacher / student dirs first (opd_jax/prepare)
    config = RunSpec.from_config(config)
  spec, t = config, config.train
  check_new_or_same_run(workdir, spec)  # before anything is written
  with contextlib.ExitStack() as stack:
    run = build_run(spec, stack)
    versions = WeightVersions(spec, run.programs.weight_sync, run.producer, run.prompts)
    preflight = _preflight(run, versions)  # a served teacher against its checkpoint, before anything is written

    # Everything above only reads; the workdir is created here, after every input was loaded and checked.
    preemption, checkpointer = _open_workdir(workdir, t.keep_checkpoints, stack)
    resumed = resume(checkpointer, spec, run.state, versions, run.prompts)
    state, start_step = resumed.state, resumed.step or 0
    writer = _open_writer(workdir, run, resumed.step, stack)
    evaluate, final = Evaluator(run, writer), {}
    if start_step == 0:
      final = evaluate(state.params, 0)  # with train.steps = 0 this evaluation is the whole run
      writer.write(0, final)

    data_state = run.prompts.get_state()  # read before a producer thread starts drawing from the pipeline
    stack.callback(versions.close)  # registered last, closed first: the producer thread stops before the rest
    versions.start(state.params, start_step)
    interval, clock = Interval(run, writer, resumed.pending), _Clock(resumed.train_s)
    skip_guard = SkipGuard(t.max_skipped_steps, writer.warn, checkpointer.directory)
    reached, version = False, start_step
    heap = malloc.HeapTrim(t.malloc_trim, t.malloc_trim_growth_gb, wait=checkpointer.finish_save)

    def log_row(version: int) -> None:
      writer.write(version, interval.row(state, data_state))

    def evaluation(version: int) -> None:
      nonlocal final, reached
      start = time.time()
      final = evaluate(state.params, version)
      heap.trim()
      final["time/train_s"] = clock.train_s(start)
      writer.write(version, final)
      clock.pause(time.time() - start)
      interval.pause(time.time() - start)
      reached = bool(t.target_accuracy) and final.get("eval/accuracy", 0.0) >= t.target_accuracy

    hooks = [(t.log_every, log_row), (t.eval_every, evaluation)]  # (every, hook(version)), in this order
    for step in range(start_step, t.steps):
      produced = versions.next_batch(step, state.params)
      data_state = produced.data_state
      state, metrics = _update(run.programs.train_step, state, produced.batch, run.teacher_state)
      heap.after_step(writer.warn)  # a heap grown between saves is trimmed (train.malloc_trim_growth_gb)
      metrics.update(preflight if step == start_step else {})  # a served teacher's preflight, in the first interval
      skip_guard.observe(step + 1, metrics["skipped"])
      metrics["rollout/version_lag"] = step - produced.version
      metrics.update(produced.engine)
      interval.add(metrics, produced)
      version = step + 1
      versions.publish(version, state.params)
      writer.advance()
      for every, hook in hooks:
        if t.is_due(every, version):
          hook(version)
      preempted = preemption.reached(version)  # every step, on every process (JAX's sync point)
      stopping = reached or preempted or (t.stop_after_steps and version - start_step >= t.stop_after_steps)
      if t.is_due(t.checkpoint_every, version) or stopping:
        checkpointer.save(version, {"train": state, "snapshots": versions.snapshots.state_dict()},
                          run_meta(spec, step=version, data_state=data_state, pending=interval.pending,
                                   versions=versions, train_s=clock.train_s(time.time())))
        heap.trim()
      if stopping:
        break
    skip_guard.flush()
    if preemption.requested() and start_step < t.steps and version < t.steps:
      raise preemption.stopped(version, checkpointer.directory)
    if t.export_dtype and start_step < t.steps and version == t.steps:  # the student as an HF checkpoint
      heap.trim()
      export_student(run.graphdef, state.params, spec.pair.student, os.path.join(workdir, "export"),
                     spec.pair.tokenizer or None, dtype=t.export_dtype)
  return final


def _update(train_step, state, batch, teacher_state):
  """(state, metrics) of one train step, waited for, with its wall time in metrics["perf/update_s"] (beside the
  batch's perf/sample_s and perf/score_s): where a step's time goes, in every metrics row."""
  start = time.perf_counter()
  state, metrics = jax.block_until_ready(train_step(state, batch, teacher_state))
  return state, {**metrics, "perf/update_s": time.perf_counter() - start}


def _open_workdir(workdir: str, keep_checkpoints: int, stack: contextlib.ExitStack):
  """(preemption, checkpointer) of a workdir created and locked here (a second trainer on it exits 2); SIGTERM /
  SIGINT from here on finish the step in flight, checkpoint it and stop (opd_jax/train/preemption.py)."""
  os.makedirs(workdir, exist_ok=True)
  stack.enter_context(WorkdirLock(workdir, enabled=distributed.is_main()))
  preemption = stack.enter_context(Preemption(processes=jax.process_count()))
  checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), keep=keep_checkpoints)
  stack.callback(checkpointer.close)
  return preemption, checkpointer


def _open_writer(workdir: str, run: Run, resume_step: int | None, stack: contextlib.ExitStack) -> MetricsWriter:
  """metrics.jsonl (cut back to the resumed step), TensorBoard and the progress bar, on process 0; the run's
  config.json beside them."""
  t = run.spec.train
  writer = MetricsWriter(workdir, resume_step=resume_step, total_steps=t.steps, progress_bar=t.progress_bar,
                         enabled=distributed.is_main())
  stack.callback(writer.close)
  for teacher in run.teachers.served:
    teacher.served.warn = writer.warn  # outage warnings above the progress bar
  if distributed.is_main():
    write_text(os.path.join(workdir, "config.json"), run.spec.config_json)
  return writer


def _preflight(run: Run, versions: WeightVersions) -> dict:
  """Each served teacher's scores of the run's first batch against its checkpoint's in this process (the prompt
  pipeline is rewound after; refused before anything is written). {} without one or with preflight 'off'."""
  served = run.teachers.served
  if not served or run.spec.served.preflight == "off":
    return {}
  first_state = run.prompts.get_state()
  first = run.producer.produce(0, 0, versions.snapshot_of(run.state.params, 0), next(run.prompts))
  run.prompts.set_state(first_state)
  if run.producer.cross is not None:  # a teacher of another tokenizer: the first batch in its own tokens
    first = run.producer.cross.teacher_batch()
  row = {}
  for teacher in served:
    row.update(served_lib.preflight(run.spec.served, teacher.served, teacher.score, teacher.state, first,
                                    teacher.served.warn, teacher.name if run.teachers.multi else ""))
  return row


class _Clock:
  """time/train_s: wall-clock of the loop, evaluations excluded, summed over the run's (re)starts."""

  def __init__(self, before: float):
    self._before, self._start, self._paused = before, time.time(), 0.0

  def pause(self, seconds: float) -> None:
    self._paused += seconds

  def train_s(self, now: float) -> float:
    return self._before + now - self._start - self._paused

