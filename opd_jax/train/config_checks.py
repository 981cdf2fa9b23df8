"""Config checks of a training run: every mistake that can be found before a model is loaded, each error naming
its field and what to do. The training loop runs them first (for launch/train.py and every sweep point), before
anything is written."""

from __future__ import annotations

import os

import jax

from opd_jax.data.problems import parse_mix
from opd_jax.errors import InputError
from opd_jax.models import read_hf_config
from opd_jax.models import sharding as shard_lib
from opd_jax.models.tokenizer_compat import PairVocab, check_pair
from opd_jax.objectives.losses import ObjectiveConfig
from opd_jax.prepare.pair import prepare_pair
from opd_jax.rollout import placement
from opd_jax.rollout.config import RolloutConfig
from opd_jax.serving.client import check_endpoint
from opd_jax.train.teachers import check_teachers, teacher_specs

MODES = ("sync", "async")
EVAL_WEIGHTS = ("learner", "sampler")  # train.eval_weights: what the evaluation decodes with


def check_config(config, device_count: int | None = None) -> tuple[RolloutConfig, ObjectiveConfig, PairVocab]:
  """Every config mistake that can be found without loading a model, each naming its field; returns the parsed
  rollout and objective configs and the pair's common vocabulary (the tokenizers are compared)."""
  rollout = RolloutConfig.from_config(config.rollout)
  objective = ObjectiveConfig(**dict(config.objective))
  t, m = config.train, config.mesh
  if t.mode not in MODES:
    raise InputError(f"train.mode must be one of {MODES}, got {t.mode!r}")
  if t.mode == "async" and rollout.staleness_steps:
    raise InputError("rollout.staleness_steps is a sync-mode knob; in async mode staleness comes from the "
                     "producer running ahead (bounded by train.max_staleness)")
  if not isinstance(t.steps, int) or t.steps < 0:
    raise InputError(f"train.steps must be an integer >= 0 (0 = evaluate the pair only), got {t.steps!r}")
  for field in ("batch_size", "log_every", "eval_every", "eval_size", "eval_batch_size", "checkpoint_every",
                "keep_checkpoints"):
    if not isinstance(t[field], int) or t[field] < 1:
      raise InputError(f"train.{field} must be a positive integer, got {t[field]!r}")
  for field in ("logits_chunk", "micro_batch_size", "max_staleness", "stop_after_steps", "eval_samples",
                "malloc_arena_max"):
    if not isinstance(t[field], int) or t[field] < 0:
      raise InputError(f"train.{field} must be an integer >= 0 (0 = off), got {t[field]!r}")
  if not isinstance(t.max_skipped_steps, int) or t.max_skipped_steps < 1:
    raise InputError(f"train.max_skipped_steps must be a positive integer, got {t.max_skipped_steps!r}")
  _check_numbers(config)
  if isinstance(t.target_accuracy, bool) or not isinstance(t.target_accuracy, (int, float)) or not (
      0 <= t.target_accuracy <= 1):
    raise InputError(f"train.target_accuracy must be a number in [0, 1] (0 = off), got {t.target_accuracy!r}")
  if t.micro_batch_size and t.batch_size % t.micro_batch_size:
    raise InputError(f"train.micro_batch_size={t.micro_batch_size} does not divide train.batch_size="
                     f"{t.batch_size}; pick a divisor (or 0 for no micro-batching)")
  learner_devices, sampler_devices = placement.split_devices(rollout.placement, rollout.devices,
                                                             range(device_count or jax.device_count()))
  data, _, _ = shard_lib.mesh_shape(m.data, m.fsdp, m.tensor, len(learner_devices))
  group = response_group(rollout, objective)
  if t.batch_size % group:
    raise InputError(f"train.batch_size={t.batch_size} is not divisible by the {group} responses per prompt "
                     "(rollout.samples_per_prompt, or grpo's objective.group_size); change one of them")
  for field in ("batch_size", "eval_batch_size", "micro_batch_size"):
    if t[field] % (data * m.fsdp):
      raise InputError(f"train.{field}={t[field]} is not divisible by the mesh's batch ways "
                       f"data*fsdp={data}*{m.fsdp}; change train.{field} or mesh.data/mesh.fsdp")
  if len(sampler_devices) % rollout.tensor_parallel:
    raise InputError(f"rollout.tensor_parallel={rollout.tensor_parallel} does not divide the sampler's "
                     f"{len(sampler_devices)} devices; change rollout.tensor_parallel or rollout.devices")
  sampler_rows = len(sampler_devices) // rollout.tensor_parallel
  if t.batch_size % sampler_rows:
    raise InputError(f"train.batch_size={t.batch_size} is not divisible by the sampler's batch ways "
                     f"{sampler_rows} (its devices / rollout.tensor_parallel); change one of them")
  if t.eval_weights not in EVAL_WEIGHTS:
    raise InputError(f"train.eval_weights must be one of {EVAL_WEIGHTS}, got {t.eval_weights!r}")
  if t.eval_weights == "sampler" and t.eval_batch_size % sampler_rows:
    raise InputError(f"train.eval_batch_size={t.eval_batch_size} is not divisible by the sampler's batch ways "
                     f"{sampler_rows} (train.eval_weights='sampler' decodes there); change one of them")
  if not isinstance(config.data.mix, str):
    raise InputError(f"data.mix must be a string 'source=weight,...' ('' = no mix), got {config.data.mix!r}")
  parse_mix(config.data.mix)
  if config.data.source not in ("arithmetic", "jsonl"):
    raise InputError(f"data.source must be 'arithmetic' or 'jsonl', got {config.data.source!r}")
  if config.data.source == "jsonl":
    for field in ("train_file", "heldout_file"):
      if not os.path.isfile(config.data[field]):
        raise InputError(f"data.{field}={config.data[field]!r} is not a file (data.source='jsonl' needs it)")
  prepare_pair(config)  # a config that says how makes its teacher / student dirs first (once; opd_jax/prepare)
  teacher, student = read_hf_config(config.teacher), read_hf_config(config.student)  # errors name the file
  for role, model in (("teacher", teacher), ("student", student)):
    if config.data.max_prompt_tokens + rollout.max_new_tokens > model.max_position_embeddings:
      raise InputError(f"data.max_prompt_tokens + rollout.max_new_tokens = {config.data.max_prompt_tokens} + "
                       f"{rollout.max_new_tokens} exceeds the {role}'s max_position_embeddings "
                       f"{model.max_position_embeddings}; shorten one of them")
  vocab = pair_vocab(config, teacher, student)
  objective = check_teachers(config, objective, vocab, config.data.max_prompt_tokens + rollout.max_new_tokens)
  objective = check_served_teacher(config, rollout, objective, vocab.vocab_size)
  if config.train.export_dtype not in ("", "float32", "bfloat16"):
    raise InputError(f"train.export_dtype must be 'float32', 'bfloat16' or '' (no export), got "
                     f"{config.train.export_dtype!r}")
  return rollout, objective, vocab


