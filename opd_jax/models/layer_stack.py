"""Stacked layer storage: each decoder-layer parameter kept as one [L, ...] array, and the per-layer view.

Legend: L decoder layers.

A Decoder built with `scan_layers=True` stores its L layers (alike by construction: one graph, one shape per
parameter) as one DecoderLayer module whose every parameter has a leading layer axis:
`layers.self_attn.q_proj.kernel` is [L, D, N*H], `layers.input_layernorm.weight` is [L, D]. The scan consumes
the stack as stored, so no forward copies or stacks the layer weights, and the gradient comes back [L, ...].
With `scan_layers=False` each layer is its own module (`layers.3.self_attn.q_proj.kernel`), run in a loop.

The per-layer view names layer l's slice of a stacked parameter as per-layer storage names it
(`layers.3.self_attn.q_proj.kernel`), in the order per-layer storage lists its parameters. The edges that talk
about single layers work in that view whatever the storage: HF import and export, precision recipes and their
regexes, noise (one draw per layer tensor, keyed by its index in the view), sensitivity scans and pruning.

A stacked state may hold `PerLayer` values instead of [L, ...] arrays: L separate values of one parameter
(arrays or quantized tensors, possibly of different precisions). A precision recipe that treats layers
differently makes them (rollout.precision: 7 layers in bf16 and the rest fp8 cannot share one array); the
Decoder then runs its layers one by one. One graph definition serves both.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from flax import nnx

LAYERS = "layers"  # the Decoder attribute that holds the layers (stacked module or list)


def layer_key(layer: int) -> jax.tree_util.GetAttrKey:
  """The key path entry of layer `layer`'s value inside a PerLayer: `layer_3` (a key type orbax can name)."""
  return jax.tree_util.GetAttrKey(f"layer_{layer}")


def _layer_of(key) -> int | None:
  """The layer a key path entry names, if it is a PerLayer's entry."""
  name = getattr(key, "name", None)
  return int(name[6:]) if isinstance(key, jax.tree_util.GetAttrKey) and re.fullmatch(r"layer_\d+", name) else None


@jax.tree_util.register_pytree_with_keys_class
class PerLayer:
  """L values of one stacked parameter, one per layer, kept apart (see the module docstring)."""

  def __init__(self, values):
    self.values = tuple(values)

  def __getitem__(self, layer: int):
    return self.values[layer]

  def __len__(self) -> int:
    return len(self.values)

  def __repr__(self) -> str:
    return f"PerLayer({len(self.values)} layers)"

  def tree_flatten_with_keys(self):
    return [(layer_key(i), v) for i, v in enumerate(self.values)], None

  def tree_flatten(self):
    return self.values, None

  @classmethod
  def tree_unflatten(cls, _, values):
    return cls(values)


def is_per_layer(value) -> bool:
  return isinstance(value, PerLayer)


def stacked_path(path: tuple) -> bool:
  """Whether a flat-state path (of a model state, or of a tree that holds one, e.g. a TrainState) names a stacked
  layer parameter: `layers` followed by a module name rather than a layer index."""
  parts = tuple(path)
  if LAYERS not in parts:
    return False
  i = parts.index(LAYERS)
  return i + 1 < len(parts) and not isinstance(parts[i + 1], int) and not str(parts[i + 1]).isdigit()


def layer_path(path: tuple, layer: int) -> tuple:
  """The per-layer path of layer `layer`'s slice of a stacked parameter path."""
  i = tuple(path).index(LAYERS)
  return (*path[:i + 1], layer, *path[i + 1:])


def layer_count(value) -> int:
  """L of a stacked value: a PerLayer's length, else the leading axis of its (first) array."""
  if is_per_layer(value):
    return len(value)
  return jax.tree.leaves(value)[0].shape[0]


def take_layer(value, layer):
  """Layer `layer` (an int, or a traced index) of a stacked value: a PerLayer's own value, else every array of
  the value (an array, or a quantized tensor's values and scales) indexed on its leading axis (an abstract one:
  its shape without that axis)."""
  if is_per_layer(value):
    return value[layer]
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype) if isinstance(a, jax.ShapeDtypeStruct)
                      else a[layer], value)


def stack_values(values):
  """L values of one parameter -> one stacked value ([L, ...] arrays, quantized tensors stacked field-wise)."""
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *values)


