"""Gaussian weight noise with a fixed relative scale per tensor.

For every floating-point parameter W (matrices, norms and biases alike) of the sampler's state:
W' = W + sigma * ||W|| * z / ||z||, z ~ N(0, I) drawn from a key folded with the parameter's index, so
||W' - W|| / ||W|| = sigma exactly and the same (seed, sigma) always gives the same weights.

Order relative to the precision recipe (RolloutConfig.noise_order):
  "before_quant"  noise is added to the learner weights, then the recipe quantizes them (storage stays
                  quantized; quantization rounding can absorb part of very small noise);
  "after_quant"   the recipe quantizes first, then noise is added to the dequantized weights, which are
                  kept dense in the learner dtype (the sampler then holds no quantized storage).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from opd_jax.models import layer_stack


def add_relative_noise(state: nnx.State, sigma: float | jax.Array, key: jax.Array) -> nnx.State:
  """State with relative-norm Gaussian noise on every float parameter (quantized ones are dequantized).

  The index a tensor's key is folded with is its position in the per-layer view (opd_jax.models.layer_stack), so
  a stacked [L, ...] parameter gets, layer by layer, the draws and the norms per-layer storage gets."""
  indices = layer_stack.per_layer_indices(state)
  flat = []
  for path, variable in nnx.to_flat_state(state):
    value = variable.get_value()
    if isinstance(variable, nnx.Param):
      index = indices[tuple(path)]
      if layer_stack.is_per_layer(value):
        value = layer_stack.PerLayer(_noisy(v, sigma, key, i) for v, i in zip(value, index))
      elif isinstance(index, list):  # stacked: one draw and one norm per layer
        keys_L = jnp.stack([jax.random.fold_in(key, i) for i in index])
        value = jax.vmap(lambda v, k: _noisy(v, sigma, k, None))(_dense(value), keys_L)
      else:
        value = _noisy(value, sigma, key, index)
    flat.append((path, variable.replace(value)))
  return nnx.from_flat_state(flat)


def _dense(value):
  return value.dequant() if hasattr(value, "dequant") else value


def _noisy(value, sigma, key, index):
  """W + sigma * ||W|| * z / ||z|| for a float tensor (key folded with `index` unless None), else W."""
  value = _dense(value)
  if not jnp.issubdtype(value.dtype, jnp.floating):
    return value
  w32 = value.astype(jnp.float32)
  z = jax.random.normal(key if index is None else jax.random.fold_in(key, index), w32.shape, jnp.float32)
  scale = sigma * jnp.linalg.norm(w32) / jnp.maximum(jnp.linalg.norm(z), 1e-30)
  return (w32 + scale * z).astype(value.dtype)