PREFLIGHT = ("refuse", "warn", "off")  # served_teacher.preflight
FULL_VOCAB_OVER_THE_WIRE = 1024  # largest vocabulary whose whole log-prob vector a served teacher sends per token


def check_served_teacher(config, rollout: RolloutConfig, objective: ObjectiveConfig,
                         vocab_size: int) -> ObjectiveConfig:
  """The objective the run trains with: with a served teacher (config.teacher_endpoint), which sends log-probs of
  the raw logits and top-k only, to one process, an exact vocabulary objective becomes its top-k form over the
  whole vocabulary (ObjectiveConfig.over_the_wire), for small vocabularies only. The same checks hold where any
  teacher of a multi-teacher run (config.teachers) is served."""
  endpoints = [spec.endpoint for spec in teacher_specs(config) if spec.endpoint]
  if not endpoints:
    return objective
  for endpoint in endpoints:
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
  s = config.served_teacher
  if s.preflight not in PREFLIGHT:
    raise InputError(f"served_teacher.preflight must be one of {PREFLIGHT}, got {s.preflight!r}")
  if isinstance(s.preflight_max_k3, bool) or not isinstance(s.preflight_max_k3, (int, float)) or not (
      s.preflight_max_k3 >= 0):
    raise InputError(f"served_teacher.preflight_max_k3 must be a number >= 0, got {s.preflight_max_k3!r}")
  for field in ("rows_per_request", "max_in_flight"):
    if isinstance(s[field], bool) or not isinstance(s[field], int) or s[field] < 1:
      raise InputError(f"served_teacher.{field} must be a positive integer, got {s[field]!r}")
  for field, lowest in (("timeout_s", 0.0), ("retry_for_s", 0.0)):
    if isinstance(s[field], bool) or not isinstance(s[field], (int, float)) or not s[field] >= lowest or (
        field == "timeout_s" and s[field] == 0):
      raise InputError(f"served_teacher.{field} must be a number {'> 0' if field == 'timeout_s' else '>= 0'}, "
                       f"got {s[field]!r}")
  return objective.over_the_wire(vocab_size)


