"""Memory planner: does an OPD run fit the device? Answered without a GPU and without allocating weights.

Every jitted program of a run (sampler, teacher scoring, train step, the evaluation samplers (greedy, and
temperature 1 with `train.eval_sampled`) and the evaluation reverse KL; built by opd_jax/train/programs.py, as
the training loop builds them) is compiled ahead of time with abstract, sharded arguments
(`jax.ShapeDtypeStruct` + `NamedSharding`) on a mesh of simulated CPU devices, and XLA's buffer assignment
gives per-device bytes (`compiled.memory_analysis()`):

  argument  the program's inputs (parameters, optimizer state, batch)
  output    its outputs
  temp      its intermediates (activations, logits, KV cache, gradients)
  alias     output bytes that reuse donated input buffers (the train step donates its state)
  peak      argument + output + temp - alias: what the program holds while it runs. (XLA's own
            `peak_memory_in_bytes` is not used: on XLA:CPU it leaves out the temp buffer.)

Resident bytes stay on the device between programs: teacher parameters, learner parameters, optimizer state,
the rollout batch, and on the sampler's side its weights at the rollout recipe's precision (what
rollout.weight_sync makes: `sampler_param_bytes` in the JSON), `staleness_steps` snapshots of them (none on
the device with `snapshots_on=host`), and with `split_mismatch` a dense learner copy per kept version. The
sampler is compiled on its own mesh and inference layout (rollout.placement): over the same devices when
colocated, over `rollout_devices` devices of its own when disaggregated, which are then a second pool with its
own residents. Colocated without staleness, the sampler's weights live only while the sampler runs (the loop
syncs them right before sampling). A program's total is its peak plus the resident entries of its pool that
are not among its own arguments, so nothing is counted twice. The run fits when the largest total fits the
device memory.

The largest micro-batch that fits: powers of two dividing the batch (and divisible by the mesh's batch
shards), searched by bisection (the train step's total grows with the micro-batch), compiling the train step
at each one tried.

Caveats: XLA:CPU fuses and assigns buffers differently from GPU / TPU (it may, for example, widen bfloat16
intermediates to float32), so the numbers are estimates of the right order, not guarantees; leave headroom.
`measure_train_step_rss` compares a prediction with the measured peak RSS of a real CPU run.

Legend: B batch, P prompt tokens, R response tokens, V vocab, K sampler top-k, M micro-batch.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import time
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from opd_jax.errors import InputError
from opd_jax.models import shapes
from opd_jax.models.config import ModelConfig, read_hf_config
from opd_jax.models.decoder import Decoder
from opd_jax.models.sharding import batch_sharding, make_mesh, mesh_shape, per_device_bytes
from opd_jax.objectives.losses import ObjectiveConfig
from opd_jax.rollout import placement
from opd_jax.rollout.config import RolloutConfig
from opd_jax.rollout.placement import split_devices
from opd_jax.train import programs
from opd_jax.train.optimizer import make_optimizer, make_schedule
from opd_jax.train.step import RolloutBatch, TrainState

# The folder that holds the opd_jax package (a checkout or site-packages): a subprocess imports it from there.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIB = 2 ** 30
SAMPLER_TOP_K = 64  # top-k log-probs the sampler returns per token (vocabulary mismatch metrics)
REMATS = ("none", "full", "dots_saveable")
# Planning compiles are never run: skip LLVM's optimizations (same buffer sizes, ~2x faster compiles on CPU).
PLANNING_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def known_models() -> list[str]:
  return shapes.names()


def resolve_model(name_or_dir: str, flag: str) -> ModelConfig:
  """An HF config.json directory, or the name of a shipped real shape (opd_jax.models.shapes)."""
  if os.path.isdir(name_or_dir):
    return read_hf_config(name_or_dir)
  if name_or_dir.lower() in known_models():
    return shapes.load(name_or_dir)
  raise InputError(f"{flag}={name_or_dir!r} is neither an HF model directory nor a shipped model name; "
                   f"known names: {', '.join(known_models())}")


def devices_of_config(config) -> int:
  """Devices a run config's mesh names: data (1 when -1, i.e. 'the rest') x fsdp x tensor for the learner, plus
  the sampler's own devices when disaggregated. What launch/plan_memory.py --config simulates unless told."""
  mesh, rollout = config.mesh, config.rollout
  learner = max(mesh.data, 1) * max(mesh.fsdp, 1) * max(mesh.tensor, 1)
  return learner + (max(rollout.devices, 0) if rollout.placement == "disaggregated" else 0)


