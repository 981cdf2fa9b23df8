"""Preallocated KV cache, optionally quantized.

Legend: B batch, S cache slots, K kv heads, H head dim, T tokens written at once.

kv_dtype:
  "native"    keys/values kept in the model's compute dtype (no mismatch; the default)
  "bf16"      rounded to bfloat16
  "int8"      symmetric int8, one float32 scale per (token, kv head): scale = max|x| / 127
  "fp8_e4m3"  float8_e4m3fn, one float32 scale per (token, kv head): scale = max|x| / 448
Attention reads dequantized values (values * scale) in the compute dtype.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

KV_DTYPES = ("native", "bf16", "int8", "fp8_e4m3")
_STORAGE = {"bf16": jnp.bfloat16, "int8": jnp.int8, "fp8_e4m3": jnp.float8_e4m3fn}
_QMAX = {"int8": 127.0, "fp8_e4m3": 448.0}


def check_kv_dtype(kv_dtype: str) -> str:
  aliases = {"fp8": "fp8_e4m3", "bfloat16": "bf16", "none": "native"}
  kv_dtype = aliases.get(kv_dtype, kv_dtype)
  if kv_dtype not in KV_DTYPES:
    raise ValueError(f"kv cache dtype {kv_dtype!r} is not one of {', '.join(KV_DTYPES)} (or fp8, none)")
  return kv_dtype


def _quantize(x_BxTxKxH: jax.Array, kv_dtype: str):
  """(stored values, scale_BxTxKx1 or None)."""
  if kv_dtype not in _QMAX:
    return x_BxTxKxH.astype(_STORAGE.get(kv_dtype, x_BxTxKxH.dtype)), None
  x32 = x_BxTxKxH.astype(jnp.float32)
  scale_BxTxKx1 = jnp.max(jnp.abs(x32), axis=-1, keepdims=True) / _QMAX[kv_dtype]
  scale_BxTxKx1 = jnp.where(scale_BxTxKx1 > 0, scale_BxTxKx1, 1.0)
  scaled = x32 / scale_BxTxKx1
  if kv_dtype == "int8":
    scaled = jnp.clip(jnp.round(scaled), -127, 127)
  return scaled.astype(_STORAGE[kv_dtype]), scale_BxTxKx1


def quantize_dequantize(x_BxTxKxH: jax.Array, kv_dtype: str) -> jax.Array:
  """What attention reads back after storing `x` in `kv_dtype` (for tests and error measurements)."""
  values, scale = _quantize(x_BxTxKxH, check_kv_dtype(kv_dtype))
  return values.astype(x_BxTxKxH.dtype) if scale is None else (values.astype(jnp.float32) * scale).astype(
      x_BxTxKxH.dtype)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LayerKV:
  k_BxSxKxH: jax.Array
  v_BxSxKxH: jax.Array
  k_scale_BxSxKx1: jax.Array | None
  v_scale_BxSxKx1: jax.Array | None
  kv_dtype: str = dataclasses.field(metadata=dict(static=True))

  def write(self, k_BxTxKxH, v_BxTxKxH, index) -> "LayerKV":
    k, k_scale = _quantize(k_BxTxKxH, self.kv_dtype)
    v, v_scale = _quantize(v_BxTxKxH, self.kv_dtype)
    put = lambda buf, x: jax.lax.dynamic_update_slice(buf, x.astype(buf.dtype), (0, index, 0, 0))
    return dataclasses.replace(
        self, k_BxSxKxH=put(self.k_BxSxKxH, k), v_BxSxKxH=put(self.v_BxSxKxH, v),
        k_scale_BxSxKx1=None if k_scale is None else put(self.k_scale_BxSxKx1, k_scale),
        v_scale_BxSxKx1=None if v_scale is None else put(self.v_scale_BxSxKx1, v_scale))

  def read(self, dtype):
    if self.k_scale_BxSxKx1 is None:
      return self.k_BxSxKxH.astype(dtype), self.v_BxSxKxH.astype(dtype)
    k = self.k_BxSxKxH.astype(jnp.float32) * self.k_scale_BxSxKx1
    v = self.v_BxSxKxH.astype(jnp.float32) * self.v_scale_BxSxKx1
    return k.astype(dtype), v.astype(dtype)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
  layers: list[LayerKV]
  valid_BxS: jax.Array  # slot holds a real (non-padding) token

  def replace(self, **changes) -> "KVCache":
    return dataclasses.replace(self, **changes)

  @classmethod
  def init(cls, *, batch: int, slots: int, num_layers: int, num_kv_heads: int, head_dim: int,
           compute_dtype, kv_dtype: str = "native") -> "KVCache":
    kv_dtype = check_kv_dtype(kv_dtype)
    storage = _STORAGE.get(kv_dtype, compute_dtype)
    shape = (batch, slots, num_kv_heads, head_dim)
    scaled = kv_dtype in _QMAX

    def layer():
      scale = lambda: jnp.ones(shape[:3] + (1,), jnp.float32) if scaled else None
      return LayerKV(jnp.zeros(shape, storage), jnp.zeros(shape, storage), scale(), scale(), kv_dtype)

    return cls(layers=[layer() for _ in range(num_layers)], valid_BxS=jnp.zeros((batch, slots), bool))


def kv_bytes_per_token(*, num_layers: int, num_kv_heads: int, head_dim: int, kv_dtype: str,
                       native_bytes: int = 2) -> int:
  """Bytes one cached token costs across all layers (keys + values + per-(token, head) scales)."""
  kv_dtype = check_kv_dtype(kv_dtype)
  value_bytes = {"native": native_bytes, "bf16": 2, "int8": 1, "fp8_e4m3": 1}[kv_dtype]
  scale_bytes = 4 if kv_dtype in _QMAX else 0
  return 2 * num_layers * num_kv_heads * (head_dim * value_bytes + scale_bytes)
