"""The OPD training run, top to bottom: config checks, mesh, models, data, learner, checkpoints, loop, evals."""

from __future__ import annotations

import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from opd_jax.data.problems import get_problems
from opd_jax.data.task import ArithmeticTask
from opd_jax.models import load_pretrained, load_tokenizer, read_hf_config
from opd_jax.models import sharding as shard_lib
from opd_jax.objectives.losses import ObjectiveConfig
from opd_jax.rollout.config import RolloutConfig
from opd_jax.rollout.sampler import Sampler, SamplingConfig
from opd_jax.rollout.snapshots import SnapshotStore
from opd_jax.train import distributed, evaluation
from opd_jax.train.checkpointing import Checkpointer
from opd_jax.train.data import PromptPipeline
from opd_jax.train.logging import MetricsWriter
from opd_jax.train.optimizer import make_optimizer, make_schedule
from opd_jax.train.rollouts import AsyncRollouts, Produced, RolloutProducer
from opd_jax.train.step import TrainState, train_step

MODES = ("sync", "async")


def check_config(config, device_count: int | None = None) -> tuple[RolloutConfig, ObjectiveConfig]:
  """Every config mistake that can be found without loading a model, each naming its field."""
  rollout = RolloutConfig.from_config(config.rollout)
  objective = ObjectiveConfig(**dict(config.objective))
  t, m = config.train, config.mesh
  if t.mode not in MODES:
    raise ValueError(f"train.mode must be one of {MODES}, got {t.mode!r}")
  if t.mode == "async" and rollout.staleness_steps:
    raise ValueError("rollout.staleness_steps is a sync-mode knob; in async mode staleness comes from the "
                     "producer running ahead (bounded by train.max_staleness)")
  for field in ("steps", "batch_size", "log_every", "eval_every", "eval_size", "eval_batch_size",
                "checkpoint_every", "keep_checkpoints"):
    if not isinstance(t[field], int) or t[field] < 1:
      raise ValueError(f"train.{field} must be a positive integer, got {t[field]!r}")
  for field in ("logits_chunk", "micro_batch_size"):
    if not isinstance(t[field], int) or t[field] < 0:
      raise ValueError(f"train.{field} must be an integer >= 0 (0 = off), got {t[field]!r}")
  if t.micro_batch_size and t.batch_size % t.micro_batch_size:
    raise ValueError(f"train.micro_batch_size={t.micro_batch_size} does not divide train.batch_size="
                     f"{t.batch_size}; pick a divisor (or 0 for no micro-batching)")
  data, _, _ = shard_lib.mesh_shape(m.data, m.fsdp, m.tensor, device_count or jax.device_count())
  group = objective.prompts_per_batch_divisor
  if t.batch_size % group:
    raise ValueError(f"train.batch_size={t.batch_size} is not divisible by objective.group_size={group} "
                     "(grpo samples every prompt group_size times); change one of them")
  for field in ("batch_size", "eval_batch_size", "micro_batch_size"):
    if t[field] % (data * m.fsdp):
      raise ValueError(f"train.{field}={t[field]} is not divisible by the mesh's batch ways "
                       f"data*fsdp={data}*{m.fsdp}; change train.{field} or mesh.data/mesh.fsdp")
  teacher, student = read_hf_config(config.teacher), read_hf_config(config.student)  # errors name the file
  if teacher.vocab_size != student.vocab_size:
    raise ValueError(f"teacher vocab_size {teacher.vocab_size} != student vocab_size {student.vocab_size}: OPD "
                     "scores the student's tokens with the teacher, so the pair must share a tokenizer")
  if config.data.source not in ("arithmetic", "jsonl"):
    raise ValueError(f"data.source must be 'arithmetic' or 'jsonl', got {config.data.source!r}")
  if config.data.source == "jsonl":
    for field in ("train_file", "heldout_file"):
      if not os.path.isfile(config.data[field]):
        raise ValueError(f"data.{field}={config.data[field]!r} is not a file (data.source='jsonl' needs it)")
  return rollout, objective


def load_model(config, role: str, mesh=None):
  """The config's teacher or student (role), in its param / compute dtypes with the config's model options,
  each tensor placed straight onto its shards of `mesh` when given."""
  sharding_for = shard_lib.loader_shardings(mesh) if mesh is not None else None
  m = config.model
  return load_pretrained(config[role], config[f"{role}_param_dtype"], compute_dtype=config[f"{role}_compute_dtype"],
                         sharding_for=sharding_for, attention=m.attention, remat=m.remat, scan_layers=m.scan_layers)


def _task(config) -> ArithmeticTask:
  d = config.data
  return ArithmeticTask(d.min_terms, d.max_terms, d.min_digits, d.max_digits)


