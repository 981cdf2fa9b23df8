"""Where the sampler runs: its devices, its mesh and its inference layout.

Placements:
  colocated      learner and sampler time-share every device. The sampler still gets its own mesh over the
                 same devices (data x tensor), so its weights sit on an inference layout, not the learner's
                 FSDP one.
  disaggregated  the first `rollout.devices` devices form the sampler's mesh and the rest the learner's, so
                 in async mode sampling and learning run at the same time on different chips.

The sampler mesh has the learner's three axis names with fsdp = 1: batch over `data`, weights tensor-parallel
over `tensor` (Megatron column-parallel q/k/v/gate/up, row-parallel o/down, vocabulary-parallel embedding and
LM head), and the KV cache over batch rows (`data`) and KV heads (`tensor`). Nothing is sharded over fsdp, so
a decode step never all-gathers weights: each step's collectives are the tensor-parallel reductions only.

Legend: L layers, B batch, K kv heads, H head dim, C cache slots.
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh, NamedSharding

from opd_jax.errors import InputError
from opd_jax.models import sharding as shard_lib
from opd_jax.rollout.kv_cache import KVCache

PLACEMENTS = ("colocated", "disaggregated")

# Inference layout: heads / MLP width / vocabulary over tensor, the model width replicated.
SAMPLER_RULES = (
    (r"embed_tokens\.embedding$", ("tensor", None)),  # [V, D]
    (r"(q_proj|k_proj|v_proj|gate_proj|up_proj)\.kernel$", (None, "tensor")),  # [D, heads | F]
    (r"(o_proj|down_proj)\.kernel$", ("tensor", None)),  # [heads | F, D]
    (r"lm_head\.kernel$", (None, "tensor")),  # [D, V]
    (r"(q_proj|k_proj|v_proj|gate_proj|up_proj)\.bias$", ("tensor",)),
)


def split_devices(placement: str, rollout_devices: int, devices=None) -> tuple[list, list]:
  """(learner devices, sampler devices). Colocated: both are all devices; disaggregated: the sampler takes the
  first `rollout_devices`, the learner the rest."""
  devices = list(devices if devices is not None else jax.devices())
  if placement not in PLACEMENTS:
    raise InputError(f"rollout.placement must be one of {PLACEMENTS}, got {placement!r}")
  if placement == "colocated":
    return devices, devices
  if not 1 <= rollout_devices < len(devices):
    raise InputError(f"rollout.placement='disaggregated' needs 1 <= rollout.devices < {len(devices)} (the "
                     f"devices there are), got rollout.devices={rollout_devices}; the learner keeps the rest")
  return devices[rollout_devices:], devices[:rollout_devices]


def sampler_mesh(devices, tensor_parallel: int) -> Mesh:
  """The sampler's (data, fsdp=1, tensor) mesh over `devices`."""
  if tensor_parallel < 1 or len(devices) % tensor_parallel:
    raise InputError(f"rollout.tensor_parallel={tensor_parallel} must be >= 1 and divide the sampler's "
                     f"{len(devices)} devices")
  return shard_lib.make_mesh(-1, 1, tensor_parallel, devices=devices)


def state_shardings(state, mesh: Mesh):
  """Shardings of a sampler state (dense or quantized) on the inference layout."""
  return shard_lib.state_shardings(state, mesh, SAMPLER_RULES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return shard_lib.batch_sharding(mesh)


def constrain_cache(cache: KVCache, mesh: Mesh) -> KVCache:
  """Pins a KV cache to the inference layout inside a jitted decode loop: rows over data, KV heads over tensor
  (the same split as the k/v projections' output columns, so writes need no communication)."""
  rows = ("data", "fsdp")

  def pin(x, spec):
    if x is None:
      return None
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, shard_lib.fit_spec(spec, x.shape, mesh)))

  spec = (None, rows, "tensor", None, None)  # keys [L, B, K, H, C], values [L, B, K, C, H], their scales alike
  return cache.replace(k_LxBxKxHxC=pin(cache.k_LxBxKxHxC, spec), v_LxBxKxCxH=pin(cache.v_LxBxKxCxH, spec),
                       k_scale_LxBxKx1xC=pin(cache.k_scale_LxBxKx1xC, spec),
                       v_scale_LxBxKxCx1=pin(cache.v_scale_LxBxKxCx1, spec), valid_BxC=pin(cache.valid_BxC, (rows, None)))
