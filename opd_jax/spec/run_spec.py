"""RunSpec: the typed, checked form of a training config.

`RunSpec.from_config(config)` is where a ConfigDict stops: it returns frozen parts (pair, data, train, optimizer,
mesh, rollout, the objective in the form the run trains, teachers, served-teacher client settings, a teacher of
another tokenizer) and runs every
check that needs no model loaded, each error naming its field and what to do. Nothing below the entry points
receives a ConfigDict.

It reads the checkpoints' config.json and tokenizer files (to check lengths and the pair's common vocabulary)
and writes nothing: a config whose pair must first be imported or pruned (`config.prepare`) is prepared by the
entry point (`opd_jax.prepare.pair.prepare_pair`) before its spec is made.
"""

from __future__ import annotations

import dataclasses

import jax

from opd_jax.errors import InputError
from opd_jax.models import read_hf_config
from opd_jax.models import sharding as shard_lib
from opd_jax.models.tokenizer import has_tokenizer
from opd_jax.models.tokenizer_compat import PairVocab, check_pair
from opd_jax.objectives.losses import ObjectiveConfig
from opd_jax.rollout import placement
from opd_jax.rollout.config import RolloutConfig
from opd_jax.serving.client import check_endpoint
from opd_jax.spec.parts import (CrossTokenizerSpec, DataSpec, MeshSpec, OptimizerSpec, PairSpec, ServedSpec,
                                TrainSpec)
from opd_jax.spec.teachers import Teachers

