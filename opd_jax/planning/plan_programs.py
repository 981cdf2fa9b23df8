"""Every jitted program of a planned run, with abstract sharded arguments, and the state that stays resident on
the devices between programs. The programs come from opd_jax.train.programs.build, the builders the training
loop uses, with the run's own settings (PlanSpec.settings); nothing here allocates a weight.

Legend: B batch, P prompt tokens, R response tokens, K sampler top-k, E evaluation rows.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from opd_jax.crosstok.scoring import span_score_program
from opd_jax.errors import InputError
from opd_jax.models.config import ModelConfig
from opd_jax.models.decoder import Decoder
from opd_jax.models.sharding import batch_sharding, make_mesh
from opd_jax.planning.plan_spec import PlanSpec
from opd_jax.rollout import placement
from opd_jax.rollout.paged_sampler import PagedSampler
from opd_jax.rollout.placement import split_devices
from opd_jax.train import programs
from opd_jax.train.optimizer import make_optimizer, make_schedule
from opd_jax.train.step import RolloutBatch, TrainState


@dataclasses.dataclass(frozen=True)
class Program:
  fn: Callable  # jitted; lowered with `args`
  args: tuple  # abstract arguments (ShapeDtypeStructs with shardings)
  uses: tuple[str, ...]  # resident entries that are among its arguments (not added again to its total)
  pool: str = "learner"  # whose devices it runs on: learner | sampler (the same devices when colocated)


def resident_pools(plan: PlanSpec) -> dict[str, str]:
  """Resident entry -> the pool whose devices hold it between programs ("" = held only while a program that
  takes it runs)."""
  sampler = "sampler" if plan.disaggregated else "learner"
  lagged = plan.staleness_steps > 0
  return {"teacher_params": "learner", "learner_params": "learner", "optimizer_state": "learner",
          "rollout_batch": "learner", "dense_snapshots": "learner",
          "sampler_weights": sampler if plan.disaggregated or lagged else "",
          "staleness_snapshots": sampler}


def _abstract(shape, dtype, sharding) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _abstract_model(shape: ModelConfig, dtype: str, param_dtype: str, **options):
  model = nnx.eval_shape(lambda: Decoder(shape, dtype=jnp.dtype(dtype), param_dtype=jnp.dtype(param_dtype),
                                         **options))
  return nnx.split(model)


def _plan_devices(plan: PlanSpec) -> tuple[list, list]:
  if jax.device_count() < plan.devices:
    raise InputError(f"--devices={plan.devices} but jax sees {jax.device_count()} device(s); set "
                     f"XLA_FLAGS=--xla_force_host_platform_device_count={plan.devices} before jax is imported "
                     "(launch/plan_memory.py does)")
  return split_devices(plan.placement, plan.rollout_devices, jax.devices()[:plan.devices])


def plan_mesh(plan: PlanSpec) -> Mesh:
  """The learner's mesh."""
  return make_mesh(-1, plan.mesh_fsdp, plan.mesh_tensor, devices=_plan_devices(plan)[0])


def plan_sampler_mesh(plan: PlanSpec) -> Mesh:
  return placement.sampler_mesh(_plan_devices(plan)[1], plan.rollout_tensor)


def _paged_programs(engine, sampler_params, sharding) -> dict[str, Program]:
  """The paged engine's programs (rollout.engine=paged) at their largest shapes: the dense per-layer copy of the
  weights when the engine makes one, prefill of every row at once and a decode round over the widest page table,
  both with the KV pool (an argument the call donates, so it is counted in their peaks, not between programs)."""
  config = engine.engine
  R, C, M = config.max_rows, config.prefill_chunk, engine.pages_per_row
  place = lambda tree: jax.tree.map(lambda a: _abstract(a.shape, a.dtype, sharding), tree)
  programs_by_name, state, uses = {}, sampler_params, ("sampler_weights",)
  if engine.sampling.weight_layout == "dense_layers":  # made once per batch, decoded from while the batch runs
    programs_by_name["sampler_dense"] = Program(engine._dense, (sampler_params,), uses, "sampler")
    state, uses = place(jax.eval_shape(engine._dense, sampler_params)), ()
  pools = place(jax.eval_shape(lambda s: engine._init_pools(s).pools(), state))
  rows = lambda dtype, *shape: _abstract((R, *shape), dtype, sharding)
  keys = _abstract((R,), jax.eval_shape(lambda: jax.random.key(0)).dtype, sharding)
  programs_by_name["sampler_prefill"] = Program(
      engine._prefill, (state, pools, rows(jnp.int32, C), rows(jnp.bool_, C), rows(jnp.int32, M), rows(jnp.int32)),
      uses, "sampler")
  programs_by_name["sampler_decode"] = Program(
      engine._decode, (state, pools, rows(jnp.int32), rows(jnp.int32, M), rows(jnp.int32), rows(jnp.int32),
                       rows(jnp.int32), rows(jnp.bool_), keys), uses, "sampler")
  return programs_by_name


