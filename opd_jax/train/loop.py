"""The OPD training run, top to bottom: mesh, models, data, learner, checkpoints, loop, evals (the config checks it
runs first are in opd_jax.train.config_checks)."""

from __future__ import annotations

import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from opd_jax.data.problems import get_problems, parse_mix
from opd_jax.data.task import ArithmeticTask, Problem
from opd_jax.errors import InputError
from opd_jax.models import load_tokenizer
from opd_jax.models import sharding as shard_lib
from opd_jax.rollout import placement
from opd_jax.rollout.snapshots import SnapshotStore
from opd_jax.train import device_memory, distributed, evaluation, programs
from opd_jax.train import served as served_lib
from opd_jax.train import teachers as teachers_lib
from opd_jax.train.config_checks import check_config, check_workdir, response_group
from opd_jax.train.checkpointing import Checkpointer
from opd_jax.train.data import PromptPipeline
from opd_jax.train.export import export_student
from opd_jax.train.load import load_model
from opd_jax.train.logging import MetricsWriter
from opd_jax.train.optimizer import make_optimizer, make_schedule
from opd_jax.train.preemption import Preemption
from opd_jax.train.rollouts import AsyncRollouts, Produced, RolloutProducer
from opd_jax.train.skip_guard import SkipGuard
from opd_jax.train.step import TrainState
from opd_jax.train.workdir_lock import WorkdirLock

def _task(config) -> ArithmeticTask:
  d = config.data
  return ArithmeticTask(d.min_terms, d.max_terms, d.min_digits, d.max_digits)


