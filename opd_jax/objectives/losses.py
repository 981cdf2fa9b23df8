"""OPD objectives, selectable by name. Every loss is a token-mean over the response mask of the batch.

Legend: B batch, R response length, V vocab, K top-k support size.
Notation: pi_theta the learner (student being trained), pi_T the teacher, mu the sampler that generated the
tokens a_t. Log-probs and logits are float32.

  reverse_kl_pg  the standard OPD policy gradient. A_t = log pi_T(a_t) - log pi_S(a_t) (stop-gradient), where
                 pi_S is the learner's recomputation (default) or the sampler's log-prob (config
                 `student_logp`). With a teacher of another tokenizer (opd_jax.crosstok) a_t is replaced by the
                 span of characters around it that both tokenizations delimit, and both log-probs are the span's
                 (sums over its tokens): the same quantity, exact for either tokenizer; a span of one token is
                 the token's. loss = -mean_t(w_t * A_t * log pi_theta(a_t)); its expected gradient is the
                 gradient of KL(pi_theta || pi_T) along the sampled prefixes. w_t (detached):
                   none  1
                   tis   min(pi_theta / mu, C)                          (truncated importance sampling)
                   mis   1[1/C <= pi_theta / mu <= C] (masked importance sampling)
                 and per sequence y (every token of y gets its sequence's weight; rho = pi_theta(y) / mu(y) is the
                 product of the token ratios over the response, g = rho^(1/|y|) their geometric mean):
                   seq_tis     min(rho, C)                   (sequence-level truncated IS)
                   geo_tis     min(g, C)                     (geometric-mean IS: length-normalized, so long
                                                              responses do not drive it to 0 or C)
                   geo_reject  1[geo_lo <= g <= geo_hi]      (rejects whole sequences whose rollout drifted,
                                                              e.g. verl's geometric rejection sampling)
                 Token weights correct which token was drawn at a prefix; only sequence weights can also
                 reweight which prefixes were reached (docs/study.md, prefix-shift table). Zero weights keep their
                 tokens in the loss's denominator (the token mean of the batch), as mis does.
                 Guard: the batch's effective sample size ESS = (sum w)^2 / (N sum w^2) over its N response
                 tokens (1 when every weight is equal) is logged as opd/is_ess; with `min_ess` > 0 an update whose
                 ESS falls below it is skipped (the state stays as it was; logged as skipped_low_ess), so a
                 correction that keeps a handful of responses cannot take full Adam steps on them.
  reverse_kl     exact KL(pi_theta || pi_T) over the vocabulary at each sampled prefix. With a teacher of another
                 tokenizer (opd_jax.crosstok): at each span start, KL between both next-token distributions
                 marginalized onto the next character (opd_jax.objectives.marginal); a span's later tokens, which
                 no teacher position predicts, take the span form's policy gradient (reverse_kl_pg's).
                 That is marginal_span="first". The next-character marginals compare only first characters: a
                 span-start token's probability relative to the others with its first character ("chat" against
                 "c'était") gets no gradient from them. marginal_span="chain": the span's reverse KL by the chain
                 rule, KL(first character) + E[KL(rest of the span | first character)]: the marginal divergence
                 at its start, plus a policy gradient on every token of the span with the advantage of the rest,
                 (log pi_T(span) - log q_T(c)) - (log pi_S(span) - log q_S(c)), c the sampled first character.
                 Each token differentiates its whole log pi_theta(a_t): the rest's expected KL also depends on
                 which first character is drawn. In expectation over the student's samples this is the gradient
                 of the span's exact reverse KL (a test checks it against the token-level exact one).
  forward_kl     exact KL(pi_T || pi_theta).
  jsd            generalized JSD of GKD (`generalized_jsd`), beta interpolating forward (0) and reverse (1) KL.
  grpo           the RL baseline under identical rollouts (no teacher in the loss): each prompt is sampled
                 group_size times, a response's reward is 1 if its final answer is correct, and its advantage
                 A = (r - mean_group(r)) / (std_group(r) + 1e-6) (GRPO, Shao et al. 2024) is shared by all
                 its tokens. loss = -mean_t(w_t * A * log pi_theta(a_t)) over all response tokens of the
                 batch, w_t as above. One update per batch, so PPO's ratio clipping never binds and is left
                 out, as is a KL penalty to a reference model (as in DAPO / Dr. GRPO).
  uld            the baseline of cross-tokenizer distillation users know (Universal Logit Distillation, Boizard et
                 al. 2024; the loss TRL's GOLD applies to tokens it cannot align): the L1 distance between the two
                 distributions' probabilities sorted in decreasing order, which needs no token correspondence;
                 here over the top_k largest of each plus one tail bin (1 - their sum). It ignores which token
                 carries which probability, so it is a baseline, not a divergence between the same events.
                 Across tokenizers, at span starts, a span's later tokens as in reverse_kl.
  *_topk         the same three on the teacher's top-k support plus one tail bin: both distributions are
                 coarse-grained to (top-k tokens of pi_T, everything else). The tail bin keeps the divergence
                 well defined and, by the data-processing inequality, a lower bound on the full one; it is exact
                 when pi_T puts no mass outside its top k. With top_k = V there is no tail bin: the exact
                 objective, from the teacher's whole log-prob vector (what a served teacher of a small vocabulary
                 sends in place of hidden states, `ObjectiveConfig.over_the_wire`). Only the teacher's top-k ids
                 and log-probs [B, R, K] cross from the teacher to the learner.

Every objective is per token: `token_losses` returns a loss term per response token ([B, R]) and the scalar
loss is its sum over the mask divided by the batch's token count. The full-vocabulary objectives read a
per-token divergence ([B, R]) that the learner computes chunk by chunk over the sequence
(`opd_jax.objectives.chunked`), so no [B, R, V] tensor is needed; `divergence_from_logits` is the same
divergence on whole logits (small vocabularies, tests). Dividing by an external token count lets micro-batches
add up to exactly the full-batch loss and gradient.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from opd_jax.errors import InputError
from opd_jax.objectives.spans import span_starts, span_total

IMPORTANCE = ("none", "tis", "mis", "seq_tis", "geo_tis", "geo_reject")
SEQUENCE_IMPORTANCE = ("seq_tis", "geo_tis", "geo_reject")
WEIGHTED_OBJECTIVES = ("reverse_kl_pg", "grpo")  # the sampled-token objectives that take importance weights
STUDENT_LOGP = ("learner", "sampler")
MARGINAL_SPAN = ("first", "chain")


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
  name: str = "reverse_kl_pg"  # see module docstring; names in OBJECTIVES
  student_logp: str = "learner"  # reverse_kl_pg: whose log pi_S enters the advantage
  importance: str = "none"  # reverse_kl_pg / grpo: none | tis | mis | seq_tis | geo_tis | geo_reject
  is_cap: float = 2.0  # C for tis / mis / seq_tis / geo_tis
  geo_lo: float = 0.9  # geo_reject: keep sequences whose geometric-mean ratio is in [geo_lo, geo_hi]
  geo_hi: float = 1.1
  min_ess: float = 0.0  # skip an update whose importance weights' ESS share is below this (0 = never)
  beta: float = 0.5  # jsd / jsd_topk
  top_k: int = 16  # *_topk support size
  temperature: float = 1.0  # divides student and teacher logits in the full-vocabulary objectives
  group_size: int = 8  # grpo: responses sampled per prompt
  marginal_span: str = "first"  # reverse_kl across tokenizers: first | chain (module docstring)

  def __post_init__(self):
    if self.name not in OBJECTIVES:
      raise InputError(f"objective.name {self.name!r} is unknown; choose one of {sorted(OBJECTIVES)}")
    if self.importance not in IMPORTANCE:
      raise InputError(f"objective.importance must be one of {IMPORTANCE}, got {self.importance!r}")
    if self.student_logp not in STUDENT_LOGP:
      raise InputError(f"objective.student_logp must be one of {STUDENT_LOGP}, got {self.student_logp!r}")
    if self.name == "grpo" and self.group_size < 2:
      raise InputError(f"objective.group_size must be >= 2 for grpo (advantages compare responses to the "
                       f"same prompt), got {self.group_size}")
    if not 0 < self.geo_lo <= 1 <= self.geo_hi:
      raise InputError(f"objective.geo_lo / geo_hi must satisfy 0 < geo_lo <= 1 <= geo_hi, got {self.geo_lo}, "
                       f"{self.geo_hi}")
    if not 0 <= self.min_ess < 1:
      raise InputError(f"objective.min_ess must be in [0, 1) (a share of the batch's tokens), got {self.min_ess}")
    if self.min_ess and (self.importance == "none" or self.name not in WEIGHTED_OBJECTIVES):
      raise InputError(f"objective.min_ess={self.min_ess} guards importance weights, but objective {self.name!r} "
                       f"with importance={self.importance!r} has none; set an importance kind on reverse_kl_pg / "
                       "grpo, or min_ess=0")
    if self.marginal_span not in MARGINAL_SPAN:
      raise InputError(f"objective.marginal_span must be one of {MARGINAL_SPAN}, got {self.marginal_span!r}")
    if self.marginal_span == "chain" and self.name != "reverse_kl":
      raise InputError(f"objective.marginal_span='chain' splits a span's reverse KL at its first character; it "
                       f"needs objective.name='reverse_kl', got {self.name!r} (or set marginal_span='first')")
    if self.is_cap <= 1 or not 0 <= self.beta <= 1 or self.top_k < 1 or self.temperature <= 0:
      raise InputError(f"objective: need is_cap > 1, 0 <= beta <= 1, top_k >= 1, temperature > 0; got "
                       f"{self.is_cap}, {self.beta}, {self.top_k}, {self.temperature}")

  @property
  def needs_teacher_hidden(self) -> bool:
    """Exact full-vocabulary objectives: the learner recomputes the teacher's logits from its hidden states."""
    return self.name in _EXACT_BETA

  @property
  def needs_teacher_topk(self) -> bool:
    return self.name in _TOPK_BETA or self.name == "uld"

  @property
  def vocab_beta(self) -> float | None:
    """beta of the generalized JSD the vocabulary objectives compute (1 reverse KL, 0 forward KL); None for
    the sampled-token objectives."""
    if self.name not in _EXACT_BETA and self.name not in _TOPK_BETA:
      return None
    beta = {**_EXACT_BETA, **_TOPK_BETA}[self.name]
    return self.beta if beta is None else beta

  def over_the_wire(self, vocab_size: int) -> "ObjectiveConfig":
    """The objective a served teacher can feed (it sends log-probs, never hidden states): an exact vocabulary
    objective becomes its *_topk form over the whole vocabulary (top_k = V: no tail bin, the same divergence up to
    summation order); any other objective is unchanged."""
    if not self.needs_teacher_hidden:
      return self
    return dataclasses.replace(self, name=_TOPK_OF_EXACT[self.name], top_k=vocab_size)

  @property
  def prompts_per_batch_divisor(self) -> int:
    """Responses per prompt: the batch holds batch_size / this distinct prompts."""
    return self.group_size if self.name == "grpo" else 1