def _cross_programs(plan: PlanSpec, t_graphdef, t_params, objective, settings, rows, B: int, E: int
                    ) -> dict[str, Program]:
  """A cross-tokenizer run's teacher programs (opd_jax.crosstok.scoring) at the teacher's own lengths, in place of
  the same-tokenizer ones: span scoring (with what the objective reads at span starts), and the held-out span
  KL's teacher half on E rows (its student half scores the student's own tokens: less than the train step)."""
  Pt, Rt = plan.run.cross.lengths(plan.prompt_tokens, plan.response_tokens)
  R = plan.response_tokens

  rank = _cover_rank(plan, plan.teacher)

  def args(rows_count: int) -> tuple:
    shapes = (((Pt,), jnp.int32), ((Pt,), jnp.bool_), ((Rt,), jnp.int32), ((Rt,), jnp.float32), ((Rt,), jnp.int32),
              ((R,), jnp.int32), ((R,), jnp.int32), ((R,), jnp.float32))
    shapes += (((Rt, 4), jnp.int32), ((R, 6), jnp.int32)) if rank is not None else ()  # covers
    return (t_params, *(_abstract((rows_count, *shape), dtype, rows) for shape, dtype in shapes))

  score = span_score_program(t_graphdef, settings.rollout.temperature, settings.logits_chunk,
                             hidden=objective.needs_teacher_hidden,
                             top_k=objective.top_k if objective.needs_teacher_topk else 0, cover_rank=rank)
  eval_kl = span_score_program(t_graphdef, 1.0, settings.logits_chunk, cover_rank=rank)
  return {"teacher_score": Program(score, args(B), ("teacher_params",)),
          "eval_span_kl": Program(eval_kl, args(E), ("teacher_params",))}


PLAN_MAX_CHARS = 32  # planning from shapes: offset rows of the corrected marginal form (Gemma 3's longest token: 31)


def _projection(plan: PlanSpec, objective) -> tuple | None:
  """Placeholder common events of the cross-tokenizer marginal form (the train step's shapes; the real ones come
  from the tokenizers, opd_jax.crosstok.projection), else None. Events: one per token of either side, the most
  there can be, so the plan is an upper bound."""
  cross = plan.run.cross
  if not (cross.enabled and objective.needs_teacher_hidden):
    return None
  Vs, Vt = plan.student.vocab_size, plan.teacher.vocab_size
  out = (np.zeros(Vs, np.int32), np.zeros(Vt, np.int32), Vs + Vt,
         np.zeros(Vt, np.int32) if cross.teacher_response_prefix else None)
  if cross.boundaries == "corrected":
    out += ((np.zeros((PLAN_MAX_CHARS, Vs), np.int32), np.zeros((PLAN_MAX_CHARS, Vt), np.int32)),)
  return out


def _cover_rank(plan: PlanSpec, model):
  """Placeholder cover ranks of `model`'s vocabulary with corrected boundaries (the programs' shapes; the real ones
  come from the tokenizers, opd_jax.crosstok.cover), else None."""
  cross = plan.run.cross
  return np.zeros(model.vocab_size, np.int32) if cross.enabled and cross.boundaries == "corrected" else None


