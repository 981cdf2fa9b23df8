"""Sums over spans: the cross-tokenizer objectives compare a span's total log-probability on both sides.

Legend: B rows, N tokens of one side, R student response tokens.

`span_total(values_BxN, span_BxN, at_BxR)`: for each position of `at_BxR` (a span id in its row, or -1), the sum
of `values_BxN` over the tokens of that row whose span id is the same; 0 at -1. A scatter-add into zeros and a
gather: a span of one token returns that token's value exactly (0 + x is x), so with one tokenizer on both sides
the span objectives reduce to the token objectives bit for bit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def span_total(values_BxN: jax.Array, span_BxN: jax.Array, at_BxR: jax.Array) -> jax.Array:
  """[B, R]: per position of at_BxR, the total of values_BxN over its row's tokens of that span (module
  docstring). Span ids are < R (there are never more spans than student tokens)."""
  B, R = at_BxR.shape
  rows_Bx1 = jnp.arange(B, dtype=jnp.int32)[:, None] * R
  dump = B * R  # tokens of no span add here
  segment_BxN = jnp.where(span_BxN >= 0, rows_Bx1 + span_BxN, dump)
  totals = jax.ops.segment_sum(values_BxN.reshape(-1), segment_BxN.reshape(-1), num_segments=B * R + 1)
  picked_BxR = totals[jnp.where(at_BxR >= 0, rows_Bx1 + at_BxR, dump)]
  return jnp.where(at_BxR >= 0, picked_BxR, 0.0)


def span_starts(span_BxN: jax.Array) -> jax.Array:
  """float [B, N]: 1 at each token that starts a span (its span id differs from the previous token's), 0 at the
  others and at tokens of no span."""
  previous_BxN = jnp.pad(span_BxN[:, :-1], ((0, 0), (1, 0)), constant_values=-2)
  return ((span_BxN >= 0) & (span_BxN != previous_BxN)).astype(jnp.float32)


def cover_delta(logp_BxCxV: jax.Array, tokens_BxC: jax.Array, cover_BxCx2: jax.Array, rank_V: jax.Array
                ) -> jax.Array:
  """[B, C]: log C(t) - log p(t) at each position with a cover (lo >= 0), 0 elsewhere: C(t) the mass of the tokens
  whose vocabulary rank is in [lo, hi) (those whose text starts with the token's; opd_jax.crosstok.cover)."""
  lo_BxC, hi_BxC = cover_BxCx2[..., 0], cover_BxCx2[..., 1]
  rank_1x1xV = rank_V[None, None, :]
  inside_BxCxV = (rank_1x1xV >= lo_BxC[..., None]) & (rank_1x1xV < hi_BxC[..., None])
  cover_BxC = jax.nn.logsumexp(jnp.where(inside_BxCxV, logp_BxCxV, -jnp.inf), axis=-1)
  logp_BxC = jnp.take_along_axis(logp_BxCxV, tokens_BxC[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return jnp.where(lo_BxC >= 0, jnp.maximum(cover_BxC - logp_BxC, 0.0), 0.0)


def span_corrections(delta_BxN: jax.Array, cover_BxNx4: jax.Array, at_BxR: jax.Array) -> jax.Array:
  """[B, R]: per position of at_BxR (a span id or -1), its span's cover corrections: + the delta (cover_delta) of
  the token that ends it at an unsettled boundary, - the delta of the token that ends the span before it there
  (cover_BxNx4[..., 2] / [..., 3]: the span each token's delta adds to / is taken from, -1 for none)."""
  return (span_total(delta_BxN, cover_BxNx4[..., 2], at_BxR)
          - span_total(delta_BxN, cover_BxNx4[..., 3], at_BxR))