def masked_mean(x_BxR: jax.Array, mask_BxR: jax.Array) -> jax.Array:
  return jnp.sum(x_BxR * mask_BxR) / jnp.maximum(jnp.sum(mask_BxR), 1.0)


def _kl(logp_a_BxRxV: jax.Array, logp_b_BxRxV: jax.Array) -> jax.Array:
  """KL(a || b) per position, [B, R]; 0 * log 0 is 0."""
  p_a = jnp.exp(logp_a_BxRxV)
  return jnp.sum(jnp.where(p_a > 0, p_a * (logp_a_BxRxV - logp_b_BxRxV), 0.0), axis=-1)


def _jsd_per_token(student_logp_BxRxV, teacher_logp_BxRxV, beta: float) -> jax.Array:
  if beta == 0.0:
    return _kl(teacher_logp_BxRxV, student_logp_BxRxV)
  if beta == 1.0:
    return _kl(student_logp_BxRxV, teacher_logp_BxRxV)
  mix_logp_BxRxV = jnp.logaddexp(teacher_logp_BxRxV + jnp.log(beta), student_logp_BxRxV + jnp.log1p(-beta))
  return (beta * _kl(teacher_logp_BxRxV, mix_logp_BxRxV)
          + (1 - beta) * _kl(student_logp_BxRxV, mix_logp_BxRxV))


