"""The one place every matmul against a weight goes through: Linear and Embed.

Legend: B batch, T time, D in-features, F out-features, V vocab.

A weight is either a plain array or a quantized tensor (values + scales, made by
`opd_jax.rollout.precision`). Quantized tensors carry their own `dequant()`; the matmul then runs
against the dequantized weight in the compute dtype (weight-only quantization, W8A16-style), so a
precision recipe changes numbers exactly where a real int8/fp8 rollout engine would.

Shardings are not annotated here but derived from parameter paths by the regex rules in
`opd_jax.models.sharding`, so one rule table covers learner, teacher, sampler and optimizer state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


DEQUANT_SCOPE = "dequantize_weight"  # the name a compiled program gives a weight's dequantization (tests find it)


def materialize(weight, dtype) -> jax.Array:
  """A weight as a dense array in `dtype`, dequantizing quantized storage."""
  if hasattr(weight, "dequant"):
    with jax.named_scope(DEQUANT_SCOPE):
      weight = weight.dequant()
  return weight.astype(dtype)


class Linear(nnx.Module):
  """y = x @ kernel (+ bias); kernel is [in, out] (HF stores the transpose); x is [..., in] (usually [B, T, in])."""

  def __init__(self, in_features: int, out_features: int, *, use_bias: bool, dtype, param_dtype,
               rngs: nnx.Rngs):
    scale = in_features ** -0.5
    self.kernel = nnx.Param(
        jax.random.normal(rngs.params(), (in_features, out_features), param_dtype) * scale)
    self.bias = nnx.Param(jnp.zeros((out_features,), param_dtype)) if use_bias else None
    self.dtype = dtype

  def __call__(self, x_BxTxD: jax.Array, out_dtype=None) -> jax.Array:
    """out_dtype: accumulate and return in this dtype (the LM head asks float32); default the compute dtype."""
    kernel_DxF = materialize(self.kernel.get_value(), self.dtype)
    y_BxTxF = jnp.einsum("...d,df->...f", x_BxTxD.astype(self.dtype), kernel_DxF, preferred_element_type=out_dtype)
    if self.bias is not None:
      y_BxTxF = y_BxTxF + self.bias.get_value().astype(y_BxTxF.dtype)[(None,) * (y_BxTxF.ndim - 1)]
    return y_BxTxF


class Embed(nnx.Module):
  """Token embedding table [V, D]; `attend` is the tied output head. scale (Gemma: sqrt(D)): looked-up rows are
  multiplied by it in the table's dtype, as HF does (so a bf16 table uses the bf16-rounded scale); the output
  head is not scaled."""

  def __init__(self, vocab_size: int, features: int, *, dtype, param_dtype, rngs: nnx.Rngs,
               scale: float | None = None):
    self.embedding = nnx.Param(jax.random.normal(rngs.params(), (vocab_size, features), param_dtype) * 0.02)
    self.dtype, self.scale = dtype, scale

  def __call__(self, tokens_BxT: jax.Array) -> jax.Array:
    table = self.embedding.get_value()
    if hasattr(table, "dequant"):  # quantized table (per-row scales): dequantize only the rows looked up
      with jax.named_scope(DEQUANT_SCOPE):
        rows_BxTxD = table[tokens_BxT].dequant()
    else:
      rows_BxTxD = jnp.take(table, tokens_BxT, axis=0)
    if self.scale is not None:
      rows_BxTxD = rows_BxTxD * jnp.asarray(self.scale, rows_BxTxD.dtype)
    return rows_BxTxD.astype(self.dtype)

  def attend(self, x_BxTxD: jax.Array, out_dtype=None) -> jax.Array:
    table_VxD = materialize(self.embedding.get_value(), self.dtype)
    return jnp.einsum("btd,vd->btv", x_BxTxD.astype(self.dtype), table_VxD, preferred_element_type=out_dtype)
