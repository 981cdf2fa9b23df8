"""Weight precision recipes: ordered (regex -> precision) rules applied with AQT to the sampler's weights.

A parameter's path is its dotted name in the model state, e.g. `layers.3.self_attn.q_proj.kernel`,
`layers.0.mlp.down_proj.bias`, `embed_tokens.embedding`, `lm_head.kernel`, `norm.weight`. Rules are tried
in order and the first whose regex matches (`re.search`) decides; unmatched parameters keep the learner's
precision. Paths are per-layer names whatever the layer storage: a stacked [L, ...] parameter
(opd_jax.models.layer_stack) is matched layer by layer, and stays one stacked tensor when all its layers get one
precision. Precisions:

  none       learner precision, untouched
  bf16       rounded to bfloat16 and stored as bfloat16
  int8       AQT symmetric int8 (abs-max calibration), stored int8 + float32 scales
  int4       AQT symmetric int4 (levels -7..7), stored int4 (two per byte on TPU / GPU) + float32 scales
  int3       AQT symmetric 3-bit (levels -3..3, the GPTQ / llama.cpp Q3 grid), stored in the int4 container,
             so it costs int4's bytes here (a 3-bit packing engine would store 3/8 of a byte)
  int2       AQT symmetric 2-bit (levels -1..1, ternary), stored in the int4 container like int3
  fp8_e4m3   AQT float8_e4m3fn, stored fp8 + float32 scales (max |q| = 448)
  fp8_e5m2   AQT float8_e5m2, stored fp8 + float32 scales
  fp8_e4m3_tensor  float8_e4m3fn with ONE scale per tensor (the per-tensor recipe of early fp8 engines)

Granularity of scales: one per output channel of every Linear kernel ([in, out] -> scales [1, out]) and one
per row (token) of the embedding table ([V, D] -> scales [V, 1]), except the `_tensor` precisions (one scale
for the whole matrix, so one outlier channel coarsens every other). int4 is per channel, not grouped: with
these pairs' widths (64-256 input features) a 128-group recipe (AWQ / GPTQ style) would be nearly the same
thing, and per channel is the harsher, cheaper end. Quantized precisions apply to matrices only; a vector
(norm weight, bias) that such a rule matches keeps learner precision. The quantized tensors are
`aqt.jax.v2.aqt_tensor.QTensor`s kept in the model state, so the memory saving is real (see `state_bytes`),
and each Linear dequantizes its weight right before its matmul (weight-only quantization).

Shorthands for a whole model: `none`, `bf16` (every parameter), `int8` / `int4` / `int3` / `int2` / `fp8` /
`fp8_e5m2` / `fp8_tensor` (every decoder Linear kernel; embeddings, lm_head, norms and biases untouched, as in
common int8/fp8 serving recipes). With `embedding=True` the int8/fp8 shorthands also store the input embedding
table at that precision (per-row scales; a lookup, so only the looked-up rows are dequantized). With tied
embeddings that table is the LM head too. At Qwen3-8B shapes this takes fp8 sampler weights from 0.58x to 0.54x of
bf16 (docs/rollout_engine.md).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from aqt.jax.v2 import aqt_quantizer
from aqt.jax.v2.aqt_tensor import QTensor
from flax import nnx

from opd_jax.errors import InputError
from opd_jax.models import layer_stack
from opd_jax.models.linear import DEQUANT_SCOPE
from opd_jax.models.sharding import array_bytes

PRECISIONS = ("none", "bf16", "int8", "int4", "int3", "int2", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3_tensor")
_ALIASES = {"fp8": "fp8_e4m3", "e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2", "bfloat16": "bf16",
            "fp8_tensor": "fp8_e4m3_tensor"}
_AQT_BITS = {"int8": 8, "int4": 4, "int3": 3, "int2": 2, "fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2",
             "fp8_e4m3_tensor": "e4m3"}
_STORAGE = {"int8": jnp.int8, "int4": jnp.int4, "int3": jnp.int4, "int2": jnp.int4, "fp8_e4m3": jnp.float8_e4m3fn,
            "fp8_e5m2": jnp.float8_e5m2, "fp8_e4m3_tensor": jnp.float8_e4m3fn}
QUANTIZED = tuple(_AQT_BITS)  # precisions stored as values + scales (matrices only)
PER_TENSOR = ("fp8_e4m3_tensor",)
NIBBLE = ("int4", "int3", "int2")  # stored in the 4-bit container, two per byte
_EMBEDDING = r"^embed_tokens\.embedding$"
_DECODER_LINEARS = r"^layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)\.kernel$"

Rules = tuple[tuple[str, str], ...]


def canonical_precision(name: str) -> str:
  name = _ALIASES.get(name, name)
  if name not in PRECISIONS:
    raise InputError(f"weight precision {name!r} is not one of {', '.join(PRECISIONS)} (or fp8, fp8_tensor)")
  return name


def recipe_rules(weights: str | None = "none", rules=(), embedding: bool = False) -> Rules:
  """Explicit `rules` ((regex, precision) pairs) win; otherwise the shorthand `weights` expands to rules
  (with `embedding`, int8/fp8 shorthands cover the embedding table too)."""
  if rules:
    out = []
    for rule in rules:
      if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and all(isinstance(x, str) for x in rule)):
        raise InputError(f"weight rule {rule!r} must be a (regex, precision) pair of strings")
      try:
        re.compile(rule[0])
      except re.error as e:
        raise InputError(f"weight rule regex {rule[0]!r} is invalid: {e}") from None
      out.append((rule[0], canonical_precision(rule[1])))
    return tuple(out)
  weights = canonical_precision(weights or "none")
  if weights == "none":
    return ()
  if weights == "bf16":
    return ((".*", "bf16"),)
  return ((_DECODER_LINEARS, weights),) + (((_EMBEDDING, weights),) if embedding else ())


def param_paths(state: nnx.State) -> list[str]:
  """Per-layer dotted paths (`layers.3.self_attn.q_proj.kernel`), whatever the layer storage."""
  return layer_stack.paths(state)


def validate_rules(rules: Rules, state: nnx.State) -> None:
  """Every rule must match at least one parameter path; the error lists a few real paths to help."""
  paths = param_paths(state)
  for regex, precision in rules:
    if not any(re.search(regex, p) for p in paths):
      examples = ", ".join(paths[:3] + paths[-2:])
      raise InputError(f"weight rule ({regex!r} -> {precision}) matches no parameter of this model; "
                       f"paths look like: {examples}")


def precision_for(path: str, rules: Rules) -> str:
  for regex, precision in rules:
    if re.search(regex, path):
      return precision
  return "none"


def quantize_tensor(value: jax.Array, precision: str, path: str, stacked: bool = False):
  """One tensor under one precision: an array (none / bf16, or a vector) or an AQT QTensor. stacked: `value` is
  [L, ...], one layer per leading index, quantized per layer exactly as each layer alone would be."""
  lead = 1 if stacked else 0
  if precision == "none" or (precision in _AQT_BITS and value.ndim - lead != 2):
    return value
  if precision == "bf16":
    return value.astype(jnp.bfloat16)
  # Scales per output channel: kernels [in, out] calibrate over axis 0, the embedding [V, D] over axis 1.
  calibration_axes = [1] if path.endswith("embedding") else [0]
  if precision in PER_TENSOR:
    calibration_axes = [0, 1]
  quantizer = aqt_quantizer.quantizer_make(_AQT_BITS[precision])
  qtensor, _ = quantizer.quant(value.astype(jnp.float32), calibration_axes=[a + lead for a in calibration_axes])
  qtensor = qtensor.qvalue_astype(_STORAGE[precision])
  return qtensor.replace(dequant_dtype=value.dtype)


def apply_recipe(state: nnx.State, rules: Rules) -> nnx.State:
  """A copy of a model state with each parameter stored at the precision its rule names. Jittable.

  Rules match per-layer paths. A stacked layer parameter whose layers all get one precision stays stacked (one
  [L, ...] quantized tensor, scales per layer); if any parameter's layers differ, every stacked parameter is
  split into PerLayer values (opd_jax.models.layer_stack), since layers of several precisions share no array."""
  chosen, per_stacked = {}, {}
  for path, stored, _, layer in layer_stack.entries(state):
    chosen[(stored, layer)] = precision_for(layer_stack.dotted(path), rules)
    if layer is not None:
      per_stacked.setdefault(stored, set()).add(chosen[(stored, layer)])
  mixed = any(len(precisions) > 1 for precisions in per_stacked.values())
  flat = []
  for path, variable in nnx.to_flat_state(state):
    path, value = tuple(path), variable.get_value()
    if isinstance(variable, nnx.Param) and (isinstance(value, jax.Array) or layer_stack.is_per_layer(value)):
      if not layer_stack.stacked_path(path):
        value = quantize_tensor(value, chosen[(path, None)], layer_stack.dotted(path))
      elif mixed or layer_stack.is_per_layer(value):
        value = layer_stack.PerLayer(
            quantize_tensor(layer_stack.take_layer(value, layer), chosen[(path, layer)],
                            layer_stack.dotted(layer_stack.layer_path(path, layer)))
            for layer in range(layer_stack.layer_count(value)))
      else:
        value = quantize_tensor(value, chosen[(path, 0)], layer_stack.dotted(layer_stack.layer_path(path, 0)), True)
    flat.append((path, variable.replace(value)))
  return nnx.from_flat_state(flat)


def dequantized(state: nnx.State) -> nnx.State:
  """Dense copy of a (possibly quantized) state in each tensor's original dtype."""
  def dequant(v):
    if not isinstance(v, QTensor):
      return v
    with jax.named_scope(DEQUANT_SCOPE):
      return v.dequant()
  flat = []
  for path, variable in nnx.to_flat_state(state):
    value = variable.get_value()
    value = (layer_stack.PerLayer(map(dequant, value)) if layer_stack.is_per_layer(value) else dequant(value))
    flat.append((path, variable.replace(value)))
  return nnx.from_flat_state(flat)


def state_bytes(state) -> int:
  """Bytes actually held by a state's arrays (quantized values + scales count as stored; int4 packed)."""
  return sum(array_bytes(leaf.shape, leaf.dtype) for leaf in jax.tree.leaves(state) if hasattr(leaf, "dtype"))
