"""The cross-tokenizer full-distribution objective's divergence: next-character marginals (objective reverse_kl
with a teacher of another tokenizer; opd_jax.crosstok.projection builds the events).

Legend: B rows, R positions, Vs / Vt the student's / teacher's vocabulary, E common events, L character offsets.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NO_EVENT, ENDS_HERE = -1, -2  # opd_jax.crosstok.projection's event tables (a token in no event; a text ending here)


def marginals(student_logits_BxRxVs, teacher_logits_BxRxVt, events, temperature: float, after_prefix_BxR=None,
              corrected=None) -> tuple[jax.Array, jax.Array]:
  """(q_S, q_T), [B, R, E] each: both distributions (at `temperature`) marginalized onto common events by
  `events` = (student token -> event [Vs], teacher token -> event [Vt], number of events E[, teacher token ->
  event after the response prefix [Vt] or None[, corrected boundaries' tables (below)]]), -1 for a
  token in none, each side renormalized over its tokens in some event (opd_jax.crosstok.projection). Where
  after_prefix_BxR > 0 the teacher's side uses the fourth table (its token there merged the response prefix).
  corrected: (student_prev_logits_BxRxVs, teacher_prev_logits_BxRxVt, marginal_cover_BxRx6, student rank_Vs)
  with corrected boundaries, events then ending in (student offsets [L, Vs], teacher offsets [L, Vt], teacher
  rank_Vt): where marginal_cover_BxRx6 names the covers of both sides' last tokens, each side's distribution is
  the character-level one after the text (`character_level`)."""
  student_events_Vs, teacher_events_Vt, E = events[:3]
  shifted_Vt = events[3] if len(events) > 3 else None

  def marginal(logits_BxRxV, events_V):
    p_BxRxV = jax.nn.softmax(logits_BxRxV / temperature, axis=-1)
    q_BxRxE = jnp.zeros(p_BxRxV.shape[:-1] + (E,), p_BxRxV.dtype).at[..., jnp.maximum(events_V, 0)].add(
        jnp.where(events_V >= 0, p_BxRxV, 0.0))
    return q_BxRxE / jnp.maximum(jnp.sum(q_BxRxE, axis=-1, keepdims=True), 1e-30)

  q_s, q_t = marginal(student_logits_BxRxVs, student_events_Vs), marginal(teacher_logits_BxRxVt, teacher_events_Vt)
  if shifted_Vt is not None and after_prefix_BxR is not None:
    q_t = jnp.where(after_prefix_BxR[..., None] > 0, marginal(teacher_logits_BxRxVt, shifted_Vt), q_t)
  if corrected is not None:
    student_prev, teacher_prev, cover_BxRx6, rank_Vs = corrected
    offsets_LxVs, offsets_LxVt, rank_Vt = events[4]
    q_s = character_level(q_s, student_prev / temperature, cover_BxRx6[..., :3], rank_Vs, offsets_LxVs)
    q_t = character_level(q_t, teacher_prev / temperature, cover_BxRx6[..., 3:], rank_Vt, offsets_LxVt)
  return q_s, q_t


def marginal_kl(q_s_BxRxE, q_t_BxRxE) -> jax.Array:
  """KL(q_S || q_T) per position, [B, R]."""
  log_ratio = jnp.log(jnp.maximum(q_s_BxRxE, 1e-30)) - jnp.log(jnp.maximum(q_t_BxRxE, 1e-30))
  return jnp.sum(jnp.where(q_s_BxRxE > 0, q_s_BxRxE * log_ratio, 0.0), axis=-1)


def divergence_marginalized(student_logits_BxRxVs, teacher_logits_BxRxVt, events, temperature: float,
                            after_prefix_BxR=None, corrected=None) -> jax.Array:
  """KL(q_S || q_T) per position, [B, R], of `marginals` (same arguments)."""
  return marginal_kl(*marginals(student_logits_BxRxVs, teacher_logits_BxRxVt, events, temperature,
                                after_prefix_BxR, corrected))


def first_character_logq(q_s_BxRxE, q_t_BxRxE, student_events_Vs, tokens_BxR) -> tuple[jax.Array, jax.Array]:
  """(log q_S(c), log q_T(c)), [B, R] each: both sides' log-probability of the sampled student token's event c
  (its first character, or the end); 0 and 0 where the token is in no event (a partial UTF-8 byte).
  objective.marginal_span="chain" scores the rest of a span given its first character with them."""
  event_BxR = student_events_Vs[tokens_BxR]
  pick = lambda q: jnp.take_along_axis(q, jnp.maximum(event_BxR, 0)[..., None], axis=-1)[..., 0]
  log_of = lambda q: jnp.where(event_BxR >= 0, jnp.log(jnp.maximum(pick(q), 1e-30)), 0.0)
  return log_of(q_s_BxRxE), log_of(q_t_BxRxE)


def character_level(q_BxRxE, prev_logits_BxRxV, cover_BxRx3, rank_V, offsets_LxV) -> jax.Array:
  """[B, R, E]: at each position whose cover_BxRx3 = (lo, hi, L) names the last token t before it (lo >= 0), the
  next-character distribution after the text rather than after the token, one token back
  (opd_jax.crosstok.projection): [p(tokens spelling exactly t's L characters) q + p(longer tokens of t's cover,
  by their character at offset L)] / its total, p from prev_logits_BxRxV (where t was predicted). q elsewhere."""
  lo_BxR, hi_BxR, length_BxR = cover_BxRx3[..., 0], cover_BxRx3[..., 1], cover_BxRx3[..., 2]
  p_BxRxV = jax.nn.softmax(prev_logits_BxRxV, axis=-1)
  rank_1x1xV = rank_V[None, None, :]
  inside_BxRxV = (rank_1x1xV >= lo_BxR[..., None]) & (rank_1x1xV < hi_BxR[..., None])
  event_BxRxV = jnp.where(inside_BxRxV, offsets_LxV[jnp.clip(length_BxR, 0, offsets_LxV.shape[0] - 1)], NO_EVENT)
  exact_BxRx1 = jnp.sum(jnp.where(event_BxRxV == ENDS_HERE, p_BxRxV, 0.0), axis=-1, keepdims=True)
  E = q_BxRxE.shape[-1]
  scatter = lambda event_V, p_V: jnp.zeros((E,), p_V.dtype).at[jnp.maximum(event_V, 0)].add(
      jnp.where(event_V >= 0, p_V, 0.0))
  longer_BxRxE = jax.vmap(jax.vmap(scatter))(event_BxRxV, p_BxRxV)
  out_BxRxE = exact_BxRx1 * q_BxRxE + longer_BxRxE
  # positions without a cover total 0; dividing them by 1, not by a tiny floor, keeps their (unused) gradient
  # finite: 0 / 1e-30**2 underflows to 0 / 0 in float32, and the where below would multiply that NaN by 0
  total_BxRx1 = jnp.sum(out_BxRxE, axis=-1, keepdims=True)
  out_BxRxE = out_BxRxE / jnp.where(total_BxRx1 > 0, total_BxRx1, 1.0)
  return jnp.where(lo_BxR[..., None] >= 0, out_BxRxE, q_BxRxE)