def train(config, workdir: str) -> dict:
  """Runs OPD as configured; writes workdir/metrics.jsonl, TensorBoard events and checkpoints.

  Returns the final evaluation row.
  """
  rollout, objective, vocab = check_config(config)
  check_workdir(workdir)
  if config.train.mode == "async" and jax.process_count() > 1:
    raise InputError("train.mode='async' samples on a second thread, whose cross-process collectives could "
                     "interleave differently on each process; use train.mode='sync' for multi-process runs")
  if rollout.placement == "disaggregated" and jax.process_count() > 1:
    raise InputError("rollout.placement='disaggregated' is single-process for now (the sampler's devices would "
                     "belong to some processes only); use rollout.placement='colocated' for multi-process runs")
  t = config.train
  # Devices: the learner's mesh (data x fsdp x tensor) and the sampler's (data x tensor, inference layout).
  learner_devices, sampler_devices = placement.split_devices(rollout.placement, rollout.devices)
  mesh = shard_lib.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, devices=learner_devices)
  sampler_mesh = placement.sampler_mesh(sampler_devices, rollout.tensor_parallel)
  batch_sharding = shard_lib.batch_sharding(mesh)
  put_batch = functools.partial(distributed.put_global, sharding=batch_sharding)
  put_sampler_batch = functools.partial(distributed.put_global, sharding=placement.batch_sharding(sampler_mesh))

  # Models: the teacher is fixed (own dtypes), the student is the learner (float32 master params, compute in
  # student_compute_dtype); both sharded by the same rules.
  teacher = load_model(config, "teacher", mesh, vocab)
  student = load_model(config, "student", mesh, vocab)
  teacher_graphdef, teacher_state = nnx.split(teacher)
  graphdef, params = nnx.split(student)
  rollout.validate_for(params)
  tokenizer = load_tokenizer(config.tokenizer or config.student)
  served = served_lib.connect(config, objective, student.config.vocab_size, tokenizer)  # None: score in-process
  eos_ids = tuple(student.config.eos_token_id) or (tokenizer.eos_token_id,)
  pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]

  # Data.
  d = config.data
  train_problems = get_problems(d.source, "train", d.train_size, d.seed, _task(config), d.train_file, d.heldout_file)
  heldout = get_problems(d.source, "heldout", t.eval_size, d.seed, _task(config), d.train_file, d.heldout_file)
  if t.target_accuracy and all(p.answer is None for p in heldout):
    raise InputError(f"train.target_accuracy={t.target_accuracy} needs held-out problems with answers, but none of "
                     f"the {len(heldout)} in data.heldout_file={d.heldout_file!r} has one; set it to 0")
  group = response_group(rollout, objective)  # responses per distinct prompt in a batch
  prompts = PromptPipeline(train_problems, tokenizer, batch_size=t.batch_size // group,
                           max_prompt_tokens=d.max_prompt_tokens, seed=d.seed,
                           use_chat_template=d.use_chat_template, mix=parse_mix(d.mix))

  # Learner.
  o = config.optimizer
  schedule = make_schedule(learning_rate=o.learning_rate, warmup_steps=o.warmup_steps, total_steps=max(t.steps, 1),
                           end_lr_fraction=o.end_lr_fraction)
  optimizer = make_optimizer(schedule, weight_decay=o.weight_decay, grad_clip_norm=o.grad_clip_norm)
  state = TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))

  # Every program of the run (opd_jax/train/programs.py: the same builders the memory planner compiles): train
  # step, weight sync + rollout sampler (the sampler's weights come from the learner through one sync per
  # version, recipe applied on the learner's devices, then resharded onto the sampler's mesh), teacher scoring,
  # evaluation samplers and KL.
  settings = programs.RunSettings.from_config(config, rollout, objective, vocab_size=student.config.vocab_size,
                                              group_size=group, eos_ids=eos_ids, pad_id=pad_id,
                                              batch_shards=mesh.shape["data"] * mesh.shape["fsdp"])
  run = programs.build(settings, graphdef=graphdef, teacher_graphdef=teacher_graphdef, state=state,
                       teacher_state=teacher_state, optimizer=optimizer, mesh=mesh, sampler_mesh=sampler_mesh,
                       compute_dtype=student.dtype)
  state = jax.device_put(state, run.state_shardings)
  step_fn, weight_sync = run.train_step, run.weight_sync
  # Multi-teacher runs (config.teachers; opd_jax/train/teachers.py): every prompt is scored by its own teacher.
  routed, routes = None, {}
  if teachers_lib.is_multi(config):
    main = teachers_lib.RoutedTeacher(config.routing.teacher_name, teacher_graphdef, teacher_state,
                                      run.teacher_score, served, run.eval_reverse_kl)
    try:
      routed = teachers_lib.connect(config, main, student_graphdef=graphdef, settings=settings, objective=objective,
                                    tokenizer=tokenizer, mesh=mesh, put_batch=put_batch,
                                    load=lambda path, own: load_model(config, "teacher", mesh, own, path))
      routes = {"train": teachers_lib.route_problems(config, train_problems, "training"),
                "heldout": teachers_lib.route_problems(config, heldout, "held-out")}
    except BaseException:
      if served is not None:
        served.close()
      if routed is not None:
        routed.close()
      raise
  producer = RolloutProducer(student_graphdef=graphdef, teacher_graphdef=teacher_graphdef,
                             teacher_state=teacher_state, rollout=rollout, sampler=run.sampler, objective=objective,
                             put_batch=put_batch, put_sampler_batch=put_sampler_batch, learner_rows=batch_sharding,
                             seed=config.seed, logits_chunk=settings.logits_chunk,
                             reward_fn=evaluation.answer_reward_fn(tokenizer, train_problems)
                             if objective.prompts_per_batch_divisor > 1 else None, group_size=group,
                             teacher_score=run.teacher_score, student_score=run.student_score,
                             served_teacher=served, teachers=routed, routes=routes.get("train"))
  # Split the mismatch into precision/noise and staleness factors: score each batch with the dense learner
  # version that generated it too (costs one dense copy per kept version; only when lag and knobs coexist).
  split = rollout.keeps_dense_copies(lagged=rollout.staleness_steps > 0 or t.mode == "async")

  def snapshot_of(params, version: int) -> dict:
    """What produce() needs of one learner version; shares no buffer with `params` (the step donates them)."""
    snapshot = {"sampler": weight_sync(params, version)}
    if split:
      snapshot["dense"] = jax.tree.map(jnp.copy, params)
    return snapshot

  def abstract_snapshot() -> dict:
    snapshot = {"sampler": weight_sync.abstract}
    if split:
      snapshot["dense"] = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                                       state.params)
    return snapshot

  # Evaluation: the student's own greedy and sampled answers, no mismatch knobs; optionally the teacher's greedy
  # responses (made once) scored by the student (teacher-forced KL) and graded (the teacher's accuracy).
  eval_samplers, reverse_kl_fn, forward_kl_fn = run.eval_samplers, run.eval_reverse_kl, run.eval_forward_kl
  teacher_reference = []  # [Responses] of the teacher, once made

  def run_eval(params, step: int) -> dict:
    row, start = {}, time.time()
    common = dict(max_prompt_tokens=d.max_prompt_tokens, batch_size=t.eval_batch_size, use_chat_template=
                  d.use_chat_template, put=put_batch, key=jax.random.key(config.seed + 7))
    # train.eval_weights='sampler': decode with the rollout engine's weights of this version on its mesh.
    on_sampler = (dict(sampler_state=weight_sync(params, step), put_sampler=put_sampler_batch)
                  if t.eval_weights == "sampler" else {})
    samples = []
    if t.eval_teacher_forced and not teacher_reference:
      teacher_reference.append(evaluation.Responses([], []))
      result = evaluation.evaluate(run.teacher_greedy, teacher_state, tokenizer, heldout,
                                   keep=teacher_reference[0], **common)
      row.update({f"eval/teacher_{k}": v for k, v in result.items()})
      samples += _sample_rows("teacher", heldout[:t.eval_samples], teacher_reference[0].texts)
    for suffix, eval_sampler in eval_samplers.items():
      kept = evaluation.Responses([], []) if not suffix else None
      kl = {} if suffix != "_sampled" else dict(kl_fn=reverse_kl_fn, teacher_state=teacher_state) if routed is None \
          else dict(routes=routes["heldout"], teachers_kl=[(x.kl_fn, x.state) for x in routed.teachers])
      result = evaluation.evaluate(eval_sampler, params, tokenizer, heldout, **common, **on_sampler, keep=kept, **kl)
      if "kl" in result:
        row["eval/reverse_kl"] = result.pop("kl")
      for n, value in result.pop("kl_by_teacher", {}).items():  # each held-out prompt against its own teacher
        row[f"eval/teachers/{routed.names[n]}/reverse_kl"] = value
      row.update({f"eval/{k}{suffix}": v for k, v in result.items()})
      if kept is not None:
        samples += _sample_rows("student", heldout[:t.eval_samples], kept.texts)
    if teacher_reference:
      row["eval/teacher_forced_kl"] = evaluation.kl_on(teacher_reference[0], forward_kl_fn, params, teacher_state)
    writer.write_samples(step, samples)
    row["eval/seconds"] = time.time() - start
    return row

  # Checkpoints, snapshots, resume.
  # Versions count loop steps (batches consumed), also across skipped non-finite updates. Sync mode with lag
  # keeps the last staleness_steps + 1 versions' snapshots; without lag each step syncs the version it uses.
  snapshots = SnapshotStore(capacity=rollout.staleness_steps + 1, on=rollout.snapshots_on)
  # A served teacher's preflight: its scores of the run's first batch against config.teacher's in this process
  # (the prompt pipeline is rewound after; refused before anything is written).
  preflight = {}
  clients = [(x.name, x.served, x.score, x.state) for x in routed.teachers] if routed is not None else [
      ("", served, run.teacher_score, teacher_state)]
  clients = [c for c in clients if c[1] is not None]  # (name, client, in-process scoring, state) of served ones
  if clients and config.served_teacher.preflight != "off":
    try:
      first_state = prompts.get_state()
      first = producer.produce(0, 0, snapshot_of(state.params, 0), next(prompts))
      prompts.set_state(first_state)
      for name, client, score, scored_state in clients:
        preflight.update(served_lib.preflight(config, client, score, scored_state, first, client.warn, name))
      del first
    except BaseException:
      for _, client, _, _ in clients:
        client.close()
      raise

  # Everything above only reads; the workdir is created here, after every input was loaded and checked.
  os.makedirs(workdir, exist_ok=True)
  lock = WorkdirLock(workdir, enabled=distributed.is_main()).acquire()  # a second trainer here exits 2 at once
  checkpointer = writer = asynchronous = None
  # SIGTERM / SIGINT from here on: finish the step in flight, checkpoint it, stop (opd_jax/train/preemption.py).
  preemption = Preemption(processes=jax.process_count()).__enter__()
  try:
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), keep=t.keep_checkpoints)
    start_step, restored_pending, resume_step, train_s_before = 0, [], None, 0.0
    latest = checkpointer.latest_step()
    if latest is not None and not t.resume:
      raise InputError(f"workdir {workdir!r} already holds checkpoints (step {latest}) and train.resume=False; "
                       "use a new --workdir, or resume")

    def abstract_for(meta: dict):  # a run of another pair or shape is an error, never a fallback
      _check_same_run(meta, config)
      return {"train": state, "snapshots": snapshots.abstract(meta["snapshot_versions"], abstract_snapshot)}

    # Newest intact checkpoint: a damaged newer one is moved aside with a warning naming it.
    restored = checkpointer.restore_latest_intact(abstract_for) if latest is not None else None
    if restored is not None:
      state = restored.arrays["train"]
      snapshots.load_state_dict(restored.arrays["snapshots"])
      prompts.set_state(restored.meta["data_state"])
      start_step = resume_step = int(restored.meta["step"])
      restored_pending = restored.meta["pending_metrics"]
      train_s_before = float(restored.meta.get("train_s", 0.0))  # absent in checkpoints of older versions
    if t.mode == "sync" and rollout.staleness_steps and not snapshots.versions():
      snapshots.push(start_step, snapshot_of(state.params, start_step))

    writer = MetricsWriter(workdir, resume_step=resume_step, total_steps=t.steps, progress_bar=t.progress_bar,
                           enabled=distributed.is_main())
    for _, client, _, _ in clients:
      client.warn = writer.warn  # outage warnings above the progress bar
    if distributed.is_main():
      _write_run_info(workdir, config)
    final = {}
    if start_step == 0:
      final = run_eval(state.params, 0)  # with train.steps = 0 this evaluation is the whole run
      writer.write(0, final)

    last_data_state = prompts.get_state()  # read before a producer thread starts drawing from the pipeline
    if t.mode == "async":
      asynchronous = AsyncRollouts(producer, prompts, start_index=start_step, max_staleness=t.max_staleness,
                                   initial_version=start_step, initial_snapshot=snapshot_of(state.params, start_step))
    # Metrics of the steps since the last log row; kept in checkpoints so a resumed interval averages the same.
    pending, interval_start, interval_tokens, interval_steps = list(restored_pending), time.time(), 0.0, 0
    warned_truncation = False
    loop_start, eval_seconds, reached = time.time(), 0.0, False

    def train_s(now: float) -> float:
      """time/train_s: wall-clock of the loop, evaluations excluded, summed over the run's (re)starts."""
      return train_s_before + now - loop_start - eval_seconds
    skip_guard = SkipGuard(t.max_skipped_steps, writer.warn, checkpointer.directory)
    for step in range(start_step, t.steps):
      if asynchronous is not None:
        produced = asynchronous.get()
      else:
        if rollout.staleness_steps:
          version, snapshot = snapshots.get(rollout.staleness_steps)
        else:
          version, snapshot = step, snapshot_of(state.params, step)
        batch = producer.produce(step, version, snapshot, next(prompts))
        del snapshot  # without lag the sampler's copy is not kept through the train step (as the planner counts)
        produced = Produced(step, version, batch, prompts.get_state())
      last_data_state = produced.data_state
      state, metrics = step_fn(state, produced.batch, teacher_state)
      if step == start_step:
        metrics.update(preflight)  # the served teacher's preflight, logged with the first interval
      skip_guard.observe(step + 1, metrics["skipped"])
      metrics["rollout/version_lag"] = step - produced.version
      pending.append(metrics)
      interval_tokens += produced.batch.mask_BxR.sum()
      interval_steps += 1
      new_version = step + 1
      if asynchronous is not None:
        asynchronous.publish(new_version, snapshot_of(state.params, new_version))
      elif rollout.staleness_steps:
        snapshots.push(new_version, snapshot_of(state.params, new_version))
      writer.advance()
      done = new_version == t.steps
      if new_version % t.log_every == 0 or done:
        row = _average(jax.device_get(pending))
        elapsed = time.time() - interval_start
        row["perf/step_s"] = elapsed / max(interval_steps, 1)
        row["perf/tokens_per_s"] = float(interval_tokens) / elapsed
        row["learning_rate"] = float(schedule(int(state.step) - 1))  # what the interval's last update used
        row["data/prompts_truncated"] = last_data_state["truncated"]  # cut to data.max_prompt_tokens so far
        row.update(device_memory.peak_gib())  # accelerators only: the process's peak so far
        for name, client, _, _ in clients:  # request + response bytes per scored token so far, outages survived
          prefix = f"teachers/{name}/" if name else "teacher/"
          row[prefix + "wire_bytes_per_token"] = client.wire_bytes_per_token()
          row[prefix + "outages"] = client.outages
        if last_data_state["truncated"] and not warned_truncation:
          warned_truncation = True
          writer.warn(f"{last_data_state['truncated']} of {last_data_state['prompts_drawn']} prompts so far were "
                      f"longer than data.max_prompt_tokens={d.max_prompt_tokens} and lost their start "
                      "(data/prompts_truncated)")
        writer.write(new_version, row)
        pending, interval_start, interval_tokens, interval_steps = [], time.time(), 0.0, 0
      if new_version % t.eval_every == 0 or done:
        eval_start = time.time()
        final = run_eval(state.params, new_version)
        final["time/train_s"] = train_s(eval_start)
        writer.write(new_version, final)
        eval_seconds += time.time() - eval_start
        interval_start += time.time() - eval_start  # evaluation time is not training throughput
        reached = bool(t.target_accuracy) and final.get("eval/accuracy", 0.0) >= t.target_accuracy
      preempted = preemption.reached(new_version)  # every step, on every process (JAX's sync point)
      stopping = (reached or preempted or (t.stop_after_steps and new_version - start_step >= t.stop_after_steps))
      if new_version % t.checkpoint_every == 0 or done or stopping:
        saved_pending = [{k: float(v) for k, v in row.items()} for row in jax.device_get(pending)]  # JSON form
        checkpointer.save(new_version, {"train": state, "snapshots": snapshots.state_dict()},
                          {"step": new_version, "data_state": last_data_state, "pending_metrics": saved_pending,
                           "snapshot_versions": snapshots.versions(), "pair": config.pair,
                           "steps": t.steps, "batch_size": t.batch_size, "mode": t.mode,
                           "staleness_steps": rollout.staleness_steps, "train_s": train_s(time.time())})
      if stopping:
        break
    skip_guard.flush()
    if preemption.requested() and start_step < t.steps and new_version < t.steps:
      raise preemption.stopped(new_version, checkpointer.directory)
    if t.export_dtype and start_step < t.steps and new_version == t.steps:  # the student as an HF checkpoint
      export_student(graphdef, state.params, config.student, os.path.join(workdir, "export"),
                     config.tokenizer or None, dtype=t.export_dtype)
  finally:
    preemption.__exit__(None, None, None)
    if asynchronous is not None:
      asynchronous.close()
    if served is not None:
      served.close()
    if routed is not None:
      routed.close()
    if checkpointer is not None:
      checkpointer.close()
    if writer is not None:
      writer.close()
    lock.release()
  return final


