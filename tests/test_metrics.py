"""Mismatch metrics against an independent float64 numpy implementation of their definitions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opd_jax.mismatch import token_metrics, vocab_metrics, vocab_metrics_topk

TOKEN_KEYS = {"k1", "k2", "k3", "abs_logp_diff", "max_abs_logp_diff", "mult_prob_error", "tv", "chi2_token",
              "chi2_seq", "log_ppl_diff", "is_frac_outside", "ess"}


def _np_token_metrics(learner, sampler, mask, cap):
  learner, sampler, mask = (np.asarray(x, np.float64) for x in (learner, sampler, mask))
  on = mask > 0
  lr = np.clip(learner - sampler, -20, 20)
  x, r = lr[on], np.exp(lr[on])
  rows = on.any(1)
  seq_sum = (np.clip(learner - sampler, -20, 20) * mask).sum(1)
  mean_row = lambda a: (a * mask).sum(1) / np.maximum(mask.sum(1), 1)
  w = np.minimum(r, cap)
  return {
      "k1": np.mean(-x), "k2": np.mean(0.5 * x ** 2), "k3": np.mean(r - 1 - x),
      "abs_logp_diff": np.mean(np.abs(x)), "max_abs_logp_diff": np.max(np.abs(x)),
      "mult_prob_error": np.mean(np.exp(np.abs(x))), "tv": 0.5 * np.mean(np.abs(r - 1)),
      "chi2_token": np.mean(np.exp(2 * x)) - 1,
      "chi2_seq": np.mean(np.exp(np.clip(2 * seq_sum[rows], -20, 20)) - 1),
      "log_ppl_diff": np.mean((mean_row(sampler) - mean_row(learner))[rows]),
      "is_frac_outside": np.mean((r > cap) | (r < 1 / cap)),
      "ess": np.mean(w) ** 2 / np.mean(w ** 2),
      "abs_logp_diff_p50": np.quantile(np.abs(x), 0.5), "abs_logp_diff_p99": np.quantile(np.abs(x), 0.99),
  }


def _inputs(seed, extreme=False):
  rng = np.random.RandomState(seed)
  sampler = np.log(rng.uniform(1e-5, 1, (4, 9)))
  learner = sampler + rng.randn(4, 9) * (0.3 if not extreme else 30.0)
  mask = (rng.rand(4, 9) > 0.3).astype(np.float32)
  mask[1] = 0.0  # a sequence with no response tokens
  learner[mask == 0] = 1e3  # garbage under the mask must not leak
  return learner.astype(np.float32), sampler.astype(np.float32), mask


@pytest.mark.parametrize("seed,extreme", [(0, False), (1, False), (2, True)])
def test_token_metrics_match_numpy(seed, extreme):
  learner, sampler, mask = _inputs(seed, extreme)
  ours = token_metrics(jnp.asarray(learner), jnp.asarray(sampler), jnp.asarray(mask), is_cap=2.0)
  assert TOKEN_KEYS <= set(ours)
  for key, value in _np_token_metrics(learner, sampler, mask, 2.0).items():
    np.testing.assert_allclose(float(ours[key]), value, rtol=2e-4, atol=1e-6, err_msg=key)
  jitted = jax.jit(token_metrics, static_argnames="is_cap")(learner, sampler, mask, is_cap=2.0)
  for key in ours:
    np.testing.assert_allclose(float(jitted[key]), float(ours[key]), rtol=1e-5, atol=1e-7, err_msg=key)


def test_probability_buckets_partition_the_tokens():
  learner, sampler, mask = _inputs(3)
  ours = token_metrics(learner, sampler, mask)
  fractions = [float(ours[f"frac_p{b}"]) for b in ("lt1e-3", "1e-3_1e-1", "gt1e-1")]
  np.testing.assert_allclose(sum(fractions), 1.0, rtol=1e-6)
  weighted = sum(f * float(ours[f"k3_p{b}"]) for f, b in zip(fractions, ("lt1e-3", "1e-3_1e-1", "gt1e-1")))
  np.testing.assert_allclose(weighted, float(ours["k3"]), rtol=1e-5)


def test_zero_mismatch_is_zero():
  _, sampler, mask = _inputs(4)
  ours = token_metrics(sampler, sampler, mask)
  for key in ("k1", "k2", "k3", "tv", "abs_logp_diff", "max_abs_logp_diff", "chi2_token", "chi2_seq",
              "log_ppl_diff", "is_frac_outside"):
    assert float(ours[key]) == 0.0, key
  assert float(ours["ess"]) == 1.0 and float(ours["mult_prob_error"]) == 1.0
  logits = jax.random.normal(jax.random.key(0), (4, 9, 11))
  for key, value in vocab_metrics(logits, logits, mask).items():
    assert abs(float(value)) < 1e-6, key


def test_empty_mask_gives_zeros_and_unit_ess():
  learner, sampler, _ = _inputs(5)
  ours = token_metrics(learner, sampler, np.zeros_like(learner))
  assert all(np.isfinite(float(v)) for v in ours.values())
  assert float(ours["k3"]) == 0.0 and float(ours["ess"]) == 1.0


def _np_vocab(learner_logits, sampler_logits, mask):
  def logsm(z):
    z = z.astype(np.float64) - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))
  lpi, lmu = logsm(learner_logits), logsm(sampler_logits)
  pi, mu = np.exp(lpi), np.exp(lmu)
  lm = np.log((pi + mu) / 2)
  on = mask > 0
  return {"kl_sampler_learner": (mu * (lmu - lpi)).sum(-1)[on].mean(),
          "kl_learner_sampler": (pi * (lpi - lmu)).sum(-1)[on].mean(),
          "tv": 0.5 * np.abs(mu - pi).sum(-1)[on].mean(),
          "js": (0.5 * (mu * (lmu - lm)).sum(-1) + 0.5 * (pi * (lpi - lm)).sum(-1))[on].mean()}


def test_vocab_metrics_match_numpy_and_topk_bounds_them():
  rng = np.random.RandomState(6)
  learner = rng.randn(3, 5, 13).astype(np.float32) * 2
  sampler = learner + rng.randn(3, 5, 13).astype(np.float32) * 0.5
  mask = (rng.rand(3, 5) > 0.3).astype(np.float32)
  ours = vocab_metrics(learner, sampler, mask)
  for key, value in _np_vocab(learner, sampler, mask).items():
    np.testing.assert_allclose(float(ours[key]), value, rtol=1e-4, err_msg=key)
  sampler_logp = jax.nn.log_softmax(sampler)
  full_k = jax.lax.top_k(sampler_logp, 13)
  exact = vocab_metrics_topk(learner, full_k[0], full_k[1], mask)
  for key in ours:
    np.testing.assert_allclose(float(exact[key]), float(ours[key]), rtol=1e-4, err_msg=key)
  top = jax.lax.top_k(sampler_logp, 4)
  bound = vocab_metrics_topk(learner, top[0], top[1], mask)
  for key in ours:
    assert 0 <= float(bound[key]) <= float(ours[key]) + 1e-6, key


def test_sampled_token_k3_estimates_vocab_kl():
  """E_{a ~ mu}[k3] = KL(mu || pi): the sampled-token scale and the vocabulary scale agree in expectation."""
  rng = np.random.RandomState(7)
  learner_logits = rng.randn(1, 1, 6).astype(np.float32)
  sampler_logits = learner_logits + rng.randn(1, 1, 6).astype(np.float32) * 0.4
  exact = float(vocab_metrics(learner_logits, sampler_logits, np.ones((1, 1)))["kl_sampler_learner"])
  n = 200_000
  tokens = jax.random.categorical(jax.random.key(0), jnp.asarray(sampler_logits[0, 0]), shape=(1, n))
  learner_logp = jax.nn.log_softmax(learner_logits[0, 0])[tokens]
  sampler_logp = jax.nn.log_softmax(sampler_logits[0, 0])[tokens]
  estimate = float(token_metrics(learner_logp, sampler_logp, jnp.ones((1, n)))["k3"])
  k1 = float(token_metrics(learner_logp, sampler_logp, jnp.ones((1, n)))["k1"])
  assert abs(estimate - exact) < 0.05 * exact and abs(k1 - exact) < 0.1 * exact, (estimate, k1, exact)