def response_group(rollout: RolloutConfig, objective: ObjectiveConfig) -> int:
  """Responses sampled per distinct prompt: grpo's group_size, else rollout.samples_per_prompt."""
  if objective.prompts_per_batch_divisor > 1:
    if rollout.samples_per_prompt not in (1, objective.group_size):
      raise InputError(f"grpo samples every prompt objective.group_size={objective.group_size} times; "
                       f"rollout.samples_per_prompt={rollout.samples_per_prompt} disagrees (leave it at 1)")
    return objective.group_size
  return rollout.samples_per_prompt


def pair_vocab(config, teacher=None, student=None) -> PairVocab:
  """The pair's common vocabulary, from its tokenizers (see opd_jax.models.tokenizer_compat); errors name the
  tokens the two tokenizers disagree on."""
  teacher, student = teacher or read_hf_config(config.teacher), student or read_hf_config(config.student)
  return check_pair(config.teacher, config.student, teacher, student, tokenizer_dir=config.tokenizer or None)


def _check_numbers(config) -> None:
  """Ranges of the numeric data and optimizer fields, each error naming its field."""
  d, o = config.data, config.optimizer
  for field, value, ok, want in (
      ("data.max_prompt_tokens", d.max_prompt_tokens, lambda v: v >= 1, "a positive integer"),
      ("data.train_size", d.train_size, lambda v: v >= 1, "a positive integer"),
      ("optimizer.learning_rate", o.learning_rate, lambda v: v > 0, "a number > 0"),
      ("optimizer.warmup_steps", o.warmup_steps, lambda v: v >= 0, "an integer >= 0"),
      ("optimizer.end_lr_fraction", o.end_lr_fraction, lambda v: 0 <= v <= 1, "a number in [0, 1]"),
      ("optimizer.weight_decay", o.weight_decay, lambda v: v >= 0, "a number >= 0"),
      ("optimizer.grad_clip_norm", o.grad_clip_norm, lambda v: v >= 0, "a number >= 0 (0 = off)")):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
      raise InputError(f"{field} must be {want}, got {value!r}")


def check_workdir(workdir: str) -> None:
  """The run directory can be created (or is a directory) and written; checked before anything is written."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise InputError(f"--workdir {workdir!r} is a file; give a directory (new or of this run)")
  parent = os.path.abspath(workdir)
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise InputError(f"--workdir {workdir!r} is under {parent!r}, which is a file; give a directory path")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise InputError(f"--workdir {workdir!r}: {parent!r} is not writable; give a directory you can write to")
