"""Preallocated KV cache, optionally quantized.

Legend: L layers, B batch, C slots allocated (capacity), S slots visible to attention (<= C), K kv heads,
H head dim, T tokens written at once.

Layout: one buffer for every layer's keys, [L, B, K, H, C], and one for values, [L, B, K, C, H]; per layer, keys
[B, K, H, S] and values [B, K, S, H] are read: per (batch, kv head) these are the right-hand operands of the two
attention matmuls (q @ keys, probs @ values) in the [contracted, free] form matmul kernels read in place. The token-major [B, S, K, H] layout made XLA transpose the whole cache of every layer
on every decode step, and on CPU decode attention was then 3x slower (`python launch/bench/sampler.py`).

kv_dtype:
  "native"    keys/values kept in the model's compute dtype (no mismatch; the default)
  "bf16"      rounded to bfloat16
  "int8"      symmetric int8, one float32 scale per (token, kv head): scale = max|x| / 127
  "fp8_e4m3"  float8_e4m3fn, one float32 scale per (token, kv head): scale = max|x| / 448
  "fp8_e5m2"  float8_e5m2 (2 mantissa bits: coarser, wider range), scale = max|x| / 57344
  "int4"      symmetric int4 (levels -7..7), one float32 scale per (token, kv head): scale = max|x| / 7;
              two values per byte (head dims h and h + H/2 share one), so the cache really is half of int8's
  "<int8 | fp8_e4m3 | fp8_e5m2 | int4>_bf16scale"  the same values with bfloat16 scales: the scale is rounded to
              bfloat16 before the values are quantized with it (values clipped to the grid's range), so what is
              stored is exactly what is read. A float32 scale per (token, head) costs 8 of fp8's 136 bytes per
              head-token at head_dim 64, which caps fp8 at 1.88x bf16's tokens; bfloat16 scales make it 1.94x.
Attention reads dequantized values (values * scale) in the compute dtype.

fp8 values are kept as their bit patterns in uint8 buffers (same bytes): XLA:CPU has no fp8 arithmetic
and widened every in-place update of a float8 buffer into a convert of the whole cache to f16 and back,
which made an fp8 cache 7x slower than a native one. Reads bitcast back to float8 and convert.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from opd_jax.errors import InputError

BF16_SCALE = "_bf16scale"  # suffix of a quantized kv dtype whose scales are stored in bfloat16
_QUANTIZED = ("int8", "int4", "fp8_e4m3", "fp8_e5m2")
KV_DTYPES = ("native", "bf16", *_QUANTIZED, *(q + BF16_SCALE for q in _QUANTIZED))
_base = lambda kv_dtype: kv_dtype.removesuffix(BF16_SCALE)  # the values' format


def _with_bf16scale(table: dict) -> dict:
  """A table keyed by value format -> the same entries for each quantized format's bfloat16-scale variant too."""
  return {**table, **{kv + BF16_SCALE: v for kv, v in table.items() if kv in _QUANTIZED}}


# buffer dtypes (fp8: bit patterns; int4: two 4-bit values per byte)
_STORAGE = _with_bf16scale({"bf16": jnp.bfloat16, "int8": jnp.int8, "int4": jnp.uint8, "fp8_e4m3": jnp.uint8,
                            "fp8_e5m2": jnp.uint8})
_QMAX = _with_bf16scale({"int8": 127.0, "int4": 7.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0})
_FP8 = _with_bf16scale({"fp8_e4m3": jnp.float8_e4m3fn, "fp8_e5m2": jnp.float8_e5m2})
_VALUE_BITS = _with_bf16scale({"bf16": 16, "int8": 8, "int4": 4, "fp8_e4m3": 8, "fp8_e5m2": 8})
_SCALE = {kv: jnp.bfloat16 if kv.endswith(BF16_SCALE) else jnp.float32 for kv in _QMAX}  # stored scale dtype


