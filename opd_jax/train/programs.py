"""The programs of an OPD run, built in one place for the training loop and the memory planner.

One builder per program: the loop (opd_jax/train/loop.py), the rollout producer and the memory planner
(opd_jax/planning/plan_programs.py) all construct the sampler, the weight sync, teacher / student scoring, the
train step and the evaluation programs here, from the same settings, so a plan or a benchmark measures the
program a run executes. Model and optimizer arrays are arguments of every program (never captured: a captured
array would become a constant of the executable); tests/test_programs.py lowers each one and checks.

`RunSettings.for_run` reads every setting a program depends on from a run spec; `build` returns the
programs for given graph definitions, parameters (arrays or abstract ShapeDtypeStructs) and meshes.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from opd_jax.models import sharding as shard_lib
from opd_jax.objectives.chunked import row_map
from opd_jax.objectives.logprobs import score
from opd_jax.objectives.losses import ObjectiveConfig
from opd_jax.rollout.config import RolloutConfig
from opd_jax.rollout.sampler import Sampler, SamplingConfig
from opd_jax.rollout.weight_sync import WeightSync
from opd_jax.spec import RunSpec
from opd_jax.train.evaluation import make_kl_fn
from opd_jax.train.step import train_step


@dataclasses.dataclass(frozen=True)
class RunSettings:
  """What the programs depend on besides models, parameters and meshes."""
  rollout: RolloutConfig
  objective: ObjectiveConfig
  logits_chunk: int  # tokens (rows x positions) per vocabulary chunk of the whole batch; 0 = all at once
  micro_batch_size: int  # rows per pass of the train step, teacher scoring and evaluation KL; 0 = the whole batch
  sampler_top_k: int  # top-k log-probs the rollout sampler returns (vocabulary mismatch metrics); 0 = none
  group_size: int  # responses per distinct prompt
  eos_ids: tuple[int, ...]
  pad_id: int
  eval_sampled: bool  # evaluation also samples at temperature 1 (and measures the reverse KL there)
  eval_weights: str = "learner"  # evaluation decodes with: learner (learner mesh) | sampler (synced, sampler mesh)
  teacher_names: tuple[str, ...] = ()  # multi-teacher runs: the teachers, in route order (per-teacher metrics)
  max_prompt_tokens: int = 0  # prompts' width (the paged engine's page tables are sized for it)
  batch_size: int = 0  # rows per rollout batch (the paged engine decodes this many at once by default)
  projection: tuple | None = None  # cross-tokenizer full-distribution form's events (opd_jax.crosstok.projection)
  cover_rank: object = None  # cross-tokenizer corrected boundaries: the student's cover ranks (opd_jax.crosstok.cover)
  teacher_cover_rank: object = None  # ... and the teacher's (the marginal form's character-level distributions)

  @classmethod
  def for_run(cls, spec: RunSpec, *, vocab_size: int, eos_ids: tuple[int, ...], pad_id: int,
              batch_shards: int = 1) -> "RunSettings":
    """batch_shards: devices the learner's batch is split over (mesh data x fsdp). train.logits_chunk counts
    tokens per device, so a chunk of the whole batch is batch_shards times that: each device's slice of a chunk
    stays logits_chunk tokens at any batch size and device count."""
    t = spec.train
    names = spec.teachers.names if spec.teachers.multi else ()
    return cls(spec.rollout, spec.objective, t.logits_chunk * batch_shards, t.micro_batch_size,
               t.sampler_top_k(vocab_size), spec.group_size, tuple(eos_ids), pad_id, bool(t.eval_sampled),
               t.eval_weights, tuple(names), spec.data.max_prompt_tokens, t.batch_size)


def _scoring(graphdef, micro_batch_size: int, mesh: Mesh | None = None, **options):
  """jit (state, prompt, valid, response, mask) -> Scores, `micro_batch_size` rows at a time (0 = all); with the
  learner's mesh, logit chunks stay batch-sharded (shard_lib.constrain_batch)."""
  def program(state, prompt_BxP, valid_BxP, response_BxR, mask_BxR):
    one = lambda *rows: score(graphdef, state, *rows, **options)
    return row_map(one, (prompt_BxP, valid_BxP, response_BxR, mask_BxR), micro_batch_size)
  return jax.jit(shard_lib.with_activations_on(mesh, program))


def teacher_score_program(teacher_graphdef, objective: ObjectiveConfig, temperature: float, logits_chunk: int,
                          micro_batch_size: int = 0, mesh: Mesh | None = None):
  """jit (teacher_state, prompt, valid, response, mask) -> Scores: the sampled tokens' log-probs, plus the final
  hidden states / top-k the objective needs of the teacher; `micro_batch_size` rows at a time, like the step."""
  top_k = objective.top_k if objective.needs_teacher_topk else 0
  return _scoring(teacher_graphdef, micro_batch_size, mesh, temperature=temperature, logits_chunk=logits_chunk,
                  return_hidden=objective.needs_teacher_hidden, top_k=top_k, top_k_temperature=objective.temperature)


def student_score_program(graphdef, temperature: float, logits_chunk: int, micro_batch_size: int = 0,
                          mesh: Mesh | None = None):
  """jit (state, prompt, valid, response, mask) -> Scores of a learner version (the mismatch split's dense copy)."""
  return _scoring(graphdef, micro_batch_size, mesh, temperature=temperature, logits_chunk=logits_chunk)


