"""PlanSpec: the run a memory plan is for. It is the run's own RunSpec (opd_jax/spec, every setting and check the
training loop uses) plus what only planning needs: the two model shapes, the simulated devices and the memory of
one device. The properties below are views of the spec in the planner's terms; none of them is a second default.

The entry point (launch/plan_memory.py) builds the spec from a config with `RunSpec.from_config(config,
device_count=devices, models=shapes_of)`: `shapes_of` reads each model's shape from an HF config.json directory or
a shipped shape name (opd_jax.models.shapes), so a run is planned before its checkpoints exist.
"""

from __future__ import annotations

import dataclasses
import os

from opd_jax.errors import InputError
from opd_jax.models import shapes
from opd_jax.models.config import ModelConfig, read_hf_config
from opd_jax.models.sharding import mesh_shape
from opd_jax.rollout.config import RolloutConfig
from opd_jax.spec.parts import PairSpec
from opd_jax.spec.run_spec import RunSpec
from opd_jax.train import programs

GIB = 2 ** 30


def known_models() -> list[str]:
  return shapes.names()


def resolve_model(name_or_dir: str, field: str) -> ModelConfig:
  """An HF config.json directory, or the name of a shipped real shape (opd_jax.models.shapes)."""
  if os.path.isdir(name_or_dir):
    return read_hf_config(name_or_dir)
  if name_or_dir.lower() in known_models():
    return shapes.load(name_or_dir)
  raise InputError(f"{field}={name_or_dir!r} is neither an HF model directory nor a shipped model name; "
                   f"known names: {', '.join(known_models())}")


def shapes_of(pair: PairSpec) -> tuple[ModelConfig, ModelConfig]:
  """(teacher, student) shapes of a pair whose models may be shipped shape names (RunSpec.from_config's models)."""
  return resolve_model(pair.teacher, "config.teacher"), resolve_model(pair.student, "config.student")


@dataclasses.dataclass(frozen=True)
class PlanSpec:
  """One run to plan (module docstring)."""
  run: RunSpec
  teacher: ModelConfig
  student: ModelConfig
  devices: int  # simulated CPU devices, all pools together
  device_memory_bytes: int  # of one device

  def __post_init__(self):
    """The run's layout on `devices` was checked by RunSpec.from_config(device_count=devices)."""
    if self.device_memory_bytes <= 0:
      raise InputError(f"--device_memory_gb must be > 0, got {self.device_memory_bytes / GIB:g}")

  def rollout(self) -> RolloutConfig:
    """The run's rollout, with weights stored at the recipe's precision (plans are for accelerators)."""
    return dataclasses.replace(self.run.rollout, weight_layout="stored")

  def settings(self, micro_batch_size: int | None = None) -> programs.RunSettings:
    """The RunSettings the run's programs are built with (micro_batch_size: override, for the search)."""
    settings = programs.RunSettings.for_run(self.run, vocab_size=self.student.vocab_size,
                                            eos_ids=tuple(self.student.eos_token_id), pad_id=0,
                                            batch_shards=self.batch_shards)
    micro = self.micro_batch_size if micro_batch_size is None else micro_batch_size
    return dataclasses.replace(settings, rollout=self.rollout(), micro_batch_size=micro, teacher_names=())

  # The run's settings in the planner's terms.
  batch_size = property(lambda self: self.run.train.batch_size)  # B
  prompt_tokens = property(lambda self: self.run.data.max_prompt_tokens)  # P
  response_tokens = property(lambda self: self.run.rollout.max_new_tokens)  # R
  micro_batch_size = property(lambda self: self.run.train.micro_batch_size)
  eval_batch_size = property(lambda self: self.run.train.eval_batch_size)
  eval_weights = property(lambda self: self.run.train.eval_weights)
  sampler_top_k = property(lambda self: self.run.train.sampler_top_k(self.student.vocab_size))
  mesh_fsdp = property(lambda self: self.run.mesh.fsdp)
  mesh_tensor = property(lambda self: self.run.mesh.tensor)
  weights = property(lambda self: self.run.rollout.weights)
  kv_cache = property(lambda self: self.run.rollout.kv_cache)
  quantize_embedding = property(lambda self: self.run.rollout.quantize_embedding)
  staleness_steps = property(lambda self: self.run.rollout.staleness_steps)
  snapshots_on = property(lambda self: self.run.rollout.snapshots_on)
  placement = property(lambda self: self.run.rollout.placement)
  rollout_devices = property(lambda self: self.run.rollout.devices)
  rollout_tensor = property(lambda self: self.run.rollout.tensor_parallel)

  @property
  def served_teacher(self) -> bool:
    """Every batch scored over HTTP by another process (a served teacher with its preflight off): the run never
    compiles teacher_score (the preflight scores the first batch in process too)."""
    return bool(self.run.teachers.specs[0].endpoint) and not self.run.teachers.multi and \
        self.run.served.preflight == "off"

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

  def model_options(self, role: str) -> dict:
    """Decoder(...) options of one model: compute and parameter dtypes and the run's model options."""
    pair = self.run.pair
    m = pair.model
    return dict(dtype=pair.compute_dtype(role), param_dtype=pair.param_dtype(role), attention=m.attention,
                scan_layers=m.scan_layers, remat=m.remat)
