"""The programs of a run (opd_jax/train/programs.py): weights are arguments of every one of them, never constants
baked into the executable, and the memory planner compiles the same programs the loop runs."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from opd_jax.models.config import ModelConfig
from opd_jax.models.decoder import Decoder
from opd_jax.models import sharding as shard_lib
from opd_jax.objectives.losses import ObjectiveConfig
from opd_jax.rollout import placement
from opd_jax.rollout.config import RolloutConfig
from opd_jax.train import programs
from opd_jax.train.optimizer import make_optimizer, make_schedule
from opd_jax.train.step import RolloutBatch, TrainState

# A program that captured a weight would hold it as a constant over LIMIT: the 8192 x 64 float32 embedding is 2 MiB,
# the smallest kernel (k_proj, [2, 64, 32] stacked) 16 KiB, 8 KiB a layer; only the norms' scales (256-512 bytes) fit.
CONFIG = ModelConfig(model_type="qwen3", vocab_size=8192, hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                     tie_word_embeddings=True, eos_token_id=(1,))
LIMIT = 1 << 10
_CONSTANT = re.compile(r"stablehlo\.constant (dense_resource<[^>]*>|dense<\"0x[0-9A-Fa-f]*\">|dense<\[.*?\]>) : "
                       r"tensor<([0-9x]+)x(f32|bf16|f16|i32|i8|ui8|f8\w*)>")
_BYTES = {"f32": 4, "i32": 4, "bf16": 2, "f16": 2, "i8": 1, "ui8": 1}


def large_constants(lowered) -> list[str]:
  """Non-splat constants of more than LIMIT bytes in a lowered program (a captured array shows up as one)."""
  found = []
  for literal, shape, dtype in _CONSTANT.findall(lowered.as_text()):
    size = int(np.prod([int(d) for d in shape.split("x")])) * _BYTES.get(dtype, 1)
    if size > LIMIT:
      found.append(f"{shape}x{dtype} ({size} bytes)")
  return found


@pytest.fixture(scope="module")
def run():
  model = Decoder(CONFIG, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  teacher_graphdef, teacher_state = nnx.split(Decoder(CONFIG, rngs=nnx.Rngs(1)))
  optimizer = make_optimizer(make_schedule(learning_rate=1e-3, warmup_steps=0, total_steps=2), weight_decay=0.0,
                             grad_clip_norm=1.0)
  state = TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))
  mesh = shard_lib.make_mesh(-1, 1, 1, devices=jax.devices()[:1])
  sampler_mesh = placement.sampler_mesh(jax.devices()[:1], 1)
  rollout = RolloutConfig(weights="int8", max_new_tokens=4)
  settings = programs.RunSettings(rollout, ObjectiveConfig(name="reverse_kl"), 16, 0, 8, 1, (1,), 0, True)
  built = programs.build(settings, graphdef=graphdef, teacher_graphdef=teacher_graphdef, state=state,
                         teacher_state=teacher_state, optimizer=optimizer, mesh=mesh, sampler_mesh=sampler_mesh,
                         compute_dtype=jnp.float32)
  return built, jax.device_put(state, built.state_shardings), teacher_state


def _lowered_programs(run):
  built, state, teacher = run
  B, P, R = 2, 3, 4
  prompt = jnp.ones((B, P), jnp.int32)
  valid = jnp.ones((B, P), bool)
  response, mask = jnp.ones((B, R), jnp.int32), jnp.ones((B, R), jnp.float32)
  key = jax.random.key(0)
  sampler_params = built.weight_sync(state.params, 0)
  scores = built.teacher_score(teacher, prompt, valid, response, mask)
  batch = RolloutBatch(prompt, valid, response, mask, jnp.zeros((B, R)), scores.logp_BxR,
                       teacher_hidden_BxRxD=scores.hidden_BxRxD)
  return {
      "weight_sync": built.weight_sync._fn.lower(state.params, jnp.int32(0)),
      "sampler": built.sampler._fn.lower(sampler_params, prompt, valid, key),
      "teacher_score": built.teacher_score.lower(teacher, prompt, valid, response, mask),
      "student_score": built.student_score.lower(state.params, prompt, valid, response, mask),
      "train_step": built.train_step.lower(state, batch, teacher),
      "eval_greedy": built.eval_samplers[""]._fn.lower(state.params, prompt, valid, key),
      "eval_sampled": built.eval_samplers["_sampled"]._fn.lower(state.params, prompt, valid, key),
      "teacher_greedy": built.teacher_greedy._fn.lower(teacher, prompt, valid, key),
      "eval_reverse_kl": built.eval_reverse_kl.lower(state.params, teacher, prompt, valid, response, mask),
      "eval_forward_kl": built.eval_forward_kl.lower(state.params, teacher, prompt, valid, response, mask),
  }


def test_no_program_holds_a_weight_as_a_constant(run):
  lowered = _lowered_programs(run)
  assert len(lowered) == 10
  found = {name: large_constants(program) for name, program in lowered.items()}
  assert not any(found.values()), found


def test_the_check_finds_a_captured_weight(run):
  """The detector itself: a function that closes over the teacher holds its 2 MiB embedding as a constant."""
  _, state, teacher = run
  embedding = teacher["embed_tokens"]["embedding"].get_value()
  captured = jax.jit(lambda tokens: jnp.take(embedding, tokens, axis=0)).lower(jnp.ones((2, 3), jnp.int32))
  assert large_constants(captured) == ["8192x64xf32 (2097152 bytes)"]
  kernel = teacher["layers"]["self_attn"]["k_proj"]["kernel"].get_value()[0]  # the smallest kernel, one layer
  captured = jax.jit(lambda x: x @ kernel).lower(jnp.ones((2, 64), jnp.float32))
  assert large_constants(captured) == ["64x32xf32 (8192 bytes)"]
  argument = jax.jit(lambda table, tokens: jnp.take(table, tokens, axis=0)).lower(embedding, jnp.ones((2, 3), jnp.int32))
  assert large_constants(argument) == []


def _plan(config, devices: int):
  """The plan of `config` on `devices`, its models at Qwen3-0.6B's shape instead of checkpoint files."""
  from opd_jax.planning.plan_spec import GIB, PlanSpec, resolve_model
  from opd_jax.spec import RunSpec
  shape = resolve_model("qwen3-0.6b", "config.student")
  spec = RunSpec.from_config(config, device_count=devices, models=lambda pair: (shape, shape))
  return PlanSpec(spec, shape, shape, devices=devices, device_memory_bytes=GIB)


