"""Prefix-shift analysis: the two ways sampler weight noise hurts OPD, and what per-token IS can repair.

Legend: B batch, R response length, V vocab. pi = clean learner, mu = noisy sampler, pi_T = teacher.

For a noise level sigma, with common random numbers (the same key for the clean and the noisy sampler):

(a) Per-token mismatch on the same prefixes: rollouts from the clean sampler, scored under clean and noisy
    weights -> `same_prefix_k3`, the k3 estimate of KL(clean || noisy) on the tokens the clean sampler chose.
"Clean" is the configured sampler without noise (a weight recipe or KV dtype, if configured, is in both).
(b) Prefix shift: rollouts from the noisy sampler vs the clean one. At each prefix h the OPD target is the exact
    per-prefix reverse KL D(h) = KL(pi(.|h) || pi_T(.|h)), which does not depend on the token drawn at h.
    `prefix_kl_clean` = mean of D over prefixes the clean sampler reaches (what OPD should estimate);
    `prefix_kl_noisy` = mean of D over prefixes the noisy sampler reaches. Their difference is the prefix shift.
    Also: grader accuracy and response length of each, the first position where the two samples differ, and the
    teacher log-prob of sampled tokens along the response.
(c) What TIS repairs: the sampled-token OPD estimate on noisy rollouts, k1 = mean_t log pi(a_t)/pi_T(a_t),
    estimates the wrong thing at each prefix because a_t ~ mu, not pi. `k1_naive_error` is its gap to
    `prefix_kl_noisy` (the exact value on the same prefixes) and `k1_tis_error` the gap after truncated
    importance weights min(pi/mu, C) (self-normalized). TIS shrinks the per-token error. Its weights also
    change which prefixes count (each position weighted by its own token's ratio), so they move the prefix
    shift too, though a per-token ratio is not the trajectory's pi(h) / mu(h) and nothing makes the move
    land on zero: see (d).
(d) What sequence-level weights repair: every correction of `objectives.losses.importance_weights` (token tis /
    mis, sequence seq_tis / geo_tis / geo_reject) weights the noisy rollouts, self-normalized, and
    `corrections[kind]` reports the weighted k1 estimate's error against `prefix_kl_clean` (the whole error
    OPD's signal has: per-token bias plus prefix shift), the weighted mean of the exact per-prefix KL against
    it (`shift`: what is left of the prefix shift once prefixes are reweighted; sequence weights pi(y) / mu(y)
    reweight whole trajectories, token weights one position at a time), the share of responses with non-zero
    weight and the effective sample size of the weights (ESS / responses). In the shipped pair1 scans, seeds
    0-2 (results/prefix_shift_pair1*.json), at sigma 0.1 the unweighted shift is +0.104 [+0.096, +0.115]
    (mean [min, max] over seeds); token TIS leaves -0.007 [-0.026, +0.005], within the seed spread of zero, and
    its estimate error is -0.005 [-0.016, +0.011]; MIS over-corrects to -0.096 and seq_tis to -0.118 (ESS 0.22).
    The weights repair the estimate; the rollouts still go where the noisy sampler takes them.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from opd_jax.data.batching import decode_responses
from opd_jax.data.grader import is_correct
from opd_jax.mismatch.metrics import token_metrics
from opd_jax.objectives.losses import IMPORTANCE, importance_weights
from opd_jax.screening.calibration import Calibration
from opd_jax.rollout.config import RolloutConfig


def _masked_mean(x_BxR, mask_BxR) -> float:
  return float(jnp.sum(x_BxR * mask_BxR) / jnp.maximum(jnp.sum(mask_BxR), 1.0))


def _weighted(x_BxR, w_BxR) -> float | None:
  """Self-normalized weighted mean; None when no token keeps any weight (nothing left to estimate from)."""
  total = float(jnp.sum(w_BxR))
  return float(jnp.sum(w_BxR * x_BxR)) / total if total > 0 else None


def _minus(a: float | None, b: float) -> float | None:
  return None if a is None else a - b


def _corrections(learner_logp, sampler_logp, mask, log_advantage, prefix_kl_BxR, is_cap: float) -> dict:
  """Per correction kind: weighted k1 estimate and weighted exact prefix KL, share kept, ESS (per response)."""
  out = {}
  for kind in IMPORTANCE:
    w = importance_weights(learner_logp, sampler_logp, kind, is_cap, mask) * mask
    w_B = jnp.sum(w, 1) / jnp.maximum(jnp.sum(mask, 1), 1.0)  # a response's mean token weight
    out[kind] = {"k1": _weighted(log_advantage, w), "prefix_kl": _weighted(prefix_kl_BxR, w),
                 "kept": float(jnp.mean(w_B > 0)),
                 "ess": float(jnp.sum(w_B) ** 2 / jnp.maximum(jnp.sum(w_B ** 2), 1e-12) / w_B.shape[0])}
  return out


def _rollout_stats(cal: Calibration, out, is_cap: float, temperature: float) -> dict:
  """Graded quality and the OPD quantities of one rollout batch, scored by the clean learner and the teacher."""
  mask = out.mask_BxN
  learner_logp = cal.learner_logp(out, temperature=temperature)
  teacher_logp = cal.teacher_logp(out, temperature)
  prefix_kl_BxR = cal.prefix_kl(out)
  log_advantage = learner_logp - teacher_logp  # per-token k1 of KL(pi || pi_T)
  ratio = jnp.exp(jnp.clip(learner_logp - out.logprobs_BxN, -20, 20))
  w = jnp.minimum(ratio, is_cap) * mask
  texts = decode_responses(cal.tokenizer, *jax.device_get((out.tokens_BxN, mask)))
  return {
      "accuracy": _accuracy(texts, cal.problems),
      "response_tokens": float(jnp.mean(jnp.sum(mask, 1))),
      "prefix_kl": _masked_mean(prefix_kl_BxR, mask),
      "k1_naive": _masked_mean(log_advantage, mask),
      "k1_tis": float(jnp.sum(w * log_advantage) / jnp.maximum(jnp.sum(w), 1e-9)),
      "teacher_logp": _masked_mean(teacher_logp, mask),
      "teacher_logp_by_position": [_masked_mean(teacher_logp[:, s], mask[:, s]) for s in _position_buckets(mask)],
      "corrections": _corrections(learner_logp, out.logprobs_BxN, mask, log_advantage, prefix_kl_BxR, is_cap),
  }


def _accuracy(texts: list[str], problems) -> float | None:
  """Share of the graded problems answered correctly; None when no problem has an answer."""
  graded = [is_correct(t, p.answer, p.grader) for t, p in zip(texts, problems) if p.answer is not None]
  return float(np.mean(graded)) if graded else None


def _position_buckets(mask) -> list[slice]:
  n = mask.shape[1]
  edges = [0, n // 4, n // 2, 3 * n // 4, n]
  return [slice(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def _first_divergence(a_BxR, b_BxR, mask_a, mask_b) -> np.ndarray:
  """Per row: first position where the two responses differ (their common length when one is a prefix)."""
  a, b = np.asarray(a_BxR), np.asarray(b_BxR)
  differs = (a != b) | (np.asarray(mask_a) != np.asarray(mask_b))
  first = np.where(differs.any(1), differs.argmax(1), np.asarray(mask_a).sum(1))
  return first


def analyze(cal: Calibration, rollout: RolloutConfig, sigma: float, seed: int = 0) -> dict:
  """All quantities of the module docstring for one noise level (noise in the sampler only)."""
  key = jax.random.key(seed)
  temperature = rollout.temperature
  clean_rollout = dataclasses.replace(rollout, noise_sigma=0.0)
  noisy_rollout = dataclasses.replace(rollout, noise_sigma=sigma)
  clean_state = cal.sampler_state(clean_rollout)
  noisy_state = cal.sampler_state(noisy_rollout)
  clean_out = cal.sample(clean_rollout, clean_state, key)
  noisy_out = cal.sample(noisy_rollout, noisy_state, key)
  # (a) same prefixes: both weight sets teacher-forced on the clean sampler's tokens; tokens ~ clean, so the
  # clean sampler takes token_metrics' sampler role and k3 estimates KL(clean || noisy).
  on_clean = lambda state: cal.learner_logp(clean_out, params=state, temperature=temperature)
  same_prefix = token_metrics(on_clean(noisy_state), on_clean(clean_state), clean_out.mask_BxN, cal.is_cap)
  clean = _rollout_stats(cal, clean_out, cal.is_cap, temperature)
  noisy = _rollout_stats(cal, noisy_out, cal.is_cap, temperature)
  noisy_own = cal.measure(noisy_rollout, key)  # the sampler's own tokens, as in training
  first = _first_divergence(clean_out.tokens_BxN, noisy_out.tokens_BxN, clean_out.mask_BxN, noisy_out.mask_BxN)
  return {
      "sigma": sigma,
      "same_prefix_k3": float(same_prefix["k3"]),
      "own_tokens_k3": noisy_own["k3"],
      "prefix_kl_clean": clean["prefix_kl"],
      "prefix_kl_noisy": noisy["prefix_kl"],
      "prefix_shift": noisy["prefix_kl"] - clean["prefix_kl"],
      "k1_naive_error": noisy["k1_naive"] - noisy["prefix_kl"],
      "k1_tis_error": noisy["k1_tis"] - noisy["prefix_kl"],
      "accuracy_clean": clean["accuracy"],
      "accuracy_noisy": noisy["accuracy"],
      "response_tokens_clean": clean["response_tokens"],
      "response_tokens_noisy": noisy["response_tokens"],
      "first_divergence_mean": float(first.mean()),
      "first_divergence_median": float(np.median(first)),
      "identical_responses": float(np.mean(first >= np.asarray(clean_out.mask_BxN).sum(1))),
      "teacher_logp_clean": clean["teacher_logp"],
      "teacher_logp_noisy": noisy["teacher_logp"],
      "teacher_logp_by_position_clean": clean["teacher_logp_by_position"],
      "teacher_logp_by_position_noisy": noisy["teacher_logp_by_position"],
      "corrections": {kind: {"k1_error": _minus(c["k1"], clean["prefix_kl"]),
                             "shift": _minus(c["prefix_kl"], clean["prefix_kl"]), "kept": c["kept"], "ess": c["ess"]}
                      for kind, c in noisy["corrections"].items()},
  }
