"""Paged KV cache: per layer a pool of fixed-size pages at the KV recipe's precision, and per sequence a page table.

Legend: L layers, N pages in the pool, Z tokens per page, K kv heads, H head dim, B rows of this call, M pages a row
may hold (its page table's width), S = M * Z key slots a row's attention reads, T tokens a row writes at once.

Storage follows rollout.kv_cache (same precisions, same per-(token, head) scales, int4 packed two per byte, fp8 as
bit patterns): keys [L, N, K, H, Z] and values [L, N, K, Z, H], so a page gathers into the [B, K, H, S] /
[B, K, S, H] operands the attention matmuls read in place. Page 0 is the trash page: nothing real lives there, and
every write of a token that is not real (a padded prefill position, a finished or empty row) lands in it, so a
call's shape never depends on which rows are live.

A call sees the pools and, for its B rows, `page_table_BxM` (entries past a row's pages are 0) and `lengths_B`
(tokens the row already holds). `begin` marks which of the T new tokens are real: they take slots
lengths_B .. lengths_B + T - 1 (real tokens first in each row), each attends to the slots up to its own, and
`end` advances the lengths by the real tokens. Attention reads a row's pages through an XLA gather (CPU and GPU);
the host side (which pages a sequence owns) is rollout.engine's page allocator.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from opd_jax.errors import InputError
from opd_jax.rollout.kv_cache import _QMAX, _SCALE, _STORAGE, _base, _dequantize, _quantize, check_kv_dtype

TRASH_PAGE = 0  # page id of the trash page; real pages are 1 .. N - 1


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PagedKVCache:
  k_LxNxKxHxZ: jax.Array
  v_LxNxKxZxH: jax.Array
  k_scale_LxNxKx1xZ: jax.Array | None
  v_scale_LxNxKxZx1: jax.Array | None
  page_table_BxM: jax.Array  # int32 page ids of each row's slots [m * Z, (m + 1) * Z)
  lengths_B: jax.Array  # int32 tokens each row already holds
  new_BxT: jax.Array  # bool: which tokens of the current forward are real (set by `begin`)
  kv_dtype: str = dataclasses.field(metadata=dict(static=True))

  def replace(self, **changes) -> "PagedKVCache":
    return dataclasses.replace(self, **changes)

  @property
  def page_size(self) -> int:
    return self.k_LxNxKxHxZ.shape[-1]

  @property
  def num_pages(self) -> int:
    return self.k_LxNxKxHxZ.shape[1]

  @property
  def slots(self) -> int:
    return self.page_table_BxM.shape[1] * self.page_size

  def pools(self) -> tuple:
    return self.k_LxNxKxHxZ, self.v_LxNxKxZxH, self.k_scale_LxNxKx1xZ, self.v_scale_LxNxKxZx1

  def with_rows(self, page_table_BxM: jax.Array, lengths_B: jax.Array) -> "PagedKVCache":
    """The same pools seen by other rows (a call's own page tables and lengths)."""
    return self.replace(page_table_BxM=jnp.asarray(page_table_BxM, jnp.int32),
                        lengths_B=jnp.asarray(lengths_B, jnp.int32),
                        new_BxT=jnp.zeros((len(lengths_B), 0), bool))

  def begin(self, valid_BxT: jax.Array, index=None) -> tuple["PagedKVCache", jax.Array]:
    """Before a forward of T tokens per row (valid_BxT: the real ones, first in each row): the cache that will
    write them, and mask_BxTxS (token t of row b sees slots <= lengths_B[b] + t that hold real tokens). `index`
    is the contiguous cache's and is not used: each row continues at its own length."""
    del index
    T = valid_BxT.shape[1]
    query_BxT = self.lengths_B[:, None] + jnp.arange(T, dtype=jnp.int32)[None]
    total_B = self.lengths_B + jnp.sum(valid_BxT, axis=1, dtype=jnp.int32)
    key_S = jnp.arange(self.slots, dtype=jnp.int32)
    mask_BxTxS = (key_S[None, None, :] <= query_BxT[:, :, None]) & (key_S[None, None, :] < total_B[:, None, None])
    return self.replace(new_BxT=valid_BxT.astype(bool)), mask_BxTxS

  def query_slots_BxT(self, T: int, index=None) -> jax.Array:
    """The slot of each of T new tokens: its row's length onwards (what a sliding window counts back from)."""
    del index
    return self.lengths_B[:, None] + jnp.arange(T, dtype=jnp.int32)[None]

  def end(self) -> "PagedKVCache":
    return self.replace(lengths_B=self.lengths_B + jnp.sum(self.new_BxT, axis=1, dtype=jnp.int32))

  def _targets(self, T: int):
    """(page_BxT, offset_BxT) each new token is written to: its row's page for its slot, or the trash page."""
    slot_BxT = self.lengths_B[:, None] + jnp.arange(T, dtype=jnp.int32)[None]
    Z, M = self.page_size, self.page_table_BxM.shape[1]
    page_index_BxT = jnp.minimum(slot_BxT // Z, M - 1)
    page_BxT = jnp.take_along_axis(self.page_table_BxM, page_index_BxT, axis=1)
    real_BxT = self.new_BxT & (slot_BxT < self.slots)
    return jnp.where(real_BxT, page_BxT, TRASH_PAGE), jnp.where(real_BxT, slot_BxT % Z, 0)

  def write(self, layer, k_BxTxKxH, v_BxTxKxH, index=None) -> "PagedKVCache":
    """Layer `layer`'s keys / values of the new tokens into their pages (`index` unused, as in `begin`)."""
    del index
    page_BxT, offset_BxT = self._targets(k_BxTxKxH.shape[1])
    k, k_scale = _quantize(k_BxTxKxH, self.kv_dtype)  # [B, T, K, h], [B, T, K, 1]
    v, v_scale = _quantize(v_BxTxKxH, self.kv_dtype)
    # Advanced indices (layer, page, offset) around the two sliced axes: the updated block is [B, T, K, h].
    put_k = lambda pool, x: pool.at[layer, page_BxT, :, :, offset_BxT].set(x.astype(pool.dtype))
    put_v = lambda pool, x: pool.at[layer, page_BxT, :, offset_BxT, :].set(x.astype(pool.dtype))
    return self.replace(
        k_LxNxKxHxZ=put_k(self.k_LxNxKxHxZ, k), v_LxNxKxZxH=put_v(self.v_LxNxKxZxH, v),
        k_scale_LxNxKx1xZ=None if k_scale is None else put_k(self.k_scale_LxNxKx1xZ, k_scale),
        v_scale_LxNxKxZx1=None if v_scale is None else put_v(self.v_scale_LxNxKxZx1, v_scale))

  def read(self, layer, dtype):
    """Layer `layer`'s keys [B, K, H, S] and values [B, K, S, H] of every row's pages, dequantized to `dtype`."""
    B, M = self.page_table_BxM.shape
    S = M * self.page_size

    def keys(pool):  # [N, K, h, Z] -> rows' pages [B, M, K, h, Z] -> [B, K, h, M * Z]
      if pool is None:
        return None
      paged = pool[layer][self.page_table_BxM]
      return paged.transpose(0, 2, 3, 1, 4).reshape(B, paged.shape[2], paged.shape[3], S)

    def values(pool):  # [N, K, Z, h] -> [B, M, K, Z, h] -> [B, K, M * Z, h]
      if pool is None:
        return None
      paged = pool[layer][self.page_table_BxM]
      return paged.transpose(0, 2, 1, 3, 4).reshape(B, paged.shape[2], S, paged.shape[4])

    return (_dequantize(keys(self.k_LxNxKxHxZ), keys(self.k_scale_LxNxKx1xZ), self.kv_dtype, dtype, head_axis=2),
            _dequantize(values(self.v_LxNxKxZxH), values(self.v_scale_LxNxKxZx1), self.kv_dtype, dtype,
                        head_axis=3))

  @classmethod
  def init(cls, *, num_pages: int, page_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
           compute_dtype, kv_dtype: str = "native") -> "PagedKVCache":
    """Empty pools of `num_pages` pages (page 0 the trash page), seen by no row yet (`with_rows`)."""
    kv_dtype = check_kv_dtype(kv_dtype)
    if page_size < 1 or num_pages < 2:
      raise InputError(f"a paged KV cache needs page_size >= 1 and >= 2 pages (one is the trash page), got "
                       f"page_size={page_size}, num_pages={num_pages}")
    storage = _STORAGE.get(kv_dtype, compute_dtype)
    L, N, Z, K, H = num_layers, num_pages, page_size, num_kv_heads, head_dim
    if _base(kv_dtype) == "int4":
      if H % 2:
        raise InputError(f"kv cache int4 packs two head dims per byte and needs an even head_dim, got {H}")
      H //= 2
    scale = lambda shape: jnp.ones(shape, _SCALE[kv_dtype]) if kv_dtype in _QMAX else None
    return cls(jnp.zeros((L, N, K, H, Z), storage), jnp.zeros((L, N, K, Z, H), storage), scale((L, N, K, 1, Z)),
               scale((L, N, K, Z, 1)), jnp.zeros((0, 1), jnp.int32), jnp.zeros((0,), jnp.int32),
               jnp.zeros((0, 0), bool), kv_dtype)


def pool_bytes(cache: PagedKVCache) -> int:
  """Bytes the pools hold (keys, values and scales of every page, the trash page included)."""
  return sum(x.size * x.dtype.itemsize for x in cache.pools() if x is not None)