def check_kv_dtype(kv_dtype: str) -> str:
  aliases = {"fp8": "fp8_e4m3", "e5m2": "fp8_e5m2", "bfloat16": "bf16", "none": "native"}
  suffix = BF16_SCALE if kv_dtype.endswith(BF16_SCALE) else ""
  kv_dtype = aliases.get(_base(kv_dtype), _base(kv_dtype)) + suffix
  if kv_dtype not in KV_DTYPES:
    raise InputError(f"kv cache dtype {kv_dtype!r} is not one of {', '.join(KV_DTYPES)} (or fp8, e5m2, none; "
                     f"fp8{BF16_SCALE})")
  return kv_dtype


def _pack_int4(q_int: jax.Array) -> jax.Array:
  """[..., H] integers in -7..7 -> [..., H/2] uint8: dims h (low nibble) and h + H/2 (high nibble)."""
  half = q_int.shape[-1] // 2
  nibbles = q_int.astype(jnp.int32) & 0xF
  return (nibbles[..., :half] | (nibbles[..., half:] << 4)).astype(jnp.uint8)


def _unpack_int4(packed: jax.Array, axis: int) -> jax.Array:
  """Inverse of `_pack_int4` along `axis` of the stored layout -> int32 values, that axis doubled."""
  p = packed.astype(jnp.int32)
  signed = lambda n: n - 16 * (n >= 8)
  return jnp.concatenate([signed(p & 0xF), signed(p >> 4)], axis=axis)


def _quantize(x_BxTxKxH: jax.Array, kv_dtype: str):
  """(stored values, scale_BxTxKx1 or None)."""
  if kv_dtype not in _QMAX:
    return x_BxTxKxH.astype(_STORAGE.get(kv_dtype, x_BxTxKxH.dtype)), None
  x32 = x_BxTxKxH.astype(jnp.float32)
  qmax = _QMAX[kv_dtype]
  scale_BxTxKx1 = jnp.max(jnp.abs(x32), axis=-1, keepdims=True) / qmax
  # the stored scale (bfloat16 rounds it either way; the clip keeps the values on the grid)
  scale_BxTxKx1 = jnp.where(scale_BxTxKx1 > 0, scale_BxTxKx1, 1.0).astype(_SCALE[kv_dtype])
  scaled = jnp.clip(x32 / scale_BxTxKx1.astype(jnp.float32), -qmax, qmax)
  if _base(kv_dtype) == "int8":
    return jnp.round(scaled).astype(jnp.int8), scale_BxTxKx1
  if _base(kv_dtype) == "int4":
    return _pack_int4(jnp.round(scaled)), scale_BxTxKx1
  return jax.lax.bitcast_convert_type(scaled.astype(_FP8[kv_dtype]), jnp.uint8), scale_BxTxKx1


def _dequantize(values, scale, kv_dtype: str, dtype, head_axis: int = -1) -> jax.Array:
  """Stored values (and scales) -> what attention reads, in `dtype`; `head_axis` is the head-dim axis of the
  stored layout (int4 packs along it)."""
  if scale is None:
    return values.astype(dtype)
  if kv_dtype in _FP8:
    values = jax.lax.bitcast_convert_type(values, _FP8[kv_dtype])
  elif _base(kv_dtype) == "int4":
    values = _unpack_int4(values, head_axis)
  return (values.astype(jnp.float32) * scale).astype(dtype)