def generalized_jsd(student_logits, teacher_logits, mask, beta: float, temperature: float = 1.0) -> jax.Array:
  """Token-mean over `mask` of beta*KL(T||M) + (1-beta)*KL(S||M), M = beta*T + (1-beta)*S.

  The mixture is formed from probabilities in log space (logaddexp). beta=0 is exactly KL(T||S) and beta=1
  exactly KL(S||T) (the endpoints are computed directly: the mixture form would vanish there).
  """
  student_logp = jax.nn.log_softmax(student_logits / temperature, axis=-1)
  teacher_logp = jax.nn.log_softmax(teacher_logits / temperature, axis=-1)
  return masked_mean(_jsd_per_token(student_logp, teacher_logp, beta), mask)


def divergence_exact(student_logits_BxRxV, teacher_logits_BxRxV, beta: float, temperature: float) -> jax.Array:
  """Per-token generalized JSD over the whole vocabulary, [B, R] (beta 1 reverse KL, 0 forward KL)."""
  student_logp = jax.nn.log_softmax(student_logits_BxRxV / temperature, axis=-1)
  teacher_logp = jax.nn.log_softmax(teacher_logits_BxRxV / temperature, axis=-1)
  return _jsd_per_token(student_logp, teacher_logp, beta)


def divergence_topk(student_logits_BxRxV, teacher_top_logp_BxRxK, teacher_top_ids_BxRxK, beta: float,
                    temperature: float) -> jax.Array:
  """Per-token generalized JSD on (teacher's top-k tokens, tail bin), [B, R]; the teacher's top-k log-probs
  are at `temperature` already (the scoring program computes them so)."""
  student_logp = jax.nn.log_softmax(student_logits_BxRxV / temperature, axis=-1)
  student_top_BxRxK = jnp.take_along_axis(student_logp, teacher_top_ids_BxRxK, axis=-1)
  if teacher_top_ids_BxRxK.shape[-1] == student_logits_BxRxV.shape[-1]:  # K = V: the whole support, no tail
    return _jsd_per_token(student_top_BxRxK, teacher_top_logp_BxRxK, beta)
  return _jsd_per_token(_with_tail(student_top_BxRxK), _with_tail(teacher_top_logp_BxRxK), beta)


