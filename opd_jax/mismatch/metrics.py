"""Sampler-vs-learner mismatch on one scale. Jittable; every function returns a dict of float32 scalars.

Legend: B batch, T tokens, V vocab, K top-k support.
Notation: pi the learner, mu the sampler; lr = clip(log pi(a) - log mu(a), -20, 20) on sampled tokens, so
r = exp(lr) = pi/mu and, under a ~ mu, E[r] = 1. Token means are mask-weighted over all tokens of the batch;
sequence means are over sequences with at least one masked token. An empty mask gives 0 (ess: 1).

  k1 = E[-lr]                    unbiased estimate of KL(mu || pi)
  k2 = E[0.5 lr^2]               low-variance, biased
  k3 = E[r - 1 - lr]             unbiased, always >= 0 (Schulman's estimator): the primary "one scale"
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_BUCKETS = (("lt1e-3", -jnp.inf, 1e-3), ("1e-3_1e-1", 1e-3, 1e-1), ("gt1e-1", 1e-1, jnp.inf))


def _mean(x_BxT, mask_BxT):
  return jnp.sum(x_BxT * mask_BxT) / jnp.maximum(jnp.sum(mask_BxT), 1.0)


def _masked_quantile(x_BxT, mask_BxT, q: float):
  """Quantile of x over masked entries (0 when none), by sorting with masked-out entries pushed to +inf."""
  flat = jnp.where(mask_BxT > 0, x_BxT, jnp.inf).ravel()
  count = jnp.sum(mask_BxT > 0)
  ordered = jnp.sort(flat)
  position = q * jnp.maximum(count - 1, 0).astype(jnp.float32)
  low = jnp.floor(position).astype(jnp.int32)
  high = jnp.minimum(low + 1, jnp.maximum(count - 1, 0))
  frac = position - low
  value = ordered[low] * (1 - frac) + jnp.where(frac > 0, ordered[high], 0.0) * frac
  return jnp.where(count > 0, value, 0.0)


def token_metrics(learner_logp, sampler_logp, mask, is_cap: float = 2.0) -> dict[str, jax.Array]:
  """Mismatch from the log-probs of the sampled tokens, [B, T] each (mask 0/1)."""
  mask = mask.astype(jnp.float32)
  lr = jnp.clip(learner_logp - sampler_logp, -20.0, 20.0) * mask
  ratio = jnp.exp(lr)
  abs_lr = jnp.abs(lr)
  count = jnp.sum(mask)
  seq_count_B = jnp.sum(mask, axis=1)
  has_tokens_B = (seq_count_B > 0).astype(jnp.float32)
  n_seqs = jnp.maximum(jnp.sum(has_tokens_B), 1.0)
  seq_lr_B = jnp.sum(lr, axis=1)
  chi2_seq_B = jnp.exp(jnp.clip(2.0 * seq_lr_B, -20.0, 20.0)) - 1.0
  per_seq = lambda x: jnp.sum(x, axis=1) / jnp.maximum(seq_count_B, 1.0)
  log_ppl_diff_B = per_seq(sampler_logp * mask) - per_seq(learner_logp * mask)
  outside = ((ratio > is_cap) | (ratio < 1.0 / is_cap)).astype(jnp.float32)
  w = jnp.minimum(ratio, is_cap)
  mean_w, mean_w2 = _mean(w, mask), _mean(w * w, mask)
  k3 = ratio - 1.0 - lr
  out = {
      "k1": _mean(-lr, mask),
      "k2": _mean(0.5 * lr * lr, mask),
      "k3": _mean(k3, mask),
      "abs_logp_diff": _mean(abs_lr, mask),
      "max_abs_logp_diff": jnp.max(jnp.where(mask > 0, abs_lr, 0.0)),
      "mult_prob_error": jnp.where(count > 0, _mean(jnp.exp(abs_lr), mask), 0.0),
      "tv": 0.5 * _mean(jnp.abs(ratio - 1.0), mask),
      "chi2_token": jnp.where(count > 0, _mean(jnp.exp(2.0 * lr), mask) - 1.0, 0.0),
      "chi2_seq": jnp.sum(chi2_seq_B * has_tokens_B) / n_seqs,
      "log_ppl_diff": jnp.sum(log_ppl_diff_B * has_tokens_B) / n_seqs,
      "is_frac_outside": _mean(outside, mask),
      "ess": jnp.where(count > 0, mean_w * mean_w / jnp.maximum(mean_w2, 1e-30), 1.0),
      "abs_logp_diff_p50": _masked_quantile(abs_lr, mask, 0.5),
      "abs_logp_diff_p99": _masked_quantile(abs_lr, mask, 0.99),
  }
  sampler_prob = jnp.exp(sampler_logp)
  for name, low, high in _BUCKETS:
    in_bucket = mask * ((sampler_prob >= low) & (sampler_prob < high)).astype(jnp.float32)
    out[f"k3_p{name}"] = _mean(k3, in_bucket)
    out[f"frac_p{name}"] = _mean(in_bucket, mask)
  return out


def vocab_divergences_per_token(logp_mu, logp_pi) -> dict[str, jax.Array]:
  """Exact divergences between two distributions given as log-probs over the same support [B, T, V]:
  one value per position, [B, T] (see `vocab_metrics` for the definitions)."""
  mu, pi = jnp.exp(logp_mu), jnp.exp(logp_pi)
  kl = lambda p, logp, logq: jnp.sum(jnp.where(p > 0, p * (logp - logq), 0.0), axis=-1)
  logm = jnp.logaddexp(logp_mu, logp_pi) - jnp.log(2.0)
  return {
      "kl_sampler_learner": kl(mu, logp_mu, logp_pi),
      "kl_learner_sampler": kl(pi, logp_pi, logp_mu),
      "tv": 0.5 * jnp.sum(jnp.abs(mu - pi), axis=-1),
      "js": 0.5 * kl(mu, logp_mu, logm) + 0.5 * kl(pi, logp_pi, logm),
  }


def token_mean(per_token: dict[str, jax.Array], mask) -> dict[str, jax.Array]:
  """Mask-weighted mean of each [B, T] entry (how per-token vocabulary divergences become metrics)."""
  mask = mask.astype(jnp.float32)
  return {k: _mean(v, mask) for k, v in per_token.items()}


def vocab_metrics(learner_logits, sampler_logits, mask) -> dict[str, jax.Array]:
  """Exact vocabulary-level divergences between learner pi and sampler mu, token-mean over `mask`.

  kl_sampler_learner = KL(mu || pi), kl_learner_sampler = KL(pi || mu), tv = 0.5 sum |mu - pi|,
  js = 0.5 KL(mu || M) + 0.5 KL(pi || M) with M = (mu + pi) / 2.
  """
  return token_mean(vocab_divergences_per_token(jax.nn.log_softmax(sampler_logits, axis=-1),
                                                jax.nn.log_softmax(learner_logits, axis=-1)), mask)


def vocab_divergences_topk_per_token(learner_logits, sampler_top_logprobs, sampler_top_ids) -> dict[str, jax.Array]:
  """`vocab_metrics_topk`'s divergences, one value per position [B, T] (chunked callers average them)."""
  learner_logp = jax.nn.log_softmax(learner_logits, axis=-1)
  learner_top = jnp.take_along_axis(learner_logp, sampler_top_ids, axis=-1)

  def with_tail(top):
    if top.shape[-1] == learner_logits.shape[-1]:  # K = V: the whole distribution, no tail
      return top
    tail = jnp.log(jnp.clip(1.0 - jnp.sum(jnp.exp(top), axis=-1, keepdims=True), 1e-30, 1.0))
    return jnp.concatenate([top, tail], axis=-1)

  return vocab_divergences_per_token(with_tail(sampler_top_logprobs), with_tail(learner_top))


def vocab_metrics_topk(learner_logits, sampler_top_logprobs, sampler_top_ids, mask) -> dict[str, jax.Array]:
  """The same divergences on the sampler's top-K tokens plus one tail bin (for large vocabularies).

  sampler_top_logprobs/ids: [B, T, K] normalized log-probs of the sampler's K most likely tokens (what the
  sampler returns). Both distributions are coarse-grained to (those K tokens, the rest); by the
  data-processing inequality each divergence is a lower bound on the full one, exact when K = V.
  """
  return token_mean(vocab_divergences_topk_per_token(learner_logits, sampler_top_logprobs, sampler_top_ids), mask)
