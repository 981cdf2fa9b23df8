"""Parameter shardings on a (data, fsdp, tensor) mesh, from regex rules over parameter paths.

A rule is (regex, spec): the first rule whose regex matches (`re.search`) the dotted parameter path
(`layers.3.mlp.up_proj.kernel`) gives the PartitionSpec as a tuple with one mesh axis name (or None) per
tensor dimension. A dimension that the named mesh axis does not divide evenly is replicated instead, so tiny
models run on any mesh. Stacked layer parameters ([L, ...], opd_jax.models.layer_stack) match the rules by their
per-layer path and keep the layer axis whole. Quantized weights (AQT QTensor: values + per-channel scales) follow their kernel's
spec on the values and on the scale's non-singleton dimension. Unmatched parameters are replicated.

The default rules put the model width over fsdp and heads / MLP width / vocab over tensor: Megatron-style
tensor parallelism (column-parallel q/k/v/gate/up, row-parallel o/down) plus ZeRO-3-style fsdp.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import re

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from opd_jax.errors import InputError
from opd_jax.models import layer_stack

MESH_AXES = ("data", "fsdp", "tensor")

DEFAULT_RULES = (
    (r"embed_tokens\.embedding$", ("tensor", "fsdp")),  # [V, D]
    (r"(q_proj|k_proj|v_proj|gate_proj|up_proj)\.kernel$", ("fsdp", "tensor")),  # [D, heads | F]
    (r"(o_proj|down_proj)\.kernel$", ("tensor", "fsdp")),  # [heads | F, D]
    (r"lm_head\.kernel$", ("fsdp", "tensor")),  # [D, V]
    (r"(q_proj|k_proj|v_proj|gate_proj|up_proj)\.bias$", ("tensor",)),
)


def mesh_shape(data: int, fsdp: int, tensor: int, device_count: int) -> tuple[int, int, int]:
  """Validated (data, fsdp, tensor) sizes; data = -1 takes the devices left after fsdp * tensor."""
  if fsdp < 1 or tensor < 1:
    raise InputError(f"mesh: fsdp and tensor must be >= 1, got fsdp={fsdp}, tensor={tensor}")
  if data == -1:
    if device_count % (fsdp * tensor):
      raise InputError(f"mesh: {device_count} devices are not divisible by fsdp*tensor={fsdp * tensor}")
    data = device_count // (fsdp * tensor)
  if data < 1 or data * fsdp * tensor != device_count:
    raise InputError(f"mesh: data*fsdp*tensor = {data}*{fsdp}*{tensor} != {device_count} devices; "
                     "set mesh.data=-1 to use the rest")
  return data, fsdp, tensor


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices=None) -> Mesh:
  """A (data, fsdp, tensor) mesh with automatic (GSPMD) axes."""
  devices = list(devices if devices is not None else jax.devices())
  shape = mesh_shape(data, fsdp, tensor, len(devices))
  auto = (jax.sharding.AxisType.Auto,) * 3
  return jax.make_mesh(shape, MESH_AXES, axis_types=auto, devices=devices)


def fit_spec(spec: tuple, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
  """`spec` padded to the rank of `shape`, each axis (a name or a tuple of names) dropped where its mesh size
  does not divide the dimension."""
  spec = tuple(spec)[:len(shape)] + (None,) * max(len(shape) - len(spec), 0)

  def ways(axis):
    return math.prod(mesh.shape[name] for name in (axis if isinstance(axis, tuple) else (axis,)))

  return PartitionSpec(*[axis if axis is not None and shape[i] % ways(axis) == 0 else None
                         for i, axis in enumerate(spec)])


def per_device_bytes(tree) -> int:
  """Bytes one device holds of a tree of (abstract) arrays: each leaf's shard under its sharding."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    sharding = getattr(leaf, "sharding", None)
    shape = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
    total += array_bytes(shape, leaf.dtype)
  return total


def array_bytes(shape, dtype) -> int:
  """Bytes an array of this shape and dtype occupies on an accelerator: 4-bit dtypes pack two per byte
  (numpy reports itemsize 1 for them; TPU and GPU store them packed)."""
  size = math.prod(shape)
  if jax.numpy.dtype(dtype).name in ("int4", "uint4", "float4_e2m1fn"):
    return (size + 1) // 2
  return size * jax.numpy.dtype(dtype).itemsize