@pytest.mark.parametrize("config_file", ["configs/pair1.py", "configs/real/qwen3_1p7b_to_0p6b.py"])
def test_the_planner_builds_the_programs_with_the_runs_settings(config_file):
  """A plan hands programs.build what the loop hands it for the same config, and builds the models with the
  run's dtypes and model options."""
  import importlib.util
  import os
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  spec = importlib.util.spec_from_file_location("run_config", os.path.join(root, config_file))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  plan = _plan(config, devices=1)
  loop = programs.RunSettings.for_run(plan.run, vocab_size=plan.student.vocab_size,
                                      eos_ids=plan.student.eos_token_id, pad_id=0)
  # The one deliberate difference: plans are for accelerators, so the planner compiles the sampler's weights as
  # stored; the loop's "auto" layout becomes dense per-layer copies on CPU (rollout.weight_layout).
  assert plan.settings().rollout.weight_layout == "stored"
  assert plan.settings() == dataclasses.replace(loop, rollout=dataclasses.replace(loop.rollout, weight_layout="stored"))
  assert plan.settings(micro_batch_size=4).micro_batch_size == 4
  m = config.model
  for role in ("teacher", "student"):
    assert plan.model_options(role) == dict(
        dtype=config[f"{role}_compute_dtype"], param_dtype=config[f"{role}_param_dtype"], attention=m.attention,
        scan_layers=m.scan_layers, remat=m.remat)


def test_the_planner_simulates_the_devices_the_config_names():
  """plan_memory --config simulates the mesh the run would build: learner data x fsdp x tensor, plus the
  sampler's own devices when disaggregated (data=-1 means 'the rest', one way at least)."""
  from opd_jax.rollout.config import RolloutConfig
  from opd_jax.spec import MeshSpec, devices_named

  def devices(data, fsdp, tensor, placement="colocated", rollout_devices=0):
    return devices_named(MeshSpec(data, fsdp, tensor), RolloutConfig(placement=placement, devices=rollout_devices))

  assert devices(-1, 1, 1) == 1
  assert devices(-1, 8, 1) == 8
  assert devices(2, 2, 2) == 8
  assert devices(-1, 4, 1, "disaggregated", 4) == 8
  assert devices(-1, 1, 4, "disaggregated", 2) == 6


def test_logits_chunk_counts_tokens_per_device():
  """train.logits_chunk is per device: the loop's and the planner's whole-batch chunk is it times the devices
  the batch is split over (data x fsdp), so an fsdp-8 run's devices each get logits_chunk tokens per chunk."""
  from configs import common
  config = common.config_for("pair1")
  config.mesh.fsdp = 8
  plan = _plan(config, devices=8)
  loop = programs.RunSettings.for_run(plan.run, vocab_size=plan.student.vocab_size,
                                      eos_ids=plan.student.eos_token_id, pad_id=0, batch_shards=8)
  assert loop.logits_chunk == plan.settings().logits_chunk == 8 * config.train.logits_chunk