def _with_tail(top_BxRxK):
  mass_BxRx1 = jnp.sum(jnp.exp(top_BxRxK), axis=-1, keepdims=True)
  tail_BxRx1 = jnp.log(jnp.clip(1.0 - mass_BxRx1, 1e-30, 1.0))
  return jnp.concatenate([top_BxRxK, tail_BxRx1], axis=-1)


def divergence_uld(student_logits_BxRxV, teacher_top_logp_BxRxK, temperature: float) -> jax.Array:
  """ULD per position, [B, R] (module docstring): sum_i |s_(i) - t_(i)| over the K largest probabilities of each
  side in decreasing order, plus the difference of their tails. The teacher's top-k comes sorted (lax.top_k)."""
  K = teacher_top_logp_BxRxK.shape[-1]
  student_top_BxRxK = jax.lax.top_k(jax.nn.softmax(student_logits_BxRxV / temperature, axis=-1), K)[0]
  teacher_top_BxRxK = jnp.exp(teacher_top_logp_BxRxK)
  tail = lambda top: 1.0 - jnp.sum(top, axis=-1)
  return (jnp.sum(jnp.abs(student_top_BxRxK - teacher_top_BxRxK), axis=-1)
          + jnp.abs(tail(student_top_BxRxK) - tail(teacher_top_BxRxK)))


def divergence_from_logits(student_logits_BxRxV, teacher_logits_BxRxV, config: "ObjectiveConfig") -> jax.Array:
  """The vocabulary objectives' per-token divergence from whole logits (the unchunked reference path)."""
  if config.needs_teacher_topk:
    teacher_logp = jax.nn.log_softmax(teacher_logits_BxRxV / config.temperature, axis=-1)
    top_logp, top_ids = jax.lax.top_k(teacher_logp, min(config.top_k, teacher_logp.shape[-1]))
    if config.name == "uld":
      return divergence_uld(student_logits_BxRxV, top_logp, config.temperature)
    return divergence_topk(student_logits_BxRxV, top_logp, top_ids, config.vocab_beta, config.temperature)
  return divergence_exact(student_logits_BxRxV, teacher_logits_BxRxV, config.vocab_beta, config.temperature)


def group_advantages(reward_B: jax.Array, group_size: int) -> jax.Array:
  """GRPO advantages: rewards standardized within consecutive groups of `group_size` rows (one prompt each).
  A group whose responses all got the same reward has advantage 0: it carries no learning signal."""
  reward_GxN = reward_B.reshape(-1, group_size).astype(jnp.float32)
  mean_Gx1 = jnp.mean(reward_GxN, axis=1, keepdims=True)
  std_Gx1 = jnp.std(reward_GxN, axis=1, keepdims=True)
  return ((reward_GxN - mean_Gx1) / (std_Gx1 + 1e-6)).reshape(-1)