def train(config, workdir: str) -> dict:
  """Runs OPD as configured; writes workdir/metrics.jsonl, TensorBoard events and checkpoints.

  Returns the final evaluation row.
  """
  rollout, objective = check_config(config)
  if config.train.mode == "async" and jax.process_count() > 1:
    raise ValueError("train.mode='async' samples on a second thread, whose cross-process collectives could "
                     "interleave differently on each process; use train.mode='sync' for multi-process runs")
  os.makedirs(workdir, exist_ok=True)
  t = config.train
  mesh = shard_lib.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
  batch_sharding = shard_lib.batch_sharding(mesh)
  put_batch = functools.partial(distributed.put_global, sharding=batch_sharding)
  replicated = shard_lib.replicated(mesh)

  # Models: the teacher is fixed (own dtypes), the student is the learner (float32 master params, compute in
  # student_compute_dtype); both sharded by the same rules.
  teacher = load_model(config, "teacher", mesh)
  student = load_model(config, "student", mesh)
  teacher_graphdef, teacher_state = nnx.split(teacher)
  graphdef, params = nnx.split(student)
  rollout.validate_for(params)
  tokenizer = load_tokenizer(config.tokenizer or config.student)
  eos_ids = tuple(student.config.eos_token_id) or (tokenizer.eos_token_id,)
  pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]

  # Data.
  d = config.data
  train_problems = get_problems(d.source, "train", d.train_size, d.seed, _task(config), d.train_file, d.heldout_file)
  heldout = get_problems(d.source, "heldout", t.eval_size, d.seed, _task(config), d.train_file, d.heldout_file)
  group = objective.prompts_per_batch_divisor  # grpo: each prompt is sampled `group` times per batch
  prompts = PromptPipeline(train_problems, tokenizer, batch_size=t.batch_size // group,
                           max_prompt_tokens=d.max_prompt_tokens, seed=d.seed,
                           use_chat_template=d.use_chat_template)

  # Learner.
  o = config.optimizer
  schedule = make_schedule(learning_rate=o.learning_rate, warmup_steps=o.warmup_steps, total_steps=t.steps,
                           end_lr_fraction=o.end_lr_fraction)
  optimizer = make_optimizer(schedule, weight_decay=o.weight_decay, grad_clip_norm=o.grad_clip_norm)
  state = TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))
  state_shardings = shard_lib.state_shardings(state, mesh)
  state = jax.device_put(state, state_shardings)
  teacher_shardings = shard_lib.state_shardings(teacher_state, mesh)
  step_fn = jax.jit(functools.partial(train_step, graphdef, optimizer, objective, rollout.temperature,
                                      objective.is_cap, teacher_graphdef=teacher_graphdef,
                                      logits_chunk=t.logits_chunk, micro_batch_size=t.micro_batch_size),
                    in_shardings=(state_shardings, batch_sharding, teacher_shardings),
                    out_shardings=(state_shardings, replicated), donate_argnums=(0,))

  vocab_k = student.config.vocab_size if t.vocab_metrics_top_k == -1 else t.vocab_metrics_top_k
  sampler = Sampler(graphdef, rollout.sampling(eos_ids=eos_ids, pad_id=pad_id, logits_top_k=vocab_k))
  producer = RolloutProducer(student_graphdef=graphdef, teacher_graphdef=teacher_graphdef,
                             teacher_state=teacher_state, rollout=rollout, sampler=sampler, objective=objective,
                             put_batch=put_batch, seed=config.seed, logits_chunk=t.logits_chunk,
                             split_mismatch=rollout.staleness_steps > 0 or t.mode == "async",
                             reward_fn=evaluation.answer_reward_fn(tokenizer, train_problems) if group > 1 else None,
                             group_size=group)

  # Evaluation: the student's own greedy and sampled answers, no mismatch knobs.
  eval_samplers = {"": Sampler(graphdef, SamplingConfig(max_new_tokens=rollout.max_new_tokens, temperature=0.0,
                                                        eos_ids=eos_ids, pad_id=pad_id))}
  if t.eval_sampled:
    eval_samplers["_sampled"] = Sampler(graphdef, SamplingConfig(max_new_tokens=rollout.max_new_tokens,
                                                                 temperature=1.0, eos_ids=eos_ids, pad_id=pad_id))
  reverse_kl_fn = evaluation.make_reverse_kl_fn(graphdef, teacher_graphdef, teacher_state, t.logits_chunk)

  def run_eval(params) -> dict:
    row, start = {}, time.time()
    for suffix, eval_sampler in eval_samplers.items():
      result = evaluation.evaluate(eval_sampler, params, tokenizer, heldout, max_prompt_tokens=d.max_prompt_tokens,
                                   batch_size=t.eval_batch_size, key=jax.random.key(config.seed + 7),
                                   use_chat_template=d.use_chat_template, put=put_batch,
                                   reverse_kl_fn=reverse_kl_fn if suffix == "_sampled" else None)
      row.update({f"eval/{k}{suffix}" if k != "reverse_kl" else "eval/reverse_kl": v for k, v in result.items()})
    row["eval/seconds"] = time.time() - start
    return row

  # Checkpoints, snapshots, resume.
  # Versions count loop steps (batches consumed), also across skipped non-finite updates.
  needs_copies = rollout.staleness_steps > 0 or t.mode == "async"
  snapshots = SnapshotStore(capacity=rollout.staleness_steps + 1)  # sync mode only
  checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), keep=t.keep_checkpoints)
  start_step, restored_pending = 0, []
  latest = checkpointer.latest_step()
  if latest is not None and not t.resume:
    raise ValueError(f"workdir {workdir!r} already holds checkpoints (step {latest}) and train.resume=False; "
                     "use a new --workdir, or resume")
  if latest is not None:
    meta = checkpointer.restore_meta(latest)
    _check_same_run(meta, config)
    abstract = {"train": state, "snapshots": {str(v): state.params for v in meta["snapshot_versions"]}}
    arrays, meta = checkpointer.restore(latest, abstract)
    state = arrays["train"]
    snapshots.load_state_dict(arrays["snapshots"])
    prompts.set_state(meta["data_state"])
    start_step = int(meta["step"])
    restored_pending = meta["pending_metrics"]
  copy = (lambda tree: jax.tree.map(jnp.copy, tree)) if needs_copies else (lambda tree: tree)
  if t.mode == "sync" and not snapshots.versions():
    snapshots.push(start_step, copy(state.params))

  writer = MetricsWriter(workdir, resume_step=latest, total_steps=t.steps, progress_bar=t.progress_bar,
                         enabled=distributed.is_main())
  if distributed.is_main():
    _write_run_info(workdir, config)
  if start_step == 0:
    writer.write(0, run_eval(state.params))

  last_data_state = prompts.get_state()  # read before a producer thread starts drawing from the pipeline
  asynchronous = None
  if t.mode == "async":
    asynchronous = AsyncRollouts(producer, prompts, start_index=start_step, max_staleness=t.max_staleness,
                                 initial_version=start_step, initial_params=copy(state.params))
  # Metrics of the steps since the last log row; kept in checkpoints so a resumed interval averages the same.
  pending, interval_start, interval_tokens, interval_steps = list(restored_pending), time.time(), 0.0, 0
  final = {}
  try:
    for step in range(start_step, t.steps):
      if asynchronous is not None:
        produced = asynchronous.get()
      else:
        version, sampler_params = snapshots.get(rollout.staleness_steps)
        batch = producer.produce(step, version, sampler_params, next(prompts))
        produced = Produced(step, version, batch, prompts.get_state())
      last_data_state = produced.data_state
      state, metrics = step_fn(state, produced.batch, teacher_state)
      metrics["rollout/version_lag"] = step - produced.version
      pending.append(metrics)
      interval_tokens += produced.batch.mask_BxR.sum()
      interval_steps += 1
      new_version = step + 1
      if asynchronous is not None:
        asynchronous.publish(new_version, copy(state.params))
      elif rollout.staleness_steps:
        snapshots.push(new_version, copy(state.params))
      else:
        snapshots.push(new_version, state.params)
      writer.advance()
      done = new_version == t.steps
      if new_version % t.log_every == 0 or done:
        row = _average(jax.device_get(pending))
        elapsed = time.time() - interval_start
        row["perf/step_s"] = elapsed / max(interval_steps, 1)
        row["perf/tokens_per_s"] = float(interval_tokens) / elapsed
        row["learning_rate"] = float(schedule(int(state.step) - 1))  # what the interval's last update used
        writer.write(new_version, row)
        pending, interval_start, interval_tokens, interval_steps = [], time.time(), 0.0, 0
      if new_version % t.eval_every == 0 or done:
        eval_start = time.time()
        final = run_eval(state.params)
        writer.write(new_version, final)
        interval_start += time.time() - eval_start  # evaluation time is not training throughput
      stopping = t.stop_after_steps and new_version - start_step >= t.stop_after_steps
      if new_version % t.checkpoint_every == 0 or done or stopping:
        saved_pending = [{k: float(v) for k, v in row.items()} for row in jax.device_get(pending)]  # JSON form
        checkpointer.save(new_version, {"train": state, "snapshots": snapshots.state_dict()},
                          {"step": new_version, "data_state": last_data_state, "pending_metrics": saved_pending,
                           "snapshot_versions": snapshots.versions(), "pair": config.pair,
                           "steps": t.steps, "batch_size": t.batch_size, "mode": t.mode,
                           "staleness_steps": rollout.staleness_steps})
      if stopping:
        break
  finally:
    if asynchronous is not None:
      asynchronous.close()
    checkpointer.close()
    writer.close()
  return final


def _average(rows: list[dict]) -> dict:
  """Mean of each metric over the rows that report it."""
  keys = dict.fromkeys(k for r in rows for k in r)
  return {k: float(np.mean([float(r[k]) for r in rows if k in r])) for k in keys}


def _check_same_run(meta: dict, config) -> None:
  for key, value in (("batch_size", config.train.batch_size), ("steps", config.train.steps),
                     ("mode", config.train.mode), ("staleness_steps", config.rollout.staleness_steps)):
    if meta.get(key) != value:
      raise ValueError(f"workdir holds a checkpoint of a run with train.{key}={meta.get(key)}, but this config "
                       f"has {value}; use a new --workdir or set --config.train.resume=False")


def _write_run_info(workdir: str, config) -> None:
  path = os.path.join(workdir, "config.json")
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.write(config.to_json(indent=2))
  os.replace(tmp, path)