def _sample_rows(model: str, problems: list[Problem], texts: list[str]) -> list[dict]:
  """samples.jsonl rows: one per problem, with its grade where it has an answer."""
  rows = []
  for problem, text in zip(problems, texts):
    row = {"model": model, "prompt": problem.prompt, "response": text}
    if problem.answer is not None:
      row.update(answer=problem.answer, correct=evaluation.grade(text, problem))
    rows.append(row)
  return rows


def _average(rows: list[dict]) -> dict:
  """Mean of each metric over the rows that report it."""
  keys = dict.fromkeys(k for r in rows for k in r)
  return {k: float(np.mean([float(r[k]) for r in rows if k in r])) for k in keys}


def _check_same_run(meta: dict, config) -> None:
  if meta.get("pair") != config.pair:
    raise InputError(f"workdir holds a run of pair {meta.get('pair')!r}, but this config is pair {config.pair!r}; "
                     "use a new --workdir")
  for key, field, value in (("batch_size", "train.batch_size", config.train.batch_size),
                            ("steps", "train.steps", config.train.steps), ("mode", "train.mode", config.train.mode),
                            ("staleness_steps", "rollout.staleness_steps", config.rollout.staleness_steps)):
    if meta.get(key) != value:
      raise InputError(f"workdir holds a checkpoint of a run with {field}={meta.get(key)}, but this config "
                       f"has {value}; use a new --workdir or the run's own {field}")


def _write_run_info(workdir: str, config) -> None:
  path = os.path.join(workdir, "config.json")
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.write(config.to_json(indent=2))
  os.replace(tmp, path)