# PlanConfig's counts: field -> (the launch flag that sets it, its smallest value)
NUMBER_FLAGS = {"batch_size": ("--batch", 1), "prompt_tokens": ("--prompt_tokens", 1),
                "response_tokens": ("--response_tokens", 1), "devices": ("--devices", 1),
                "staleness_steps": ("--staleness", 0), "logits_chunk": ("--logits_chunk", 0),
                "micro_batch_size": ("--micro_batch_size", 0)}


def check_numbers(**values) -> None:
  """The ranges of PlanConfig's counts and device_memory_bytes, each error naming its flag; needs no I/O, so
  launch/plan_memory.py checks the flags it was given with it before it reads any model."""
  for field, value in values.items():
    if field == "device_memory_bytes":
      if value <= 0:
        raise InputError(f"--device_memory_gb must be > 0, got {value / GIB:g}")
      continue
    flag, least = NUMBER_FLAGS[field]
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
      raise InputError(f"{flag} must be an integer >= {least}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class PlanConfig:
  """One run to plan. Errors name the launch flag (launch/plan_memory.py) that set the bad value."""

  teacher: ModelConfig
  student: ModelConfig
  batch_size: int  # responses per step (B)
  prompt_tokens: int  # P
  response_tokens: int  # R = max new tokens
  device_memory_bytes: int
  devices: int = 1  # simulated CPU devices, all pools together
  mesh_fsdp: int = 1  # learner mesh: data = learner devices / (fsdp * tensor)
  mesh_tensor: int = 1
  weights: str = "none"  # sampler weight recipe: none | bf16 | int8 | fp8
  kv_cache: str = "native"  # sampler KV cache: native | bf16 | int8 | fp8
  staleness_steps: int = 0  # sampler weight snapshots kept
  micro_batch_size: int = 0  # rows per train-step pass; 0 = the whole batch
  logits_chunk: int = 512  # tokens (rows x positions) per vocabulary chunk (train step, scoring, eval); 0 = whole
  remat: str = "full"  # student layer rematerialization: none | full | dots_saveable
  objective: str = "reverse_kl_pg"  # decides what the teacher hands the learner (hidden states / top-k)
  top_k: int = 16  # *_topk objectives: teacher top-k support
  student_param_dtype: str = "float32"  # master weights and optimizer state
  student_compute_dtype: str = "bfloat16"
  teacher_dtype: str = "bfloat16"  # teacher params (and compute, unless teacher_compute_dtype says otherwise)
  teacher_compute_dtype: str = ""  # "" = teacher_dtype
  placement: str = "colocated"  # colocated | disaggregated (the sampler on rollout_devices of its own)
  rollout_devices: int = 0  # disaggregated: the sampler's devices, out of `devices`
  rollout_tensor: int = 1  # sampler mesh tensor axis
  quantize_embedding: bool = False  # int8/fp8 recipes: the embedding table too
  snapshots_on: str = "device"  # staleness snapshots: device | host
  split_mismatch: bool = False  # a dense learner copy per kept version (the loop's rollout.split_mismatch)
  attention: str = "xla"  # model.attention of both models
  scan_layers: bool = True  # model.scan_layers
  temperature: float = 1.0  # rollout.temperature
  sampler_top_k: int = SAMPLER_TOP_K  # train.vocab_metrics_top_k: top-k log-probs the sampler returns
  group_size: int = 1  # responses per prompt (rollout.samples_per_prompt, or grpo's group_size)
  eval_batch_size: int = 0  # train.eval_batch_size: rows per evaluation program; 0 = batch_size
  eval_sampled: bool = True  # train.eval_sampled
  eval_weights: str = "learner"  # train.eval_weights: learner (learner mesh) | sampler (synced, sampler mesh)
  weight_rules: tuple = ()  # rollout.weight_rules: explicit (regex, precision) rules (a sensitivity recipe)
  noise_sigma: float = 0.0  # rollout.noise_sigma (the weight sync adds the noise)
  sampling_top_k: int = 0  # rollout.top_k / top_p: the sampler's filters (top-p sorts the vocabulary)
  sampling_top_p: float = 1.0
  objective_fields: tuple = ()  # the rest of config.objective as (field, value) pairs (objective / top_k win)
  # config.teacher_endpoint with served_teacher.preflight off: every batch is scored over HTTP, so the run never
  # compiles teacher_score (the preflight scores the first batch in process too)
  served_teacher: bool = False

  @classmethod
  def from_config(cls, config, teacher: ModelConfig, student: ModelConfig, *, devices: int,
                  device_memory_bytes: int) -> "PlanConfig":
    """The plan of the run `launch/train.py --config=...` executes with these model shapes: every setting a
    program depends on is read from the run config (opd_jax/train/programs.py builds them alike)."""
    r, t, m, o = config.rollout, config.train, config.mesh, config.objective
    group = o.group_size if o.name == "grpo" else r.samples_per_prompt
    served = bool(config.teacher_endpoint)  # the loop trains what the served teacher can feed (opd_jax/spec)
    objective = ObjectiveConfig(**dict(o))
    objective = objective.over_the_wire(min(teacher.vocab_size, student.vocab_size)) if served else objective
    return cls(teacher=teacher, student=student, batch_size=t.batch_size, prompt_tokens=config.data.max_prompt_tokens,
               response_tokens=r.max_new_tokens, device_memory_bytes=device_memory_bytes, devices=devices,
               mesh_fsdp=m.fsdp, mesh_tensor=m.tensor, weights=r.weights, kv_cache=r.kv_cache,
               staleness_steps=r.staleness_steps, micro_batch_size=t.micro_batch_size, logits_chunk=t.logits_chunk,
               remat=config.model.remat, objective=objective.name, top_k=objective.top_k,
               student_param_dtype=config.student_param_dtype, student_compute_dtype=config.student_compute_dtype,
               teacher_dtype=config.teacher_param_dtype, teacher_compute_dtype=config.teacher_compute_dtype,
               placement=r.placement, rollout_devices=r.devices, rollout_tensor=r.tensor_parallel,
               quantize_embedding=r.quantize_embedding, snapshots_on=r.snapshots_on,
               split_mismatch=r.split_mismatch, attention=config.model.attention,
               scan_layers=config.model.scan_layers, temperature=r.temperature,
               sampler_top_k=student.vocab_size if t.vocab_metrics_top_k == -1 else t.vocab_metrics_top_k,
               group_size=group, eval_batch_size=t.eval_batch_size, eval_sampled=bool(t.eval_sampled),
               eval_weights=t.eval_weights,
               weight_rules=tuple(tuple(rule) for rule in r.weight_rules), noise_sigma=r.noise_sigma,
               sampling_top_k=r.top_k, sampling_top_p=r.top_p, objective_fields=tuple(sorted(dict(o).items())),
               served_teacher=served and config.served_teacher.preflight == "off")

  def __post_init__(self):
    check_numbers(**{field: getattr(self, field) for field in (*NUMBER_FLAGS, "device_memory_bytes")})
    if self.micro_batch_size and self.batch_size % self.micro_batch_size:
      raise InputError(f"--micro_batch_size={self.micro_batch_size} does not divide --batch={self.batch_size}")
    if self.remat not in REMATS:
      raise InputError(f"--remat must be one of {', '.join(REMATS)}, got {self.remat!r}")
    rollout = self.rollout()  # validates --weights / --kv_cache / placement
    try:
      split_devices(rollout.placement, rollout.devices, range(self.devices))
      sampler_mesh_shape = mesh_shape(-1, 1, self.rollout_tensor, self.sampler_devices)
      data, fsdp, _ = mesh_shape(-1, self.mesh_fsdp, self.mesh_tensor, self.learner_devices)
    except ValueError as e:
      raise InputError(f"--mesh_fsdp / --mesh_tensor / --devices / --rollout_devices / --rollout_tensor: {e}") from None
    if self.batch_size % sampler_mesh_shape[0]:
      raise InputError(f"--batch={self.batch_size} is not divisible by the sampler's batch shards "
                       f"{sampler_mesh_shape[0]} (its devices / --rollout_tensor)")
    for rows, flag in ((self.batch_size, "--batch"), (self.micro_batch_size, "--micro_batch_size")):
      if rows % (data * fsdp):
        raise InputError(f"{flag}={rows} is not divisible by the mesh's batch shards data*fsdp={data * fsdp}")
    try:
      ObjectiveConfig(name=self.objective, top_k=self.top_k)
    except ValueError as e:
      raise InputError(f"--objective={self.objective!r}: {e}") from None

  def rollout(self) -> RolloutConfig:
    try:
      return RolloutConfig(weights=self.weights, kv_cache=self.kv_cache, staleness_steps=self.staleness_steps,
                           max_new_tokens=self.response_tokens, quantize_embedding=self.quantize_embedding,
                           placement=self.placement, devices=self.rollout_devices,
                           tensor_parallel=self.rollout_tensor, snapshots_on=self.snapshots_on,
                           split_mismatch=self.split_mismatch, temperature=self.temperature,
                           weight_rules=self.weight_rules, noise_sigma=self.noise_sigma, top_k=self.sampling_top_k,
                           top_p=self.sampling_top_p, weight_layout="stored")  # plans are for accelerators
    except ValueError as e:
      raise InputError(f"rollout flags (--weights={self.weights!r}, --kv_cache={self.kv_cache!r}, "
                       f"--placement={self.placement!r}, ...): {e}") from None

  def settings(self, micro_batch_size: int | None = None) -> programs.RunSettings:
    """The RunSettings the run's programs are built with (micro_batch_size: override, for the search)."""
    micro = self.micro_batch_size if micro_batch_size is None else micro_batch_size
    fields = {**dict(self.objective_fields), "name": self.objective, "top_k": self.top_k}
    if not self.objective_fields:
      fields["group_size"] = self.group_size
    objective = ObjectiveConfig(**fields)
    return programs.RunSettings(self.rollout(), objective, self.logits_chunk * self.batch_shards, micro,
                                self.sampler_top_k, self.group_size, tuple(self.student.eos_token_id), 0,
                                self.eval_sampled, self.eval_weights)

  @property
  def disaggregated(self) -> bool:
    return self.placement == "disaggregated"

  @property
  def learner_devices(self) -> int:
    return self.devices - self.rollout_devices if self.disaggregated else self.devices

  @property
  def sampler_devices(self) -> int:
    return self.rollout_devices if self.disaggregated else self.devices

  @property
  def batch_shards(self) -> int:
    data, fsdp, _ = mesh_shape(-1, self.mesh_fsdp, self.mesh_tensor, self.learner_devices)
    return data * fsdp


@dataclasses.dataclass(frozen=True)
class Program:
  fn: Callable  # jitted; lowered with `args`
  args: tuple  # abstract arguments (ShapeDtypeStructs with shardings)
  uses: tuple[str, ...]  # resident entries that are among its arguments (not added again to its total)
  pool: str = "learner"  # whose devices it runs on: learner | sampler (the same devices when colocated)


def resident_pools(plan: PlanConfig) -> dict[str, str]:
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


def _abstract_model(config: ModelConfig, dtype: str, param_dtype: str, **options):
  model = nnx.eval_shape(lambda: Decoder(config, dtype=jnp.dtype(dtype), param_dtype=jnp.dtype(param_dtype),
                                         **options))
  return nnx.split(model)


def build_programs(plan: PlanConfig, mesh: Mesh, micro_batch_size: int):
  """Every jitted program of a run with abstract sharded arguments, plus the abstract resident state.

  The programs come from opd_jax.train.programs.build, the builders the training loop uses, with the plan's
  settings. Returns (programs by name, resident trees by name). The train step takes the whole batch and
  accumulates gradients over `micro_batch_size` rows.
  """
  B, P, R, K = plan.batch_size, plan.prompt_tokens, plan.response_tokens, plan.sampler_top_k
  objective = plan.settings(micro_batch_size).objective
  options = dict(attention=plan.attention, scan_layers=plan.scan_layers, remat=plan.remat)
  s_graphdef, s_params = _abstract_model(plan.student, plan.student_compute_dtype, plan.student_param_dtype,
                                         **options)
  t_graphdef, t_params = _abstract_model(plan.teacher, plan.teacher_compute_dtype or plan.teacher_dtype,
                                         plan.teacher_dtype, **options)
  optimizer = make_optimizer(make_schedule(learning_rate=1e-6, warmup_steps=0, total_steps=1),
                             weight_decay=0.0, grad_clip_norm=1.0)
  state = TrainState(s_params, jax.eval_shape(optimizer.init, s_params), jax.ShapeDtypeStruct((), jnp.int32))
  rollout = plan.rollout()
  settings = plan.settings(micro_batch_size)
  s_mesh = plan_sampler_mesh(plan)
  run = programs.build(settings, graphdef=s_graphdef, teacher_graphdef=t_graphdef, state=state,
                       teacher_state=t_params, optimizer=optimizer, mesh=mesh, sampler_mesh=s_mesh,
                       compute_dtype=plan.student_compute_dtype)
  state = programs.abstract_with(state, run.state_shardings)
  t_params = programs.abstract_with(t_params, run.teacher_shardings)
  sampler_params = run.weight_sync.abstract
  rows = batch_sharding(mesh)
  s_rows, s_replicated = placement.batch_sharding(s_mesh), NamedSharding(s_mesh, PartitionSpec())
  split = rollout.keeps_dense_copies(lagged=plan.staleness_steps > 0)
  teacher_k = objective.top_k if objective.needs_teacher_topk else 0
  batch = RolloutBatch(
      prompt_BxP=_abstract((B, P), jnp.int32, rows), prompt_valid_BxP=_abstract((B, P), jnp.bool_, rows),
      response_BxR=_abstract((B, R), jnp.int32, rows), mask_BxR=_abstract((B, R), jnp.float32, rows),
      sampler_logp_BxR=_abstract((B, R), jnp.float32, rows), teacher_logp_BxR=_abstract((B, R), jnp.float32, rows),
      teacher_hidden_BxRxD=(_abstract((B, R, plan.teacher.hidden_size),
                                      jnp.dtype(plan.teacher_compute_dtype or plan.teacher_dtype), rows)
                            if objective.needs_teacher_hidden else None),
      teacher_top_logprobs_BxRxK=_abstract((B, R, teacher_k), jnp.float32, rows) if teacher_k else None,
      teacher_top_ids_BxRxK=_abstract((B, R, teacher_k), jnp.int32, rows) if teacher_k else None,
      sampler_top_logprobs_BxRxK=_abstract((B, R, K), jnp.float32, rows) if K else None,
      sampler_top_ids_BxRxK=_abstract((B, R, K), jnp.int32, rows) if K else None,
      snapshot_logp_BxR=_abstract((B, R), jnp.float32, rows) if split else None)
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
  programs_by_name = {
      "sampler": Program(run.sampler._fn, (sampler_params, *sampler_prompts, key), ("sampler_weights",), "sampler"),
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
  if "_sampled" in run.eval_samplers:  # train.eval_sampled: a second, temperature-1 evaluation program
    programs_by_name["eval_sampler_sampled"] = dataclasses.replace(
        programs_by_name["eval_sampler"], fn=run.eval_samplers["_sampled"]._fn)
  on_device = plan.snapshots_on == "device"
  resident = {"teacher_params": t_params, "learner_params": state.params, "optimizer_state": state.opt_state,
              "rollout_batch": batch, "sampler_weights": sampler_params,
              "staleness_snapshots": [sampler_params] * plan.staleness_steps if on_device else [],
              "dense_snapshots": [state.params] * (plan.staleness_steps + 1) if split else []}
  return programs_by_name, resident


@dataclasses.dataclass(frozen=True)
class ProgramMemory:
  argument_bytes: int
  output_bytes: int
  temp_bytes: int
  alias_bytes: int
  peak_bytes: int  # see the module docstring
  compile_seconds: float


def compile_memory(program: Program) -> ProgramMemory:
  """Lowers and compiles (never runs) the program. LLVM optimization is off: buffer assignment happens on
  the optimized HLO before LLVM, so the sizes are the same, and compiling takes about half the time."""
  start = time.perf_counter()
  compiled = program.fn.lower(*program.args).compile(compiler_options=PLANNING_COMPILER_OPTIONS)
  seconds = time.perf_counter() - start
  stats = compiled.memory_analysis()
  arg, out, temp, alias = (stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.temp_size_in_bytes,
                           stats.alias_size_in_bytes)
  return ProgramMemory(arg, out, temp, alias, arg + out + temp - alias, seconds)


@dataclasses.dataclass
class MemoryPlan:
  plan: PlanConfig
  programs: dict[str, ProgramMemory]  # compiled at micro_batch_used
  totals: dict[str, int]  # program peak + resident entries it does not take as arguments
  resident: dict[str, int]
  micro_batch_used: int
  micro_batch_size: int  # largest that fits (0: none does)
  micro_batch_totals: dict[int, int]  # train-step total at each micro-batch compiled
  pools: dict[str, str] = dataclasses.field(default_factory=dict)  # program -> learner | sampler (its devices)
  planner_peak_rss_bytes: int = 0  # the planning process's own peak RSS: the host memory its compiles needed

  @property
  def peak_bytes_per_device(self) -> int:
    return max(self.totals.values())

  @property
  def fits(self) -> bool:
    return self.peak_bytes_per_device <= self.plan.device_memory_bytes

  def to_json(self) -> dict:
    return {
        "fits": self.fits, "peak_bytes_per_device": self.peak_bytes_per_device,
        "device_memory_bytes": self.plan.device_memory_bytes, "micro_batch_size": self.micro_batch_size,
        "micro_batch_used": self.micro_batch_used,
        "programs": {name: m.peak_bytes for name, m in self.programs.items()},
        "program_totals": dict(self.totals), "resident_bytes": dict(self.resident),
        "program_details": {name: dataclasses.asdict(m) for name, m in self.programs.items()},
        "micro_batch_totals": {str(k): v for k, v in sorted(self.micro_batch_totals.items())},
        "placement": self.plan.placement, "learner_devices": self.plan.learner_devices,
        "sampler_devices": self.plan.sampler_devices,
        "sampler_param_bytes": self.resident["sampler_weights"],  # per sampler device
        "host_snapshot_bytes": (self.resident["sampler_weights"] * self.plan.staleness_steps
                                if self.plan.snapshots_on == "host" else 0),  # per sampler device, host memory
        "planner_peak_rss_bytes": self.planner_peak_rss_bytes,
    }


def _plan_devices(plan: PlanConfig) -> tuple[list, list]:
  if jax.device_count() < plan.devices:
    raise InputError(f"--devices={plan.devices} but jax sees {jax.device_count()} device(s); set "
                     f"XLA_FLAGS=--xla_force_host_platform_device_count={plan.devices} before jax is imported "
                     "(launch/plan_memory.py does)")
  return split_devices(plan.placement, plan.rollout_devices, jax.devices()[:plan.devices])


def plan_mesh(plan: PlanConfig) -> Mesh:
  """The learner's mesh."""
  return make_mesh(-1, plan.mesh_fsdp, plan.mesh_tensor, devices=_plan_devices(plan)[0])


def plan_sampler_mesh(plan: PlanConfig) -> Mesh:
  return placement.sampler_mesh(_plan_devices(plan)[1], plan.rollout_tensor)


def _total(memory: ProgramMemory, program: Program, resident: dict[str, int], plan: PlanConfig) -> int:
  pools = resident_pools(plan)
  return memory.peak_bytes + sum(b for name, b in resident.items()
                                 if name not in program.uses and pools[name] == program.pool)


def micro_batch_candidates(plan: PlanConfig) -> list[int]:
  """Powers of two that divide the batch and split evenly over the mesh's batch shards, ascending."""
  return [m for m in (2 ** i for i in range(plan.batch_size.bit_length()))
          if plan.batch_size % m == 0 and m % plan.batch_shards == 0]


def largest_micro_batch(plan: PlanConfig, mesh: Mesh, resident: dict[str, int], totals: dict[int, int],
                        log: Callable[[str], None] = lambda s: None) -> int:
  """Bisection over micro_batch_candidates (upper middle first: the answer is usually near the top), starting
  from what `totals` (micro-batch -> train-step total) already knows; compiles fill `totals`."""
  candidates, best = micro_batch_candidates(plan), 0
  lo, hi = 0, len(candidates) - 1
  for m, total in totals.items():  # known results narrow the range
    if m in candidates and total <= plan.device_memory_bytes:
      best, lo = max(best, m), max(lo, candidates.index(m) + 1)
    elif m in candidates:
      hi = min(hi, candidates.index(m) - 1)
  while lo <= hi:
    mid = (lo + hi + 1) // 2
    m = candidates[mid]
    program = build_programs(plan, mesh, m)[0]["train_step"]
    memory = compile_memory(program)
    totals[m] = _total(memory, program, resident, plan)
    log(f"  train_step at micro-batch {m}: total {totals[m] / GIB:.2f} GiB ({memory.compile_seconds:.1f} s compile)")
    if totals[m] <= plan.device_memory_bytes:
      best, lo = m, mid + 1
    else:
      hi = mid - 1
  return best


def plan_memory(plan: PlanConfig, log: Callable[[str], None] = lambda s: None) -> MemoryPlan:
  """Compiles every program at the configured micro-batch, then searches the largest micro-batch that fits."""
  mesh = plan_mesh(plan)
  used = plan.micro_batch_size or plan.batch_size
  programs, resident_trees = build_programs(plan, mesh, used)
  resident = {name: per_device_bytes(tree) for name, tree in resident_trees.items()}
  memory = {}
  for name, program in programs.items():
    memory[name] = compile_memory(program)
    log(f"  compiled {name} in {memory[name].compile_seconds:.1f} s")
  totals = {name: _total(memory[name], program, resident, plan) for name, program in programs.items()}
  trials = {used: totals["train_step"]}
  best = largest_micro_batch(plan, mesh, resident, trials, log)
  pools = {name: program.pool for name, program in programs.items()}
  return MemoryPlan(plan, memory, totals, resident, used, best, trials, pools, rss_bytes()[1])


def rss_bytes() -> tuple[int, int]:
  """(current, peak) resident set size of this process."""
  with open("/proc/self/statm") as f:
    current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  return current, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: ru_maxrss in KiB