def importance_weights(learner_logp_BxR, sampler_logp_BxR, kind: str, cap: float, mask_BxR=None,
                       geo_bounds: tuple[float, float] = (0.9, 1.1)) -> jax.Array:
  """Detached weights [B, R] from the ratio pi_theta / mu: per token (tis, mis) or per sequence (seq_tis,
  geo_tis, geo_reject; these need the response mask)."""
  log_ratio_BxR = jax.lax.stop_gradient(learner_logp_BxR - sampler_logp_BxR)
  if kind in SEQUENCE_IMPORTANCE:
    if mask_BxR is None:
      raise InputError(f"importance {kind!r} is per sequence and needs the response mask")
    log_rho_B = jnp.sum(log_ratio_BxR * mask_BxR, axis=1)
    if kind == "seq_tis":
      weight_B = jnp.exp(jnp.minimum(log_rho_B, jnp.log(cap)))  # min(rho, C) without overflowing rho
    else:
      geo_B = jnp.exp(jnp.clip(log_rho_B / jnp.maximum(jnp.sum(mask_BxR, axis=1), 1.0), -20.0, 20.0))
      lo, hi = geo_bounds
      weight_B = jnp.minimum(geo_B, cap) if kind == "geo_tis" else ((geo_B >= lo) & (geo_B <= hi)).astype(jnp.float32)
    return jnp.broadcast_to(weight_B[:, None], log_ratio_BxR.shape)
  ratio_BxR = jnp.exp(jnp.clip(log_ratio_BxR, -20.0, 20.0))
  if kind == "tis":
    return jnp.minimum(ratio_BxR, cap)
  if kind == "mis":
    return ((ratio_BxR >= 1.0 / cap) & (ratio_BxR <= cap)).astype(jnp.float32)
  return jnp.ones_like(ratio_BxR)


@dataclasses.dataclass(frozen=True)
class LossInputs:
  """What every objective may read (all [B, R] unless noted)."""
  learner_logp_BxR: jax.Array  # log pi_theta(a_t), differentiable
  sampler_logp_BxR: jax.Array  # log mu(a_t) recorded by the sampler
  teacher_logp_BxR: jax.Array  # log pi_T(a_t)
  mask_BxR: jax.Array
  divergence_BxR: jax.Array | None = None  # vocabulary objectives: per-token divergence, differentiable
  advantage_B: jax.Array | None = None  # grpo: group-standardized reward of each response
  # cross-tokenizer runs: each token's span in its row (opd_jax.crosstok); teacher_logp_BxR is then the teacher's
  # log-prob of the token's whole span, and reverse_kl_pg compares it with the student's span total
  span_BxR: jax.Array | None = None
  # corrected boundaries (opd_jax.crosstok.cover): the student's cover corrections of its span totals, no gradient
  span_correction_BxR: jax.Array | None = None
  # marginal_span="chain": log q_S(c) and log q_T(c) of each token's first character c, no gradient
  first_logq_BxR: jax.Array | None = None
  teacher_first_logq_BxR: jax.Array | None = None


def _weights(x: LossInputs, c: ObjectiveConfig) -> jax.Array:
  return importance_weights(x.learner_logp_BxR, x.sampler_logp_BxR, c.importance, c.is_cap, x.mask_BxR,
                            (c.geo_lo, c.geo_hi))


def _weight_sums(weights_BxR):
  """Token means of w and w^2 (they add up over micro-batches); `effective_sample_size` reads them."""
  return {"is_weight": weights_BxR, "is_weight_sq": weights_BxR * weights_BxR}


def effective_sample_size(aux: dict) -> jax.Array | None:
  """ESS share (sum w)^2 / (N sum w^2) of the batch's importance weights from compute_loss's token means; None
  for objectives without weights."""
  if "is_weight" not in aux:
    return None
  return aux["is_weight"] ** 2 / jnp.maximum(aux["is_weight_sq"], 1e-30)


def _reverse_kl_pg(x: LossInputs, c: ObjectiveConfig):
  student_logp = x.learner_logp_BxR if c.student_logp == "learner" else x.sampler_logp_BxR
  if x.span_BxR is not None:  # span form: A_t = log pi_T(span of t) - log pi_S(span of t) (opd_jax.crosstok)
    student_logp = span_total(student_logp * x.mask_BxR, x.span_BxR, x.span_BxR)
    if x.span_correction_BxR is not None:  # character-level span log-probs at corrected boundaries
      student_logp = student_logp + x.span_correction_BxR
  advantage_BxR = jax.lax.stop_gradient(x.teacher_logp_BxR - student_logp)
  weights_BxR = _weights(x, c)
  return -weights_BxR * advantage_BxR * x.learner_logp_BxR, {"advantage": advantage_BxR, **_weight_sums(weights_BxR)}


