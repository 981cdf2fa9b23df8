"""A run's setup: everything the loop needs, built once from a RunSpec (`build_run`), reading only.

Devices: the learner's mesh (data x fsdp x tensor) and the sampler's (data x tensor, inference layout). Models:
the teacher is fixed (own dtypes), the student is the learner (float32 master params, compute in
student_compute_dtype); both sharded by the same rules. Programs: every one of the run comes from
opd_jax/train/programs.py, the same builders the memory planner compiles. Teachers: config.teacher and any
others as one `TeacherSet` (in process or served). Nothing is written here; whatever holds a connection is
registered on the caller's ExitStack, so a failure later in setup closes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from opd_jax.crosstok import scoring as crosstok
from opd_jax.data.problems import get_problems
from opd_jax.data.stop_tokens import stop_token_ids
from opd_jax.data.task import Problem
from opd_jax.errors import InputError
from opd_jax.models import load_tokenizer, read_hf_config
from opd_jax.models import sharding as shard_lib
from opd_jax.rollout import placement
from opd_jax.spec import RunSpec
from opd_jax.train import distributed, evaluation, programs
from opd_jax.train import served as served_lib
from opd_jax.train import teachers as teachers_lib
from opd_jax.train.data import PromptPipeline
from opd_jax.train.load import load_model
from opd_jax.train.optimizer import make_optimizer, make_schedule
from opd_jax.train.rollouts import RolloutProducer
from opd_jax.train.step import TrainState


@dataclasses.dataclass
class Run:
  """What `build_run` made: placement, models, data, learner state, programs, teachers and the producer."""
  spec: RunSpec
  mesh: object
  put_batch: object  # host batch -> the learner's batch layout
  put_sampler_batch: object  # host batch -> the sampler's batch layout
  graphdef: object
  state: TrainState
  teacher_state: object
  tokenizer: object
  heldout: list[Problem]
  heldout_routes: np.ndarray | None  # each held-out problem's teacher (routed runs)
  prompts: PromptPipeline
  schedule: object  # step -> learning rate
  programs: programs.RunPrograms
  teachers: teachers_lib.TeacherSet
  producer: RolloutProducer


def build_run(spec: RunSpec, stack: contextlib.ExitStack) -> Run:
  """The run of `spec` (module docstring); served teachers' clients are closed by `stack`."""
  t, d = spec.train, spec.data
  learner_devices, sampler_devices = placement.split_devices(spec.rollout.placement, spec.rollout.devices)
  mesh = shard_lib.make_mesh(spec.mesh.data, spec.mesh.fsdp, spec.mesh.tensor, devices=learner_devices)
  sampler_mesh = placement.sampler_mesh(sampler_devices, spec.rollout.tensor_parallel)
  batch_sharding = shard_lib.batch_sharding(mesh)
  put_batch = functools.partial(distributed.put_global, sharding=batch_sharding)
  put_sampler_batch = functools.partial(distributed.put_global, sharding=placement.batch_sharding(sampler_mesh))

  teacher = load_model(spec.pair, "teacher", mesh, spec.vocab)
  student = load_model(spec.pair, "student", mesh, spec.vocab)
  teacher_graphdef, teacher_state = nnx.split(teacher)
  graphdef, params = nnx.split(student)
  spec.rollout.validate_for(params)
  tokenizer = load_tokenizer(spec.pair.tokenizer_dir)
  vocab_size = student.config.vocab_size
  # None: scored in this process. A teacher of another tokenizer is served with its own vocabulary and tokenizer.
  main_served = served_lib.connect(spec.served, spec.teachers.specs[0].endpoint, spec.objective,
                                   teacher.config.vocab_size if spec.cross.enabled else vocab_size,
                                   load_tokenizer(spec.pair.teacher) if spec.cross.enabled else tokenizer)
  if main_served is not None:
    stack.callback(main_served.close)
  eos_ids = tuple(student.config.eos_token_id) or (tokenizer.eos_token_id,)
  eos_ids += tuple(i for i in stop_token_ids(tokenizer, spec.rollout.stop_text) if i not in eos_ids)
  pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]

  train_problems = get_problems(d.source, "train", d.train_size, d.seed, d.task, d.train_file, d.heldout_file)
  heldout = get_problems(d.source, "heldout", t.eval_size, d.seed, d.task, d.train_file, d.heldout_file)
  if t.target_accuracy and all(p.answer is None for p in heldout):
    raise InputError(f"train.target_accuracy={t.target_accuracy} needs held-out problems with answers, but none of "
                     f"the {len(heldout)} in data.heldout_file={d.heldout_file!r} has one; set it to 0")
  prompts = PromptPipeline(train_problems, tokenizer, batch_size=t.batch_size // spec.group_size,
                           max_prompt_tokens=d.max_prompt_tokens, seed=d.seed, use_chat_template=d.use_chat_template,
                           prompt_format=d.prompt_format, mix=d.mix_weights)

  o = spec.optimizer
  schedule = make_schedule(learning_rate=o.learning_rate, warmup_steps=o.warmup_steps, total_steps=max(t.steps, 1),
                           end_lr_fraction=o.end_lr_fraction)
  optimizer = make_optimizer(schedule, weight_decay=o.weight_decay, grad_clip_norm=o.grad_clip_norm)
  state = TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))

  # The sampler's weights come from the learner through one sync per version (recipe applied on the learner's
  # devices, then resharded onto the sampler's mesh).
  settings = programs.RunSettings.for_run(spec, vocab_size=vocab_size, eos_ids=eos_ids, pad_id=pad_id,
                                          batch_shards=mesh.shape["data"] * mesh.shape["fsdp"])
  cross = span_kl = cross_for = None
  if spec.cross.enabled:  # teachers with their own tokenizers: span scoring (opd_jax/crosstok)
    cross_for = _cross_builder(spec, tokenizer, train_problems + heldout, eos_ids, graphdef, vocab_size, settings,
                               put_batch)
    cross, span_kl = cross_for(spec.teachers.specs[0], teacher_graphdef, main_served)
    ranks = (None, None) if cross.view.covers is None else tuple(c.rank_V for c in cross.view.covers)
    settings = dataclasses.replace(settings, projection=cross.projection, cover_rank=ranks[0],
                                   teacher_cover_rank=ranks[1])
  built = programs.build(settings, graphdef=graphdef, teacher_graphdef=teacher_graphdef, state=state,
                         teacher_state=teacher_state, optimizer=optimizer, mesh=mesh, sampler_mesh=sampler_mesh,
                         compute_dtype=student.dtype)
  state = jax.device_put(state, built.state_shardings)

  main = teachers_lib.RoutedTeacher(spec.teachers.specs[0].name, teacher_graphdef, teacher_state,
                                    built.teacher_score, main_served, span_kl or built.eval_reverse_kl, cross)
  teachers = teachers_lib.connect(spec, main, student_graphdef=graphdef, settings=settings, tokenizer=tokenizer,
                                  mesh=mesh, put_batch=put_batch,
                                  load=lambda path, own: load_model(spec.pair, "teacher", mesh, own, path),
                                  cross_for=cross_for)
  stack.callback(teachers.close)
  routes = None
  if spec.teachers.multi:  # fixed per problem before training, so a resumed run routes alike
    routes = {"train": spec.teachers.route(train_problems, "training"),
              "heldout": spec.teachers.route(heldout, "held-out")}
  producer = RolloutProducer(student_graphdef=graphdef, teacher_graphdef=teacher_graphdef,
                             teacher_state=teacher_state, rollout=spec.rollout, sampler=built.sampler,
                             objective=spec.objective, put_batch=put_batch, put_sampler_batch=put_sampler_batch,
                             learner_rows=batch_sharding, seed=spec.seed, logits_chunk=settings.logits_chunk,
                             reward_fn=evaluation.answer_reward_fn(tokenizer, train_problems)
                             if spec.objective.prompts_per_batch_divisor > 1 else None, group_size=spec.group_size,
                             teacher_score=built.teacher_score, student_score=built.student_score,
                             teachers=teachers, routes=routes["train"] if routes else None, cross=cross)
  return Run(spec, mesh, put_batch, put_sampler_batch, graphdef, state, teacher_state, tokenizer, heldout,
             routes["heldout"] if routes else None, prompts, schedule, built, teachers, producer)