def spec_for(path: str, shape: tuple[int, ...], mesh: Mesh, rules=DEFAULT_RULES) -> PartitionSpec:
  """The first matching rule's spec fitted to `shape`; a stacked layer parameter (`layers.mlp.up_proj.kernel`,
  [L, ...]) takes its rule on the per-layer dimensions and keeps the layer axis whole."""
  if layer_stack.stacked_path(path.split(".")):
    return PartitionSpec(None, *spec_for(layer_stack.dotted(layer_stack.layer_path(path.split("."), 0)),
                                         tuple(shape[1:]), mesh, rules))
  for regex, spec in rules:
    if re.search(regex, path):
      return fit_spec(spec, shape, mesh)
  return PartitionSpec()


def state_shardings(state, mesh: Mesh, rules=DEFAULT_RULES):
  """A pytree of NamedShardings matching `state` (an nnx.State, or any pytree of such states)."""

  def leaf_sharding(key_path, leaf):
    # Per-layer path parts; a stacked leaf ([L, ...]) takes its layer's spec behind a whole layer axis.
    parts, stacked = layer_stack.key_parts(key_path)
    shape = tuple(getattr(leaf, "shape", ()))
    layer_shape = shape[1:] if stacked else shape
    # Inside a QTensor: values follow the kernel; scales [1, out] / [V, 1] follow the non-singleton dim.
    if "qvalue" in parts or "scale" in parts:
      base = ".".join(parts[:parts.index("qvalue" if "qvalue" in parts else "scale")])
      spec = spec_for(base, layer_shape, mesh, rules)
      if "scale" in parts:
        spec = PartitionSpec(*[a if layer_shape[i] > 1 else None for i, a in enumerate(spec)])
    else:
      spec = spec_for(".".join(parts), layer_shape, mesh, rules)
    return NamedSharding(mesh, PartitionSpec(None, *spec) if stacked else spec)

  return jax.tree_util.tree_map_with_path(leaf_sharding, state)


def loader_shardings(mesh: Mesh, rules=DEFAULT_RULES):
  """The `sharding_for` argument of load_pretrained: each tensor goes straight to its shards."""
  return lambda path, shape: NamedSharding(mesh, spec_for(path, shape, mesh, rules))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension over data and fsdp (fsdp shards the batch too, as in ZeRO-3)."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


BATCH_AXES = ("data", "fsdp")
_ACTIVATION_MESH: contextvars.ContextVar[Mesh | None] = contextvars.ContextVar("activation_mesh", default=None)


@contextlib.contextmanager
def activations_on(mesh: Mesh | None):
  """While a learner-mesh program is traced inside this block, `constrain_batch` shards activations over the
  mesh's batch axes; outside it (or with mesh None) it changes nothing."""
  token = _ACTIVATION_MESH.set(mesh)
  try:
    yield
  finally:
    _ACTIVATION_MESH.reset(token)


def with_activations_on(mesh: Mesh | None, fn):
  """fn, traced with activations_on(mesh) (wrap a function before jax.jit)."""
  def traced(*args, **kwargs):
    with activations_on(mesh):
      return fn(*args, **kwargs)
  return traced


def constrain_batch(x: jax.Array, last_axis=None) -> jax.Array:
  """x [B, ..., last] with B over the batch axes (data, fsdp) and, when given, its last dimension over
  `last_axis` (each only where the mesh divides it), while traced under activations_on; else x unchanged.

  Why: with fsdp the LM head's kernel is sharded over the hidden width on the same devices that hold the batch;
  left alone, XLA may gather the batch instead of the kernel and hold a whole batch's chunk of logits
  [B, C, V] on every device. Pinning the logits to the batch sharding makes it gather the kernel (ZeRO-3)."""
  mesh = _ACTIVATION_MESH.get()
  if mesh is None:
    return x
  spec = fit_spec((BATCH_AXES,) + (None,) * (x.ndim - 2) + (last_axis,), x.shape, mesh)
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def shard_model_state(model_or_state, mesh: Mesh, rules=DEFAULT_RULES):
  state = model_or_state if isinstance(model_or_state, nnx.State) else nnx.state(model_or_state)
  return jax.device_put(state, state_shardings(state, mesh, rules))