def train_step_program(graphdef, teacher_graphdef, optimizer: optax.GradientTransformation, settings: RunSettings,
                       *, state_shardings, teacher_shardings, mesh: Mesh, micro_batch_size: int | None = None):
  """jit (state, batch, teacher_state) -> (state, metrics), state donated; micro_batch_size overrides the
  settings' (the planner's search)."""
  micro = settings.micro_batch_size if micro_batch_size is None else micro_batch_size
  fn = functools.partial(train_step, graphdef, optimizer, settings.objective, settings.rollout.temperature,
                         settings.objective.is_cap, teacher_graphdef=teacher_graphdef,
                         logits_chunk=settings.logits_chunk, micro_batch_size=micro,
                         teacher_names=settings.teacher_names, projection=settings.projection,
                         cover_rank=settings.cover_rank, teacher_cover_rank=settings.teacher_cover_rank)
  return jax.jit(shard_lib.with_activations_on(mesh, fn),
                 in_shardings=(state_shardings, shard_lib.batch_sharding(mesh), teacher_shardings),
                 out_shardings=(state_shardings, shard_lib.replicated(mesh)), donate_argnums=(0,))


def rollout_sampler(graphdef, settings: RunSettings, weight_sync: WeightSync) -> Sampler:
  """The rollout engine's sampler, on the sampler mesh with the synced weights' layout."""
  sampling = settings.rollout.sampling(eos_ids=settings.eos_ids, pad_id=settings.pad_id,
                                       logits_top_k=settings.sampler_top_k, samples_per_prompt=settings.group_size,
                                       platform=weight_sync.mesh.devices.flat[0].platform)
  if settings.rollout.engine == "paged":  # one engine per sampler device, each on its block of rows
    from opd_jax.rollout.engine import engine_config
    from opd_jax.rollout.paged_sampler import PagedSampler
    rows = max(settings.batch_size // weight_sync.mesh.devices.size, 1)
    return PagedSampler(graphdef, sampling, engine_config(settings.rollout, settings.max_prompt_tokens, rows),
                        mesh=weight_sync.mesh)
  return Sampler(graphdef, sampling, mesh=weight_sync.mesh, state_shardings=weight_sync.shardings)


def eval_samplers(graphdef, settings: RunSettings, weight_sync: WeightSync | None = None) -> dict[str, Sampler]:
  """Evaluation samplers by metric suffix: "" greedy, "_sampled" temperature 1 (when evaluated); no sampling
  knobs. With settings.eval_weights == "sampler" they run on weight_sync's mesh with its synced layout."""
  greedy = SamplingConfig(max_new_tokens=settings.rollout.max_new_tokens, temperature=0.0,
                          eos_ids=settings.eos_ids, pad_id=settings.pad_id)
  on_sampler = settings.eval_weights == "sampler"
  if on_sampler and weight_sync is None:
    raise ValueError("eval_weights='sampler' needs the run's weight sync")
  where = dict(mesh=weight_sync.mesh, state_shardings=weight_sync.shardings) if on_sampler else {}
  samplers = {"": Sampler(graphdef, greedy, **where)}
  if settings.eval_sampled:
    samplers["_sampled"] = Sampler(graphdef, dataclasses.replace(greedy, temperature=1.0), **where)
  return samplers


def abstract_with(tree, shardings):
  """ShapeDtypeStructs of `tree` (arrays or abstract) carrying `shardings`."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)


@dataclasses.dataclass
class RunPrograms:
  state_shardings: object
  teacher_shardings: object
  weight_sync: WeightSync
  sampler: Sampler
  teacher_score: object
  student_score: object
  train_step: object
  eval_samplers: dict
  teacher_greedy: Sampler
  eval_reverse_kl: object
  eval_forward_kl: object


def build(settings: RunSettings, *, graphdef, teacher_graphdef, state, teacher_state, optimizer, mesh: Mesh,
          sampler_mesh: Mesh, compute_dtype) -> RunPrograms:
  """Every program of a run. state: the learner's TrainState and teacher_state: the teacher's parameters, as
  arrays or abstract values (shardings are derived here from the parameter paths); compute_dtype: the
  learner's, in which the synced sampler weights are stored."""
  state_shardings = shard_lib.state_shardings(state, mesh)
  teacher_shardings = shard_lib.state_shardings(teacher_state, mesh)
  weight_sync = WeightSync(settings.rollout, abstract_with(state.params, state_shardings.params), sampler_mesh,
                           jnp.dtype(compute_dtype))
  return RunPrograms(
      state_shardings=state_shardings, teacher_shardings=teacher_shardings, weight_sync=weight_sync,
      sampler=rollout_sampler(graphdef, settings, weight_sync),
      teacher_score=teacher_score_program(teacher_graphdef, settings.objective, settings.rollout.temperature,
                                          settings.logits_chunk, settings.micro_batch_size, mesh),
      student_score=student_score_program(graphdef, settings.rollout.temperature, settings.logits_chunk,
                                          settings.micro_batch_size, mesh),
      train_step=train_step_program(graphdef, teacher_graphdef, optimizer, settings, state_shardings=state_shardings,
                                    teacher_shardings=teacher_shardings, mesh=mesh),
      eval_samplers=eval_samplers(graphdef, settings, weight_sync),
      teacher_greedy=eval_samplers(teacher_graphdef, dataclasses.replace(settings, eval_sampled=False,
                                                                         eval_weights="learner"))[""],
      eval_reverse_kl=make_kl_fn(graphdef, teacher_graphdef, settings.logits_chunk, "reverse",
                                 settings.micro_batch_size, mesh),
      eval_forward_kl=make_kl_fn(graphdef, teacher_graphdef, settings.logits_chunk, "forward",
                                 settings.micro_batch_size, mesh))