def _cross_builder(spec: RunSpec, tokenizer, problems: list[Problem], eos_ids: tuple[int, ...], graphdef,
                   vocab_size: int, settings, put_batch):
  """(teacher spec, its graphdef, its served client or None) -> (CrossTokenizerScorer, SpanKL): a teacher of its
  own tokenizer, in its own format (the teacher's entry, else config.cross_tokenizer's); problems: the training
  problems followed by the held-out ones."""
  def build(teacher_spec, teacher_graphdef, served=None):
    own = dataclasses.replace(spec.cross, teacher_format=teacher_spec.format or spec.cross.teacher_format,
                              teacher_end=teacher_spec.end or spec.cross.teacher_end)
    return crosstok.build(
        own, student_tokenizer=tokenizer, teacher_dir=teacher_spec.checkpoint, problems=problems, eos_ids=eos_ids,
        max_prompt_tokens=spec.data.max_prompt_tokens, max_new_tokens=spec.rollout.max_new_tokens,
        use_chat_template=spec.data.use_chat_template, prompt_format=spec.data.prompt_format,
        student_graphdef=graphdef, teacher_graphdef=teacher_graphdef,
        temperature=spec.rollout.temperature, logits_chunk=settings.logits_chunk, put_batch=put_batch,
        objective=spec.objective, student_vocab_size=vocab_size,
        teacher_vocab_size=read_hf_config(teacher_spec.checkpoint).vocab_size, served=served)
  return build