def _grpo(x: LossInputs, c: ObjectiveConfig):
  if x.advantage_B is None:
    raise InputError("objective grpo needs rollouts with rewards (RolloutBatch.reward_B); the training loop "
                     "grades them")
  advantage_BxR = jax.lax.stop_gradient(x.advantage_B)[:, None] * x.mask_BxR
  weights_BxR = _weights(x, c)
  return -weights_BxR * advantage_BxR * x.learner_logp_BxR, _weight_sums(weights_BxR)


def _vocabulary(x: LossInputs, c: ObjectiveConfig):
  if x.divergence_BxR is None:
    raise InputError(f"objective {c.name} needs the per-token vocabulary divergence (LossInputs.divergence_BxR)")
  if x.span_BxR is None:
    return x.divergence_BxR, {}
  # Across tokenizers the divergence is measured where a span starts (both models predict its first characters
  # from the same text); a span's later tokens, which no teacher position predicts, take the span form's policy
  # gradient, so no sampled token goes without a signal. Spans of one token: the divergence alone.
  starts_BxR = span_starts(x.span_BxR)
  student_span_BxR = span_total(x.learner_logp_BxR * x.mask_BxR, x.span_BxR, x.span_BxR)
  if c.marginal_span == "chain":
    return _chain(x, starts_BxR, student_span_BxR)
  advantage_BxR = jax.lax.stop_gradient(x.teacher_logp_BxR - student_span_BxR)
  inside_BxR = -advantage_BxR * x.learner_logp_BxR
  return jnp.where(starts_BxR > 0, x.divergence_BxR, inside_BxR), {"span_start_share": starts_BxR}


def _chain(x: LossInputs, starts_BxR, student_span_BxR):
  """marginal_span="chain" (module docstring): the start's divergence plus the rest's policy gradient."""
  if x.first_logq_BxR is None or x.teacher_first_logq_BxR is None:
    raise InputError("objective.marginal_span='chain' needs the first characters' log q (LossInputs.first_logq_BxR "
                     "and teacher_first_logq_BxR), which the cross-tokenizer train step computes")
  if x.span_correction_BxR is not None:  # character-level span log-probs at corrected boundaries
    student_span_BxR = student_span_BxR + x.span_correction_BxR
  first_s_BxR, first_t_BxR = x.first_logq_BxR * starts_BxR, x.teacher_first_logq_BxR * starts_BxR
  # the first character's log-ratio, read at the span's start, spread to every token of its span
  first_ratio_BxR = span_total((first_t_BxR - first_s_BxR) * x.mask_BxR, x.span_BxR, x.span_BxR)
  rest_advantage_BxR = jax.lax.stop_gradient(x.teacher_logp_BxR - student_span_BxR - first_ratio_BxR)
  rest_BxR = -rest_advantage_BxR * x.learner_logp_BxR
  return jnp.where(starts_BxR > 0, x.divergence_BxR, 0.0) + rest_BxR, {
      "span_start_share": starts_BxR, "rest_advantage": rest_advantage_BxR}


_EXACT_BETA = {"reverse_kl": 1.0, "forward_kl": 0.0, "jsd": None}
_TOPK_BETA = {"reverse_kl_topk": 1.0, "forward_kl_topk": 0.0, "jsd_topk": None}
_TOPK_OF_EXACT = {"reverse_kl": "reverse_kl_topk", "forward_kl": "forward_kl_topk", "jsd": "jsd_topk"}
OBJECTIVES: dict[str, Callable] = {"reverse_kl_pg": _reverse_kl_pg, "grpo": _grpo,
                                   **{name: _vocabulary for name in (*_EXACT_BETA, *_TOPK_BETA, "uld")}}


def token_losses(inputs: LossInputs, config: ObjectiveConfig):
  """(loss term per token [B, R], dict of per-token diagnostics [B, R]); masked entries are ignored."""
  return OBJECTIVES[config.name](inputs, config)


def compute_loss(inputs: LossInputs, config: ObjectiveConfig, token_count: jax.Array | None = None):
  """(scalar loss, dict of scalar diagnostics): token sums over the mask divided by `token_count` (default:
  the mask's own count; a micro-batch passes the full batch's count so micro-batch losses add up)."""
  loss_BxR, aux = token_losses(inputs, config)
  count = jnp.maximum(jnp.sum(inputs.mask_BxR) if token_count is None else token_count, 1.0)
  total = lambda x_BxR: jnp.sum(x_BxR * inputs.mask_BxR) / count
  return total(loss_BxR), {k: total(v) for k, v in aux.items()}