CROSS_OBJECTIVES = ("reverse_kl_pg", "reverse_kl", "uld")  # what a cross-tokenizer run trains (opd_jax/crosstok)
FULL_VOCAB_OVER_THE_WIRE = 1024  # largest vocabulary whose whole log-prob vector a served teacher sends per token


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One OPD run, checked (module docstring)."""
  pair: PairSpec
  vocab: PairVocab  # the pair's common vocabulary (opd_jax.models.tokenizer_compat)
  data: DataSpec
  train: TrainSpec
  optimizer: OptimizerSpec
  mesh: MeshSpec
  rollout: RolloutConfig
  objective: ObjectiveConfig  # as the run trains it (a served or routed teacher may turn it into its top-k form)
  teachers: Teachers
  served: ServedSpec
  seed: int  # sampling keys and everything random in the run
  group_size: int  # responses per distinct prompt (grpo's group_size, else rollout.samples_per_prompt)
  config_json: str  # the config as given, for the run directory's config.json
  cross: CrossTokenizerSpec = CrossTokenizerSpec()  # a teacher with its own tokenizer (opd_jax/crosstok)

  @classmethod
  def from_config(cls, config, device_count: int | None = None, models=None) -> "RunSpec":
    """device_count: devices the run will have (default: this process's jax.device_count()). models: pair ->
    (teacher, student) ModelConfigs, read instead of the checkpoints' config.json (planning a run whose
    checkpoints and data are elsewhere, opd_jax.planning.plan_spec.shapes_of: vocabularies are taken as they
    are, tokenizers not compared, data files not looked for); it is called after the checks of the config's
    sections and layout, so a bad value there is reported before a missing model."""
    rollout = RolloutConfig.from_config(config.rollout)
    objective = ObjectiveConfig(**dict(config.objective))
    train = TrainSpec.from_section(config.train)
    if train.mode == "async" and rollout.staleness_steps:
      raise InputError("rollout.staleness_steps is a sync-mode knob; in async mode staleness comes from the "
                       "producer running ahead (bounded by train.max_staleness)")
    if rollout.inflight_updates and train.mode != "async":
      raise InputError("rollout.inflight_updates=True applies to train.mode='async' (in sync mode every batch is "
                       "sampled by one version); set the mode or drop the flag")
    if rollout.inflight_updates and rollout.keeps_dense_copies(lagged=True):
      raise InputError("rollout.inflight_updates=True with a weight / KV / noise recipe needs "
                       "rollout.split_mismatch=False: the split's dense copy is one version, in-flight tokens "
                       "come from several")
    data = DataSpec.from_section(config.data, check_files=models is None)
    optimizer = OptimizerSpec.from_section(config.optimizer)
    mesh, served = MeshSpec.from_section(config.mesh), ServedSpec.from_section(config.served_teacher)
    group = response_group(rollout, objective)
    _check_layout(train, mesh, rollout, group, device_count or jax.device_count())
    pair = PairSpec.from_config(config)
    teacher, student = models(pair) if models else (_model_config("teacher", pair.teacher),
                                                    _model_config("student", pair.student))
    max_tokens = data.max_prompt_tokens + rollout.max_new_tokens
    for role, model in (("teacher", teacher), ("student", student)):
      if max_tokens > model.max_position_embeddings:
        raise InputError(f"data.max_prompt_tokens + rollout.max_new_tokens = {data.max_prompt_tokens} + "
                         f"{rollout.max_new_tokens} exceeds the {role}'s max_position_embeddings "
                         f"{model.max_position_embeddings}; shorten one of them")
    cross = CrossTokenizerSpec.from_section(config.get("cross_tokenizer"))
    teachers = Teachers.from_config(config)
    if cross.enabled:
      _check_cross(cross, objective, teachers, train, pair, teacher, data.max_prompt_tokens, rollout.max_new_tokens,
                   check_files=models is None)
      vocab = PairVocab(student.vocab_size, teacher.vocab_size, student.vocab_size, None, False, cross_tokenizer=True)
    elif objective.marginal_span != "first":
      raise InputError(f"objective.marginal_span={objective.marginal_span!r} splits a cross-tokenizer span at its "
                       "first character; with one tokenizer reverse_kl is already exact: remove it, or set "
                       "cross_tokenizer.enabled=True for a teacher of another tokenizer")
    elif models is None:
      vocab = check_pair(pair.teacher, pair.student, teacher, student, tokenizer_dir=pair.tokenizer or None)
    else:
      vocab = PairVocab(min(teacher.vocab_size, student.vocab_size), teacher.vocab_size, student.vocab_size, None,
                        False)
    objective = teachers.check(objective, vocab, max_tokens, student=pair.student, tokenizer=pair.tokenizer,
                               cross=cross.enabled,
                               eval_teacher_forced=train.eval_teacher_forced)
    objective = served_objective(teachers, served, rollout, objective, vocab.vocab_size)
    return cls(pair, vocab, data, train, optimizer, mesh, rollout, objective, teachers, served, config.seed, group,
               config.to_json(indent=2), cross)


def _check_cross(cross: CrossTokenizerSpec, objective: ObjectiveConfig, teachers: Teachers, train: TrainSpec,
                 pair: PairSpec, teacher, max_prompt_tokens: int, max_new_tokens: int, check_files: bool = True) -> None:
  """What a cross-tokenizer run supports today: CROSS_OBJECTIVES, one teacher in this process, both
  models with their own tokenizer files (not looked for when planning from shapes), and the teacher's static
  lengths within its context."""
  if objective.name not in CROSS_OBJECTIVES:
    raise InputError(f"cross_tokenizer.enabled=True trains {', '.join(CROSS_OBJECTIVES)} (the span form, the "
                     f"next-character marginals, the ULD baseline); objective.name={objective.name!r} compares "
                     "distributions over one vocabulary")
  if teachers.multi and (objective.name != "reverse_kl_pg" or teachers.endpoints):
    raise InputError("several teachers of their own tokenizers train the span form in this process: set "
                     "objective.name='reverse_kl_pg' and serve none of them (each teacher's hidden states or top-k "
                     "would need that teacher's head in the step)")
  if cross.boundaries == "corrected" and (objective.name not in ("reverse_kl_pg", "reverse_kl") or teachers.multi
                                          or teachers.endpoints):
    raise InputError(f"cross_tokenizer.boundaries='corrected' scores character-level span log-probs (the span form) "
                     f"and next-character marginals (reverse_kl), with one teacher in this process (it reads the "
                     f"teacher's whole next-token distribution at corrected boundaries); objective.name="
                     f"{objective.name!r}, {len(teachers.specs)} teacher(s), served: {bool(teachers.endpoints)}. Use "
                     "reverse_kl_pg or reverse_kl with one in-process teacher, or boundaries='settled'")
  if teachers.endpoints and objective.name != "reverse_kl_pg":
    raise InputError(f"a served teacher of another tokenizer sends the log-probs of its own tokens, which is what "
                     f"the span form needs; objective.name={objective.name!r} needs its hidden states or top-k at "
                     "span starts: use reverse_kl_pg with config.teacher_endpoint")
  if train.eval_teacher_forced:
    raise InputError("train.eval_teacher_forced scores the teacher's greedy responses with the student's tokenizer; "
                     "set it to False with cross_tokenizer.enabled=True")
  if pair.tokenizer:
    raise InputError("config.tokenizer names one data tokenizer for both models; with cross_tokenizer.enabled=True "
                     "each model uses its own checkpoint's tokenizer: leave config.tokenizer ''")
  for role, path in (("teacher", pair.teacher), ("student", pair.student)) if check_files else ():
    if not has_tokenizer(path):
      raise InputError(f"cross_tokenizer.enabled=True needs the {role}'s tokenizer, but {path!r} has no tokenizer "
                       "files; copy them there")
  prompt, response = cross.lengths(max_prompt_tokens, max_new_tokens)
  if prompt + response > teacher.max_position_embeddings:
    raise InputError(f"the teacher's prompt + response lengths {prompt} + {response} exceed its "
                     f"max_position_embeddings {teacher.max_position_embeddings}; lower "
                     "cross_tokenizer.max_teacher_prompt_tokens / max_teacher_response_tokens")


def devices_named(mesh: MeshSpec, rollout: RolloutConfig) -> int:
  """Devices a run's mesh names: data (1 when -1, i.e. 'the rest') x fsdp x tensor for the learner, plus the
  sampler's own devices when disaggregated."""
  learner = max(mesh.data, 1) * max(mesh.fsdp, 1) * max(mesh.tensor, 1)
  return learner + (max(rollout.devices, 0) if rollout.placement == "disaggregated" else 0)