def quantize_dequantize(x_BxTxKxH: jax.Array, kv_dtype: str) -> jax.Array:
  """What attention reads back after storing `x` in `kv_dtype` (for tests and error measurements)."""
  kv_dtype = check_kv_dtype(kv_dtype)
  values, scale = _quantize(x_BxTxKxH, kv_dtype)
  return _dequantize(values, scale, kv_dtype, x_BxTxKxH.dtype, head_axis=-1)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
  """Every layer's keys and values in one stacked buffer each (layer l is index l of the leading axis), so a scan
  over the layers carries the cache and each layer writes its new tokens in place.

  The buffers hold C slots (capacity); attention reads only the first `slots` of them (static), so a decoder
  widens the visible window as the cache fills (`grow`: no copy while it fits) instead of reading every slot from
  the first step, and the cache is allocated once at its final size instead of being copied into a larger one.
  """
  k_LxBxKxHxC: jax.Array
  v_LxBxKxCxH: jax.Array
  k_scale_LxBxKx1xC: jax.Array | None
  v_scale_LxBxKxCx1: jax.Array | None
  valid_BxC: jax.Array  # slot holds a real (non-padding) token
  kv_dtype: str = dataclasses.field(metadata=dict(static=True))
  slots: int = dataclasses.field(metadata=dict(static=True))  # S: the visible slots, <= capacity

  def replace(self, **changes) -> "KVCache":
    return dataclasses.replace(self, **changes)

  @property
  def capacity(self) -> int:
    return self.valid_BxC.shape[1]

  @property
  def num_layers(self) -> int:
    return self.k_LxBxKxHxC.shape[0]

  @property
  def valid_BxS(self) -> jax.Array:
    return self.valid_BxC[:, :self.slots]

  def begin(self, valid_BxT: jax.Array, index) -> tuple["KVCache", jax.Array]:
    """Before a forward of T tokens at slots index .. index + T - 1 of every row: the cache with them marked
    (valid_BxT: which are real), and mask_BxTxS, the visible slots each may attend to (causal, real ones)."""
    cache = self.replace(valid_BxC=jax.lax.dynamic_update_slice(self.valid_BxC, valid_BxT, (0, index)))
    query_slots_T = index + jnp.arange(valid_BxT.shape[1])
    key_slots_S = jnp.arange(self.slots)
    return cache, (query_slots_T[None, :, None] >= key_slots_S[None, None, :]) & cache.valid_BxS[:, None, :]

  def query_slots_BxT(self, T: int, index) -> jax.Array:
    """The slot of each of T new tokens written at `index` (what a sliding window counts back from)."""
    return jnp.broadcast_to(index + jnp.arange(T, dtype=jnp.int32)[None], (self.valid_BxC.shape[0], T))

  def end(self) -> "KVCache":
    """After the forward (every layer written): nothing to do for a contiguous cache."""
    return self

  def write(self, layer, k_BxTxKxH, v_BxTxKxH, index) -> "KVCache":
    """Layer `layer` (int or traced) with T new keys / values at slots index .. index + T - 1 (< slots)."""
    k, k_scale = _quantize(k_BxTxKxH, self.kv_dtype)
    v, v_scale = _quantize(v_BxTxKxH, self.kv_dtype)
    # [B, T, K, h] -> keys [1, B, K, h, T] / values [1, B, K, T, h] at (layer, 0, 0, ., .)
    put_k = lambda buf, x: jax.lax.dynamic_update_slice(
        buf, x.transpose(0, 2, 3, 1)[None].astype(buf.dtype), (layer, 0, 0, 0, index))
    put_v = lambda buf, x: jax.lax.dynamic_update_slice(
        buf, x.transpose(0, 2, 1, 3)[None].astype(buf.dtype), (layer, 0, 0, index, 0))
    return self.replace(
        k_LxBxKxHxC=put_k(self.k_LxBxKxHxC, k), v_LxBxKxCxH=put_v(self.v_LxBxKxCxH, v),
        k_scale_LxBxKx1xC=None if k_scale is None else put_k(self.k_scale_LxBxKx1xC, k_scale),
        v_scale_LxBxKxCx1=None if v_scale is None else put_v(self.v_scale_LxBxKxCx1, v_scale))

  def read(self, layer, dtype):
    """Layer `layer`'s visible (k_BxKxHxS, v_BxKxSxH), dequantized to `dtype`."""
    S = self.slots
    keys = lambda x: None if x is None else x[layer][..., :S]
    values = lambda x: None if x is None else x[layer][:, :, :S]
    return (_dequantize(keys(self.k_LxBxKxHxC), keys(self.k_scale_LxBxKx1xC), self.kv_dtype, dtype, head_axis=2),
            _dequantize(values(self.v_LxBxKxCxH), values(self.v_scale_LxBxKxCx1), self.kv_dtype, dtype, head_axis=3))

  def grow(self, slots: int) -> "KVCache":
    """The same cache with `slots` visible slots, the new ones empty. Within the capacity this copies nothing;
    beyond it the buffers are padded to `slots` (values 0, scales 1, as `init` makes them; a copy)."""
    if slots < self.slots:
      raise InputError(f"cannot shrink a KV cache from {self.slots} to {slots} slots")
    return self.reserve(slots).replace(slots=slots)

  def reserve(self, capacity: int) -> "KVCache":
    """The same cache (same visible slots) in buffers of at least `capacity` slots: allocate once, then grow."""
    if capacity <= self.capacity:
      return self

    def pad(x, axis, fill):
      if x is None:
        return None
      widths = [(0, capacity - x.shape[axis]) if i == axis else (0, 0) for i in range(x.ndim)]
      return jnp.pad(x, widths, constant_values=fill)

    return self.replace(k_LxBxKxHxC=pad(self.k_LxBxKxHxC, 4, 0), v_LxBxKxCxH=pad(self.v_LxBxKxCxH, 3, 0),
                        k_scale_LxBxKx1xC=pad(self.k_scale_LxBxKx1xC, 4, 1),
                        v_scale_LxBxKxCx1=pad(self.v_scale_LxBxKxCx1, 3, 1), valid_BxC=pad(self.valid_BxC, 1, False))

  def repeat_rows(self, n: int) -> "KVCache":
    """Each row repeated n times in place (row g -> rows g*n .. g*n + n - 1): a prompt's cache for its group."""
    rep = lambda x, axis=1: None if x is None else jnp.repeat(x, n, axis=axis)
    return self.replace(k_LxBxKxHxC=rep(self.k_LxBxKxHxC), v_LxBxKxCxH=rep(self.v_LxBxKxCxH),
                        k_scale_LxBxKx1xC=rep(self.k_scale_LxBxKx1xC), v_scale_LxBxKxCx1=rep(self.v_scale_LxBxKxCx1),
                        valid_BxC=rep(self.valid_BxC, 0))

  @classmethod
  def init(cls, *, batch: int, slots: int, num_layers: int, num_kv_heads: int, head_dim: int,
           compute_dtype, kv_dtype: str = "native", capacity: int = 0) -> "KVCache":
    """An empty cache with `slots` visible slots in buffers of max(capacity, slots)."""
    kv_dtype = check_kv_dtype(kv_dtype)
    storage = _STORAGE.get(kv_dtype, compute_dtype)
    L, B, C, K, H = num_layers, batch, max(capacity, slots), num_kv_heads, head_dim
    if _base(kv_dtype) == "int4":
      if H % 2:
        raise InputError(f"kv cache int4 packs two head dims per byte and needs an even head_dim, got {H}")
      H //= 2
    scale = lambda shape: jnp.ones(shape, _SCALE[kv_dtype]) if kv_dtype in _QMAX else None  # per (token, head)
    return cls(jnp.zeros((L, B, K, H, C), storage), jnp.zeros((L, B, K, C, H), storage), scale((L, B, K, 1, C)),
               scale((L, B, K, C, 1)), jnp.zeros((B, C), bool), kv_dtype, slots)


def kv_bytes_per_token(*, num_layers: int, num_kv_heads: int, head_dim: int, kv_dtype: str,
                       native_bytes: int = 2) -> int:
  """Bytes one cached token costs across all layers (keys + values + per-(token, head) scales)."""
  kv_dtype = check_kv_dtype(kv_dtype)
  value_bits = 8 * native_bytes if kv_dtype == "native" else _VALUE_BITS[kv_dtype]
  scale_bytes = jnp.dtype(_SCALE[kv_dtype]).itemsize if kv_dtype in _QMAX else 0
  return 2 * num_layers * num_kv_heads * (head_dim * value_bits // 8 + scale_bytes)
