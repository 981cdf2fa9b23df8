"""Per-layer attention kinds: what each layer's attention is given (RoPE tables and the key mask) when layers differ.

Legend: B batch, T time (queries), S key slots, H head dim, L layers.

Every family but Gemma 3 has one kind (full attention, one RoPE base), and its layers get one (cos, sin, mask)
triple, computed exactly as before kinds existed. Gemma 3 interleaves full-attention layers (rope_theta, the
causal mask) with sliding-window layers (rope_local_base_freq, and a key is visible only when it is fewer than
`sliding_window` slots behind the query: HF's `kv_idx > q_idx - sliding_window`). Both triples are computed once
per forward; a layer picks its own by its kind (a static choice in a Python loop, a select inside a scan over the
stacked layers, where one body serves both kinds).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from opd_jax.models.config import LAYER_KINDS, ModelConfig, rope_inv_freq

_SLIDING = LAYER_KINDS.index("sliding_attention")


def rope_tables(config: ModelConfig, positions_BxT: jax.Array, dtype, kind: int = 0) -> tuple[jax.Array, jax.Array]:
  """(cos_BxTxH, sin_BxTxH) of HF's rotate-half RoPE at `positions_BxT` for layers of kind `kind`."""
  freqs_BxTxH2 = positions_BxT[..., None].astype(jnp.float32) * jnp.asarray(
      rope_inv_freq(config, kind), jnp.float32)[None, None, :]
  emb_BxTxH = jnp.concatenate([freqs_BxTxH2, freqs_BxTxH2], axis=-1)
  return jnp.cos(emb_BxTxH).astype(dtype), jnp.sin(emb_BxTxH).astype(dtype)


def window_mask(mask_BxTxS: jax.Array, query_BxT: jax.Array, window: int) -> jax.Array:
  """`mask_BxTxS` restricted to keys fewer than `window` slots behind each query (key slot s is s)."""
  key_S = jnp.arange(mask_BxTxS.shape[-1], dtype=jnp.int32)
  return mask_BxTxS & (query_BxT[:, :, None].astype(jnp.int32) - key_S[None, None, :] < window)


def layer_inputs(config: ModelConfig, positions_BxT, mask_BxTxS, query_BxT, dtype):
  """(per-kind ((cos, sin, mask), ...), kind_L or None). One kind: a one-entry tuple and None. Several: one entry
  per LAYER_KINDS index and each layer's kind as an int32 [L] array. query_BxT: each query's slot (a thunk, only
  called when a sliding kind needs it)."""
  kinds_L = config.kinds_L
  if config.layer_types is None:
    return (rope_tables(config, positions_BxT, dtype) + (mask_BxTxS,),), None
  per_kind = []
  for kind in range(len(LAYER_KINDS)):
    mask = window_mask(mask_BxTxS, query_BxT(), config.sliding_window) if kind == _SLIDING else mask_BxTxS
    per_kind.append(rope_tables(config, positions_BxT, dtype, kind) + (mask,))
  return tuple(per_kind), jnp.asarray(kinds_L, jnp.int32)


def pick(per_kind: tuple, kind) -> tuple:
  """The (cos, sin, mask) of layer kind `kind`: an int (a Python loop) or a traced scalar (inside a scan)."""
  if len(per_kind) == 1:
    return per_kind[0]
  if isinstance(kind, int):
    return per_kind[kind]
  return jax.tree.map(lambda *values: jnp.where(kind == _SLIDING, values[_SLIDING], values[0]), *per_kind)