def screening_spec(config) -> RunSpec:
  """The spec of a run measured without training it (admission, sensitivity scan, prefix shift, benchmarks): its
  layout is checked for the devices its config names, since a screen runs on this process's first device
  whatever the run's mesh. The pair must be prepared first (opd_jax.prepare.pair.prepare_pair)."""
  return RunSpec.from_config(config, device_count=devices_named(MeshSpec.from_section(config.mesh),
                                                                RolloutConfig.from_config(config.rollout)))


def response_group(rollout: RolloutConfig, objective: ObjectiveConfig) -> int:
  """Responses sampled per distinct prompt: grpo's group_size, else rollout.samples_per_prompt."""
  if objective.prompts_per_batch_divisor > 1:
    if rollout.samples_per_prompt not in (1, objective.group_size):
      raise InputError(f"grpo samples every prompt objective.group_size={objective.group_size} times; "
                       f"rollout.samples_per_prompt={rollout.samples_per_prompt} disagrees (leave it at 1)")
    return objective.group_size
  return rollout.samples_per_prompt


def served_objective(teachers: Teachers, served: ServedSpec, rollout: RolloutConfig, objective: ObjectiveConfig,
                     vocab_size: int) -> ObjectiveConfig:
  """The objective the run trains with: with a served teacher, which sends log-probs of the raw logits and top-k
  only, to one process, an exact vocabulary objective becomes its top-k form over the whole vocabulary
  (ObjectiveConfig.over_the_wire), for small vocabularies only. The same checks hold where any teacher of a
  multi-teacher run is served."""
  if not teachers.endpoints:
    return objective
  for endpoint in teachers.endpoints:
    check_endpoint(endpoint)
  if objective.needs_teacher_hidden and vocab_size > FULL_VOCAB_OVER_THE_WIRE:
    raise InputError(f"objective.name={objective.name!r} needs the teacher's whole distribution, which a served "
                     f"teacher would send as {vocab_size} log-probs per token (only up to "
                     f"{FULL_VOCAB_OVER_THE_WIRE}); use reverse_kl_pg or a *_topk objective with a served teacher")
  if rollout.temperature != 1.0 or (objective.needs_teacher_topk and objective.temperature != 1.0):
    raise InputError(f"rollout.temperature={rollout.temperature:g} / objective.temperature="
                     f"{objective.temperature:g}: a served teacher's log-probs are of its raw logits (temperature 1, "
                     "as vLLM's prompt log-probs are); set both to 1 with config.teacher_endpoint")
  if jax.process_count() > 1:
    raise InputError("config.teacher_endpoint is single-process for now (every process would send the whole "
                     "batch); leave distributed.* unset or score in-process")
  served.check()
  return objective.over_the_wire(vocab_size)