def per_layer_flat(state) -> list[tuple[tuple, object]]:
  """[(per-layer path, value)] of a model state in per-layer storage's order (sorted paths, layer indices as
  numbers), stacked parameters split into their layers; `value` is the Variable's value (a layer's slice of a
  stacked array is taken here: an eager copy outside jit, a slice inside)."""
  return [(path, value if layer is None else take_layer(value, layer)) for path, _, value, layer in entries(state)]


def entries(state) -> list[tuple[tuple, tuple, object, int | None]]:
  """[(per-layer path, stored path, stored value, layer or None)] in per-layer order; for a stacked parameter
  `stored value` is the whole stacked value (take `layer` of it), else the value itself. Nothing is sliced."""
  out = []
  for path, variable in nnx.to_flat_state(state):
    path, value = tuple(path), variable.get_value()
    if stacked_path(path):
      out += [(layer_path(path, layer), path, value, layer) for layer in range(layer_count(value))]
    else:
      out.append((path, path, value, None))
  return sorted(out, key=lambda entry: entry[0])


def dotted(path: tuple) -> str:
  return ".".join(map(str, path))


def paths(state) -> list[str]:
  """Dotted per-layer paths of a model state, whatever its storage (`layers.3.self_attn.q_proj.kernel`)."""
  return [dotted(path) for path, _, _, _ in entries(state)]


def get(state, path: str):
  """The value at a per-layer dotted path (`layers.3.mlp.up_proj.kernel`) of a state in either storage."""
  for entry_path, _, value, layer in entries(state):
    if dotted(entry_path) == path:
      return value if layer is None else take_layer(value, layer)
  raise KeyError(f"{path!r} is no parameter of this state; paths look like {paths(state)[:3]}")


def per_layer_indices(state) -> dict[tuple, list[int] | int]:
  """Stored flat path -> its position(s) in the per-layer view: one index, or L indices (by layer) for a stacked
  parameter; what keys per-tensor random draws, so that either storage draws the same noise."""
  out: dict[tuple, list[int] | int] = {}
  for index, (_, stored, _, layer) in enumerate(entries(state)):
    if layer is None:
      out[stored] = index
    else:
      out.setdefault(stored, []).append(index)
  return out


def key_parts(key_path) -> tuple[list[str], bool]:
  """(per-layer path parts, stacked) of a jax key path into a tree holding model states (a state, a TrainState,
  optimizer moments): Variable 'value' entries dropped and the layer index placed behind `layers`, as per-layer
  storage names it. `stacked`: the leaf carries a leading layer axis (a stacked array, or a stacked quantized
  tensor's values and scales); its parts then name layer 0, whose rules (sharding) every layer shares."""
  parts, layer = [], None
  for k in key_path:
    if _layer_of(k) is not None:
      layer = _layer_of(k)
      continue
    part = k.key if hasattr(k, "key") else k.name if hasattr(k, "name") else k.idx
    if part in ("value", "raw_value"):
      continue
    parts.append(str(part))
  stacked = stacked_path(parts) and layer is None
  if stacked or layer is not None:
    parts = list(layer_path(parts, str(0 if stacked else layer)))
  return parts, stacked


def unstack(state):
  """A stacked state with every stacked value split into a PerLayer (the storage a mixed recipe needs)."""
  flat = []
  for path, variable in nnx.to_flat_state(state):
    value = variable.get_value()
    if stacked_path(path) and not is_per_layer(value):
      value = PerLayer(take_layer(value, layer) for layer in range(layer_count(value)))
    flat.append((path, variable.replace(value)))
  return nnx.from_flat_state(flat)


def stack_modules(layers: list[nnx.Module]) -> nnx.Module:
  """One module whose parameters are the given alike modules' parameters stacked on a leading axis."""
  graphdef, _ = nnx.split(layers[0])
  states = [nnx.split(layer)[1] for layer in layers]
  return nnx.merge(graphdef, stack_values(states))


def layer_states(state) -> tuple[str, object]:
  """How a stacked layers state runs: ("scan", state) when every value is a stacked array (or quantized tensor),
  else ("loop", [state of layer 0, ..., layer L-1])."""
  values = jax.tree.leaves(state, is_leaf=is_per_layer)
  if not any(is_per_layer(v) for v in values):
    return "scan", state
  count = layer_count(next(v for v in values if is_per_layer(v)))
  pick = lambda layer: jax.tree.map(lambda v: take_layer(v, layer), state, is_leaf=is_per_layer)
  return "loop", [pick(layer) for layer in range(count)]
