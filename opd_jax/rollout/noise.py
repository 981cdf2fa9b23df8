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


def add_relative_noise(state: nnx.State, sigma: float | jax.Array, key: jax.Array) -> nnx.State:
  """State with relative-norm Gaussian noise on every float parameter (quantized ones are dequantized)."""
  flat = []
  for index, (path, variable) in enumerate(nnx.to_flat_state(state)):
    value = variable.get_value()
    if hasattr(value, "dequant"):
      value = value.dequant()
    if isinstance(variable, nnx.Param) and jnp.issubdtype(value.dtype, jnp.floating):
      w32 = value.astype(jnp.float32)
      z = jax.random.normal(jax.random.fold_in(key, index), w32.shape, jnp.float32)
      scale = sigma * jnp.linalg.norm(w32) / jnp.maximum(jnp.linalg.norm(z), 1e-30)
      value = (w32 + scale * z).astype(value.dtype)
    flat.append((path, variable.replace(value)))
  return nnx.from_flat_state(flat)
