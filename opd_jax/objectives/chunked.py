"""Vocabulary work over sequence chunks: per-token quantities without a whole [B, R, V] tensor.

Legend: B batch, R response length, C chunk length (tokens), D model width, V vocab, K top-k.

`token_map(fn, arrays, chunk)` splits every [B, R, ...] array along R into chunks of C = max(1, chunk // B)
positions, i.e. about `chunk` tokens (rows x positions) each, and runs `fn` on each chunk inside a
`lax.scan`; `fn` maps a dict of [B, C, ...] arrays to a dict of [B, C, ...] outputs (per-token log-probs,
divergences, top-k). The body is wrapped in `jax.checkpoint`, so under a gradient the
scan keeps only each chunk's inputs (hidden states [B, C, D]) and recomputes the chunk's logits in the
backward pass: peak memory grows with chunk x V (B x C x V), not B x R x V, forward and backward, whatever
the batch, and no custom VJP is needed. Chunks cut the sequence, not the batch, so a batch-sharded array keeps
every device busy on every chunk. Gradients reach whatever `fn` closes over (the LM head) through the scan's constants.

chunk <= 0 or chunk >= B x R runs `fn` once on the whole sequence without checkpointing: the unchunked path
that the chunked one is tested against. R that C does not divide is padded with zeros (callers' masks are 0
there) and the padding is cut off the outputs.

This is the same idea as maxtext's vocabulary tiling, levanter's blockwise cross-entropy and tunix's chunked
log-probs, written here for OPD, where the teacher's head and top-k ride along in the same chunks.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from opd_jax.objectives.losses import divergence_exact
from opd_jax.objectives.spans import cover_delta


def token_map(fn: Callable[[dict], dict], arrays: dict, chunk: int) -> dict:
  """fn over sequence chunks of about `chunk` tokens of `arrays` (each [B, R, ...]); outputs concatenated
  back to [B, R, ...]."""
  B, R = next(iter(jax.tree.leaves(arrays))).shape[:2]
  chunk = max(1, chunk // B) if chunk > 0 else 0  # positions per chunk
  if chunk <= 0 or chunk >= R:
    return fn(arrays)
  n = -(-R // chunk)
  padded = n * chunk

  def split(x_BxRx):  # [B, R, ...] -> [n, B, C, ...]
    if padded != R:
      x_BxRx = jnp.pad(x_BxRx, [(0, 0), (0, padded - R)] + [(0, 0)] * (x_BxRx.ndim - 2))
    x_BxnxCx = x_BxRx.reshape(x_BxRx.shape[0], n, chunk, *x_BxRx.shape[2:])
    return jnp.moveaxis(x_BxnxCx, 1, 0)

  def merge(y_nxBxCx):  # [n, B, C, ...] -> [B, R, ...]
    y_BxnxCx = jnp.moveaxis(y_nxBxCx, 0, 1)
    return y_BxnxCx.reshape(y_BxnxCx.shape[0], padded, *y_BxnxCx.shape[3:])[:, :R]

  body = jax.checkpoint(fn)
  _, outputs = jax.lax.scan(lambda carry, xs: (carry, body(xs)), None, jax.tree.map(split, arrays))
  return jax.tree.map(merge, outputs)


def split_rows(tree, micro_batch_size: int):
  """[B, ...] leaves -> [n, M, ...]: micro-batch j holds rows j, n + j, 2n + j, ..., so each device's rows of a
  batch-sharded array spread evenly over the micro-batches."""
  def split(x):
    n = x.shape[0] // micro_batch_size
    return jnp.swapaxes(x.reshape(micro_batch_size, n, *x.shape[1:]), 0, 1)
  return jax.tree.map(split, tree)


def merge_rows(tree):
  """Inverse of split_rows: [n, M, ...] -> [B, ...]."""
  return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape(-1, *x.shape[2:]), tree)


def row_map(fn: Callable, arrays: tuple, micro_batch_size: int):
  """fn(*arrays) computed `micro_batch_size` rows at a time (a lax.map over split_rows), outputs merged back to
  [B, ...]; rows are independent, so only the peak memory changes. 0 or >= B: one call on the whole batch."""
  B = jax.tree.leaves(arrays)[0].shape[0]
  if not micro_batch_size or micro_batch_size >= B:
    return fn(*arrays)
  return merge_rows(jax.lax.map(lambda xs: fn(*xs), split_rows(arrays, micro_batch_size)))


def gather_logp(logp_BxCxV: jax.Array, tokens_BxC: jax.Array) -> jax.Array:
  """logp at the given tokens, [B, C]."""
  return jnp.take_along_axis(logp_BxCxV, tokens_BxC[..., None].astype(jnp.int32), axis=-1)[..., 0]


def tempered_log_softmax(logits_BxCxV: jax.Array, temperature: float) -> jax.Array:
  """log softmax(logits / temperature); temperature 0 (greedy sampling) scores the plain distribution."""
  if temperature not in (0.0, 1.0):
    logits_BxCxV = logits_BxCxV / temperature
  return jax.nn.log_softmax(logits_BxCxV, axis=-1)


def score_tokens(model, hidden_BxRxD: jax.Array, tokens_BxR: jax.Array, *, temperature: float, chunk: int,
                 top_k: int = 0, top_k_temperature: float = 1.0, cover: tuple | None = None) -> dict:
  """Per-token log-probs of `tokens` under `model`'s head applied to `hidden` chunk by chunk.

  Returns {"logp": [B, R]} and, with top_k > 0, {"top_logp": [B, R, K], "top_ids": [B, R, K]}: the K most
  likely tokens of log softmax(logits / top_k_temperature) (what the *_topk objectives need from a teacher).
  cover: (cover_BxRx2, rank_V) adds {"cover_delta": [B, R]} (opd_jax.objectives.spans.cover_delta, at the same
  temperature as "logp").
  """
  k = min(top_k, model.config.vocab_size)
  arrays = {"hidden": hidden_BxRxD, "tokens": tokens_BxR}
  if cover is not None:
    arrays["cover"] = cover[0]

  def per_chunk(x):
    logits_BxCxV = model.logits(x["hidden"])
    logp_BxCxV = tempered_log_softmax(logits_BxCxV, temperature)
    out = {"logp": gather_logp(logp_BxCxV, x["tokens"])}
    if k:
      out["top_logp"], out["top_ids"] = jax.lax.top_k(tempered_log_softmax(logits_BxCxV, top_k_temperature), k)
    if cover is not None:
      out["cover_delta"] = cover_delta(logp_BxCxV, x["tokens"], x["cover"], cover[1])
    return out

  return token_map(per_chunk, arrays, chunk)


def exact_reverse_kl(student, teacher, student_hidden_BxRxD, teacher_hidden_BxRxD, chunk: int) -> jax.Array:
  """KL(student || teacher) over the whole vocabulary at every position, [B, R] (temperature 1), from both
  models' final hidden states, chunk by chunk."""
  def per_chunk(x):
    return {"kl": divergence_exact(student.logits(x["student"]), teacher.logits(x["teacher"]), 1.0, 1.0)}

  return token_map(per_chunk, {"student": student_hidden_BxRxD, "teacher": teacher_hidden_BxRxD}, chunk)["kl"]
