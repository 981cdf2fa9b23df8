"""The learner: a pure, jitted OPD train step with explicit shardings, plus the teacher scoring function.

Legend: B batch, P prompt length, R response length, V vocab, K sampler top-k.

Every batch's sampler-vs-learner mismatch metrics (token level and, when the sampler returned its top-k
log-probs, vocabulary level) are computed inside the step from the learner's own forward pass: no extra host
syncs. When the batch carries `snapshot_logp_BxR` (the un-quantized, noise-free learner at the version that
generated the batch), the total log-ratio log pi/mu is split into a precision/noise factor
(snapshot vs sampler) and a staleness factor (current learner vs snapshot). The k1 parts add up exactly to the
total k1; the k3 of each part is only approximate, since the tokens come from mu, not from the snapshot.

A step whose loss or gradient norm is not finite leaves parameters and optimizer state untouched and reports
`skipped = 1`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from opd_jax.mismatch.metrics import token_metrics, vocab_metrics_topk
from opd_jax.objectives.logprobs import response_logits, token_logprobs
from opd_jax.objectives.losses import LossInputs, ObjectiveConfig, compute_loss, group_advantages, masked_mean


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
  params: nnx.State
  opt_state: optax.OptState
  step: jax.Array  # int32: number of updates applied (= learner version)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class RolloutBatch:
  prompt_BxP: jax.Array
  prompt_valid_BxP: jax.Array
  response_BxR: jax.Array
  mask_BxR: jax.Array
  sampler_logp_BxR: jax.Array
  teacher_logp_BxR: jax.Array
  teacher_logits_BxRxV: jax.Array | None = None
  sampler_top_logprobs_BxRxK: jax.Array | None = None
  sampler_top_ids_BxRxK: jax.Array | None = None
  snapshot_logp_BxR: jax.Array | None = None
  reward_B: jax.Array | None = None  # grader reward of each response (grpo; rows grouped by prompt)


def _prefixed(prefix: str, metrics: dict) -> dict:
  return {f"{prefix}/{k}": v for k, v in metrics.items()}


def train_step(graphdef, optimizer: optax.GradientTransformation, objective: ObjectiveConfig,
               temperature: float, is_cap: float, state: TrainState, batch: RolloutBatch,
               mismatch_metrics: bool = True):
  """One update. mismatch_metrics=False drops the mismatch families (benchmarks measure their cost)."""
  mask = batch.mask_BxR
  advantage_B = None if batch.reward_B is None else group_advantages(batch.reward_B, objective.group_size)

  def loss_fn(params):
    model = nnx.merge(graphdef, params)
    logits_BxRxV = response_logits(model, batch.prompt_BxP, batch.prompt_valid_BxP, batch.response_BxR, mask)
    learner_logp_BxR = token_logprobs(logits_BxRxV, batch.response_BxR, temperature) * mask
    inputs = LossInputs(logits_BxRxV, learner_logp_BxR, batch.sampler_logp_BxR, batch.teacher_logp_BxR,
                        batch.teacher_logits_BxRxV, mask, advantage_B)
    loss, aux = compute_loss(inputs, objective)
    return loss, (aux, logits_BxRxV, learner_logp_BxR)

  (loss, (aux, logits_BxRxV, learner_logp_BxR)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  updates, new_opt_state = optimizer.update(grads, state.opt_state, state.params)
  new_params = optax.apply_updates(state.params, updates)
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
  new_state = TrainState(keep(new_params, state.params), keep(new_opt_state, state.opt_state),
                         state.step + finite.astype(jnp.int32))

  learner_logp_BxR = jax.lax.stop_gradient(learner_logp_BxR)
  metrics = {
      "loss": loss,
      "grad_norm": grad_norm,
      "skipped": 1.0 - finite.astype(jnp.float32),
      "response_tokens": jnp.sum(mask) / mask.shape[0],
      # k1 estimate of KL(student || teacher) on the student's own samples: what OPD minimizes.
      "opd/reverse_kl": masked_mean(learner_logp_BxR - batch.teacher_logp_BxR, mask),
      **{f"opd/{k}": v for k, v in aux.items()},
  }
  if batch.reward_B is not None:
    metrics["rollout/reward"] = jnp.mean(batch.reward_B)
  if not mismatch_metrics:
    return new_state, metrics
  metrics.update(_prefixed("mismatch", token_metrics(learner_logp_BxR, batch.sampler_logp_BxR, mask, is_cap)))
  if batch.sampler_top_logprobs_BxRxK is not None:
    # Vocabulary metrics compare distributions at temperature 1 (what the sampler's top-k log-probs are).
    metrics.update(_prefixed("mismatch_vocab", vocab_metrics_topk(
        jax.lax.stop_gradient(logits_BxRxV), batch.sampler_top_logprobs_BxRxK, batch.sampler_top_ids_BxRxK,
        mask)))
  if batch.snapshot_logp_BxR is not None:
    precision = token_metrics(batch.snapshot_logp_BxR, batch.sampler_logp_BxR, mask, is_cap)
    staleness = token_metrics(learner_logp_BxR, batch.snapshot_logp_BxR, mask, is_cap)
    metrics.update({"mismatch_split/precision_k3": precision["k3"], "mismatch_split/staleness_k3": staleness["k3"],
                    "mismatch_split/precision_k1": precision["k1"], "mismatch_split/staleness_k1": staleness["k1"]})
  return new_state, metrics