def _check_layout(train: TrainSpec, mesh: MeshSpec, rollout: RolloutConfig, group: int, device_count: int) -> None:
  """The batch splits evenly over the learner's and the sampler's meshes, and the run's process layout is one
  the loop supports."""
  if train.mode == "async" and jax.process_count() > 1:
    raise InputError("train.mode='async' samples on a second thread, whose cross-process collectives could "
                     "interleave differently on each process; use train.mode='sync' for multi-process runs")
  if rollout.placement == "disaggregated" and jax.process_count() > 1:
    raise InputError("rollout.placement='disaggregated' is single-process for now (the sampler's devices would "
                     "belong to some processes only); use rollout.placement='colocated' for multi-process runs")
  learner_devices, sampler_devices = placement.split_devices(rollout.placement, rollout.devices, range(device_count))
  data, _, _ = shard_lib.mesh_shape(mesh.data, mesh.fsdp, mesh.tensor, len(learner_devices))
  if train.batch_size % group:
    raise InputError(f"train.batch_size={train.batch_size} is not divisible by the {group} responses per prompt "
                     "(rollout.samples_per_prompt, or grpo's objective.group_size); change one of them")
  for field in ("batch_size", "eval_batch_size", "micro_batch_size"):
    if getattr(train, field) % (data * mesh.fsdp):
      raise InputError(f"train.{field}={getattr(train, field)} is not divisible by the mesh's batch ways "
                       f"data*fsdp={data}*{mesh.fsdp}; change train.{field} or mesh.data/mesh.fsdp")
  if len(sampler_devices) % rollout.tensor_parallel:
    raise InputError(f"rollout.tensor_parallel={rollout.tensor_parallel} does not divide the sampler's "
                     f"{len(sampler_devices)} devices; change rollout.tensor_parallel or rollout.devices")
  sampler_rows = len(sampler_devices) // rollout.tensor_parallel
  if train.batch_size % sampler_rows:
    raise InputError(f"train.batch_size={train.batch_size} is not divisible by the sampler's batch ways "
                     f"{sampler_rows} (its devices / rollout.tensor_parallel); change one of them")
  if train.eval_weights == "sampler" and train.eval_batch_size % sampler_rows:
    raise InputError(f"train.eval_batch_size={train.eval_batch_size} is not divisible by the sampler's batch ways "
                     f"{sampler_rows} (train.eval_weights='sampler' decodes there); change one of them")


def pair_vocab(config) -> PairVocab:
  """The pair's common vocabulary, from its tokenizers (see opd_jax.models.tokenizer_compat); errors name the
  tokens the two tokenizers disagree on. For entry points that need only the pair (serve_teacher, admission)."""
  return check_pair(config.teacher, config.student, read_hf_config(config.teacher), read_hf_config(config.student),
                    tokenizer_dir=config.tokenizer or None)


def _model_config(role: str, path: str):
  """The pair's model config at `path`; an error names the config field that gave the path."""
  try:
    return read_hf_config(path)
  except InputError as e:
    raise type(e)(f"config.{role}: {e}") from None