def build_programs(plan: PlanSpec, mesh: Mesh, micro_batch_size: int):
  """Every jitted program of a run with abstract sharded arguments, plus the abstract resident state.

  Returns (programs by name, resident trees by name). The train step takes the whole batch and accumulates
  gradients over `micro_batch_size` rows.
  """
  B, P, K = plan.batch_size, plan.prompt_tokens, plan.sampler_top_k
  settings = plan.settings(micro_batch_size)
  if _cover_rank(plan, plan.student) is not None:
    settings = dataclasses.replace(settings, cover_rank=_cover_rank(plan, plan.student),
                                   teacher_cover_rank=_cover_rank(plan, plan.teacher))
  settings = dataclasses.replace(settings, projection=_projection(plan, settings.objective))
  objective, rollout = settings.objective, settings.rollout
  t_options, s_options = plan.model_options("teacher"), plan.model_options("student")
  s_graphdef, s_params = _abstract_model(plan.student, **s_options)
  t_graphdef, t_params = _abstract_model(plan.teacher, **t_options)
  optimizer = make_optimizer(make_schedule(learning_rate=1e-6, warmup_steps=0, total_steps=1),
                             weight_decay=0.0, grad_clip_norm=1.0)
  state = TrainState(s_params, jax.eval_shape(optimizer.init, s_params), jax.ShapeDtypeStruct((), jnp.int32))
  s_mesh = plan_sampler_mesh(plan)
  run = programs.build(settings, graphdef=s_graphdef, teacher_graphdef=t_graphdef, state=state,
                       teacher_state=t_params, optimizer=optimizer, mesh=mesh, sampler_mesh=s_mesh,
                       compute_dtype=s_options["dtype"])
  state = programs.abstract_with(state, run.state_shardings)
  t_params = programs.abstract_with(t_params, run.teacher_shardings)
  sampler_params = run.weight_sync.abstract
  rows = batch_sharding(mesh)
  s_rows, s_replicated = placement.batch_sharding(s_mesh), NamedSharding(s_mesh, PartitionSpec())
  split = rollout.keeps_dense_copies(lagged=plan.staleness_steps > 0)
  batch = RolloutBatch.abstract(
      rows, batch=B, prompt=P, response=plan.response_tokens,
      teacher_hidden=(plan.teacher.hidden_size, jnp.dtype(t_options["dtype"])) if objective.needs_teacher_hidden
      else None, teacher_k=objective.top_k if objective.needs_teacher_topk else 0, sampler_k=K, snapshot=split,
      span=plan.run.cross.enabled, after_prefix=plan.run.cross.enabled and objective.needs_teacher_hidden
      and bool(plan.run.cross.teacher_response_prefix), span_cover=settings.cover_rank is not None,
      marginal_cover=settings.projection is not None and len(settings.projection) > 4)
  tokens = (batch.prompt_BxP, batch.prompt_valid_BxP, batch.response_BxR, batch.mask_BxR)
  key = _abstract((), jax.eval_shape(lambda: jax.random.key(0)).dtype, s_replicated)
  sampler_prompts = (_abstract((B, P), jnp.int32, s_rows), _abstract((B, P), jnp.bool_, s_rows))
  E = plan.eval_batch_size or B  # evaluation: eval_batch_size rows at a time
  eval_tokens = tuple(_abstract((E, *t.shape[1:]), t.dtype, rows) for t in tokens)
  learner_key = _abstract((), key.dtype, NamedSharding(mesh, PartitionSpec()))
  if plan.eval_weights == "sampler":  # decodes with the synced weights on the sampler's mesh
    eval_decode = (sampler_params, _abstract((E, P), jnp.int32, s_rows), _abstract((E, P), jnp.bool_, s_rows), key)
    eval_decode_pools = ("sampler_weights",)
  else:  # the learner's own weights on its mesh
    eval_decode, eval_decode_pools = (state.params, *eval_tokens[:2], learner_key), ("learner_params",)
  if isinstance(run.sampler, PagedSampler):  # rollout.engine=paged: its own programs instead of one generate call
    rollout_programs = _paged_programs(run.sampler.engine, sampler_params, s_replicated)
  else:
    rollout_programs = {"sampler": Program(run.sampler._fn, (sampler_params, *sampler_prompts, key),
                                           ("sampler_weights",), "sampler")}
  programs_by_name = {
      **rollout_programs,
      "teacher_score": Program(run.teacher_score, (t_params, *tokens), ("teacher_params",)),
      "train_step": Program(run.train_step, (state, batch, t_params),
                            ("learner_params", "optimizer_state", "rollout_batch", "teacher_params")),
      "eval_sampler": Program(run.eval_samplers[""]._fn, eval_decode, eval_decode_pools,
                              "sampler" if plan.eval_weights == "sampler" else "learner"),
      "eval_reverse_kl": Program(run.eval_reverse_kl, (state.params, t_params, *eval_tokens),
                                 ("learner_params", "teacher_params")),
  }
  if plan.served_teacher:  # scored over HTTP by another process: no teacher program here
    del programs_by_name["teacher_score"]
  if plan.run.cross.enabled:  # a teacher of another tokenizer scores its own prompt and response lengths
    del programs_by_name["eval_reverse_kl"]  # one vocabulary only; the held-out span KL instead
    programs_by_name.update(_cross_programs(plan, t_graphdef, t_params, objective, settings, rows, B, E))
  if "_sampled" in run.eval_samplers:  # train.eval_sampled: a second, temperature-1 evaluation program
    programs_by_name["eval_sampler_sampled"] = dataclasses.replace(
        programs_by_name["eval_sampler"], fn=run.eval_samplers["_sampled"]._fn)
  on_device = plan.snapshots_on == "device"
  resident = {"teacher_params": t_params, "learner_params": state.params, "optimizer_state": state.opt_state,
              "rollout_batch": batch, "sampler_weights": sampler_params,
              "staleness_snapshots": [sampler_params] * plan.staleness_steps if on_device else [],
              "dense_snapshots": [state.params] * (plan.staleness_steps + 1) if split else []}
  return programs_by_name, resident
