"""The learner: a pure, jitted OPD train step with explicit shardings.

Legend: B batch, M micro-batch, P prompt length, R response length, C chunk length, D model width,
V vocab, K top-k.

Memory: the step never holds a whole [B, R, V] tensor. The learner runs to its final hidden states [M, R, D]
and everything over the vocabulary -- log-probs of the sampled tokens, the objective's per-token divergence
(teacher logits recomputed from the teacher's hidden states with the teacher's head, or the teacher's top-k),
vocabulary mismatch metrics -- runs over chunks of `logits_chunk` tokens inside a rematerialized scan
(`opd_jax.objectives.chunked`). `micro_batch_size` splits the batch into micro-batches whose gradients are
accumulated in a scan; every loss term is divided by the whole batch's token count, so the accumulated update
equals the full-batch update.

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
import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from opd_jax.errors import InputError
from opd_jax.mismatch.metrics import token_mean, token_metrics, vocab_divergences_topk_per_token
from opd_jax.objectives.chunked import gather_logp, merge_rows, split_rows, tempered_log_softmax, token_map
from opd_jax.objectives.logprobs import response_hidden
from opd_jax.objectives.losses import (LossInputs, ObjectiveConfig, compute_loss, divergence_exact,
                                       divergence_topk, divergence_uld, effective_sample_size,
                                       group_advantages, masked_mean)
from opd_jax.objectives.marginal import first_character_logq, marginal_kl, marginals
from opd_jax.objectives.spans import cover_delta, span_corrections, span_total


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
  teacher_hidden_BxRxD: jax.Array | None = None  # exact vocabulary objectives: teacher's final hidden states
  teacher_top_logprobs_BxRxK: jax.Array | None = None  # *_topk objectives: teacher's top-k at objective temp.
  teacher_top_ids_BxRxK: jax.Array | None = None
  sampler_top_logprobs_BxRxK: jax.Array | None = None
  sampler_top_ids_BxRxK: jax.Array | None = None
  snapshot_logp_BxR: jax.Array | None = None
  reward_B: jax.Array | None = None  # grader reward of each response (grpo; rows grouped by prompt)
  teacher_route_BxN: jax.Array | None = None  # multi-teacher runs: one-hot float of each row's teacher
  version_lag_BxR: jax.Array | None = None  # in-flight updates: learner step - the version that drew each token
  span_BxR: jax.Array | None = None  # cross-tokenizer runs: each token's span in its row (LossInputs.span_BxR)
  # cross-tokenizer marginal form: 1 where the teacher's token merged its response prefix (opd_jax.crosstok.view)
  after_prefix_BxR: jax.Array | None = None
  # cross-tokenizer span form with corrected boundaries: the student's covers (view.student_cover_BxRx4)
  span_cover_BxRx4: jax.Array | None = None
  # cross-tokenizer marginal form with corrected boundaries: both sides' last-token covers at span starts after a
  # corrected boundary (view.marginal_cover_BxRx6), and the teacher's hidden state one token back there
  marginal_cover_BxRx6: jax.Array | None = None
  teacher_prev_hidden_BxRxD: jax.Array | None = None

  @classmethod
  def abstract(cls, rows, *, batch: int, prompt: int, response: int, teacher_hidden: tuple[int, jnp.dtype] | None,
               teacher_k: int, sampler_k: int, snapshot: bool, span: bool = False,
               after_prefix: bool = False, span_cover: bool = False, marginal_cover: bool = False
               ) -> "RolloutBatch":
    """The batch's shapes and dtypes (jax.ShapeDtypeStruct, rows sharded by `rows`), for compiling a step before
    any rollout exists (the memory planner). teacher_hidden: (D, dtype) for exact vocabulary objectives;
    teacher_k / sampler_k: top-k widths (0 = absent); snapshot: the mismatch split's snapshot log-probs; span: a
    cross-tokenizer teacher's spans; after_prefix: the marginal form's response-prefix positions; span_cover: the
    student's covers of corrected boundaries; marginal_cover: the marginal form's at corrected boundaries (with the
    teacher's hidden states one token back)."""
    def a(shape, dtype):
      return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=rows)
    B, P, R = batch, prompt, response
    return cls(
        prompt_BxP=a((B, P), jnp.int32), prompt_valid_BxP=a((B, P), jnp.bool_), response_BxR=a((B, R), jnp.int32),
        mask_BxR=a((B, R), jnp.float32), sampler_logp_BxR=a((B, R), jnp.float32),
        teacher_logp_BxR=a((B, R), jnp.float32),
        teacher_hidden_BxRxD=a((B, R, teacher_hidden[0]), teacher_hidden[1]) if teacher_hidden else None,
        teacher_top_logprobs_BxRxK=a((B, R, teacher_k), jnp.float32) if teacher_k else None,
        teacher_top_ids_BxRxK=a((B, R, teacher_k), jnp.int32) if teacher_k else None,
        sampler_top_logprobs_BxRxK=a((B, R, sampler_k), jnp.float32) if sampler_k else None,
        sampler_top_ids_BxRxK=a((B, R, sampler_k), jnp.int32) if sampler_k else None,
        snapshot_logp_BxR=a((B, R), jnp.float32) if snapshot else None,
        span_BxR=a((B, R), jnp.int32) if span else None,
        after_prefix_BxR=a((B, R), jnp.float32) if after_prefix else None,
        span_cover_BxRx4=a((B, R, 4), jnp.int32) if span_cover else None,
        marginal_cover_BxRx6=a((B, R, 6), jnp.int32) if marginal_cover else None,
        teacher_prev_hidden_BxRxD=a((B, R, teacher_hidden[0]), teacher_hidden[1]) if marginal_cover else None)


def _prefixed(prefix: str, metrics: dict) -> dict:
  return {f"{prefix}/{k}": v for k, v in metrics.items()}


def _per_teacher(names: tuple[str, ...], learner_logp_BxR, teacher_logp_BxR, mask_BxR, route_BxN) -> dict:
  """Per teacher of a routed batch, over its rows' tokens: k1 and k3 estimates of KL(student || teacher) (the
  learner's log-probs against the teacher's, at the sampled tokens) and the token count."""
  out = {}
  for n, name in enumerate(names):
    mine_BxR = mask_BxR * route_BxN[:, n:n + 1]
    kl = token_metrics(teacher_logp_BxR, learner_logp_BxR, mine_BxR)
    out.update({f"teachers/{name}/reverse_kl": kl["k1"], f"teachers/{name}/k3": kl["k3"],
                f"teachers/{name}/tokens": jnp.sum(mine_BxR)})
  return out


def _learner_forward(graphdef, objective: ObjectiveConfig, temperature: float, logits_chunk: int, teacher,
                     vocab_metrics: bool, events, rank_V, params, batch: RolloutBatch):
  """Per-token learner quantities of one (micro-)batch, [B, R] each: "logp" (differentiable), "divergence"
  (vocabulary objectives, differentiable), "vocab/*" mismatch terms and "cover_delta" (no gradient). events: a
  cross-tokenizer teacher's common events (the full-distribution form, opd_jax.crosstok.projection), or None.
  rank_V: the student vocabulary's cover ranks when the batch has covers (opd_jax.crosstok.cover), or None."""
  model = nnx.merge(graphdef, params)
  arrays = {"hidden": response_hidden(model, batch.prompt_BxP, batch.prompt_valid_BxP, batch.response_BxR,
                                      batch.mask_BxR),
            "tokens": batch.response_BxR}
  if objective.needs_teacher_hidden:
    arrays["teacher_hidden"] = batch.teacher_hidden_BxRxD
    if batch.after_prefix_BxR is not None:
      arrays["after_prefix"] = batch.after_prefix_BxR
  corrected = events is not None and len(events) > 4 and batch.marginal_cover_BxRx6 is not None
  if corrected:  # the student's hidden state one token back, the teacher's (shipped), both last tokens' covers
    arrays["prev_hidden"] = jnp.pad(arrays["hidden"], ((0, 0), (1, 0), (0, 0)))[:, :-1]
    arrays["teacher_prev_hidden"] = batch.teacher_prev_hidden_BxRxD
    arrays["marginal_cover"] = batch.marginal_cover_BxRx6
  if objective.needs_teacher_topk:
    arrays["teacher_top_logp"] = batch.teacher_top_logprobs_BxRxK
    arrays["teacher_top_ids"] = batch.teacher_top_ids_BxRxK
  if vocab_metrics:
    arrays["sampler_top_logp"] = batch.sampler_top_logprobs_BxRxK
    arrays["sampler_top_ids"] = batch.sampler_top_ids_BxRxK
  covers = rank_V is not None and batch.span_cover_BxRx4 is not None
  if covers:
    arrays["cover"] = batch.span_cover_BxRx4[..., :2]
  beta, t = objective.vocab_beta, objective.temperature

  def per_chunk(x):
    logits_BxCxV = model.logits(x["hidden"])
    logp_BxCxV = tempered_log_softmax(logits_BxCxV, temperature)
    out = {"logp": gather_logp(logp_BxCxV, x["tokens"])}
    if covers:
      out["cover_delta"] = jax.lax.stop_gradient(cover_delta(logp_BxCxV, x["tokens"], x["cover"], rank_V))
    if objective.needs_teacher_hidden:
      teacher_logits_BxCxV = jax.lax.stop_gradient(teacher.logits(x["teacher_hidden"]))
      character = None if not corrected else (
          model.logits(x["prev_hidden"]), jax.lax.stop_gradient(teacher.logits(x["teacher_prev_hidden"])),
          x["marginal_cover"], rank_V)
      if events is None:
        out["divergence"] = divergence_exact(logits_BxCxV, teacher_logits_BxCxV, beta, t)
      else:
        q_s, q_t = marginals(logits_BxCxV, teacher_logits_BxCxV, events, t, x.get("after_prefix"), character)
        out["divergence"] = marginal_kl(q_s, q_t)
        if objective.marginal_span == "chain":  # the sampled token's first character, for the rest of its span
          first = first_character_logq(jax.lax.stop_gradient(q_s), q_t, events[0], x["tokens"])
          out["first_logq"], out["teacher_first_logq"] = first
    if objective.name == "uld":
      out["divergence"] = divergence_uld(logits_BxCxV, x["teacher_top_logp"], t)
    elif objective.needs_teacher_topk:
      out["divergence"] = divergence_topk(logits_BxCxV, x["teacher_top_logp"], x["teacher_top_ids"], beta, t)
    if vocab_metrics:  # compared at temperature 1 (what the sampler's top-k log-probs are)
      out.update({f"vocab/{k}": v for k, v in vocab_divergences_topk_per_token(
          jax.lax.stop_gradient(logits_BxCxV), x["sampler_top_logp"], x["sampler_top_ids"]).items()})
    return out

  return token_map(per_chunk, arrays, logits_chunk)


def train_step(graphdef, optimizer: optax.GradientTransformation, objective: ObjectiveConfig,
               temperature: float, is_cap: float, state: TrainState, batch: RolloutBatch, teacher_state=None, *,
               teacher_graphdef=None, logits_chunk: int = 0, micro_batch_size: int = 0,
               mismatch_metrics: bool = True, teacher_names: tuple[str, ...] = (),
               projection: tuple | None = None, cover_rank=None, teacher_cover_rank=None):
  """One update (bind everything before `state` and the keyword options with functools.partial, then jit).

  teacher_state / teacher_graphdef: the fixed teacher, needed by the exact vocabulary objectives (its head turns
  the batch's teacher hidden states into logits chunk by chunk). logits_chunk: tokens (rows x positions) per
  vocabulary chunk (0 = all at once). micro_batch_size: rows per gradient-accumulation micro-batch (0 = the whole
  batch). mismatch_metrics=False drops the mismatch families (benchmarks measure their cost). teacher_names: the
  teachers of a multi-teacher run, in the order of the batch's teacher_route_BxN columns (per-teacher metrics).
  projection: a cross-tokenizer teacher's common events (opd_jax.crosstok.projection.character_events; the exact
  vocabulary objectives then compare both distributions marginalized onto them, at span starts). cover_rank: the
  student vocabulary's cover ranks (opd_jax.crosstok.cover) with corrected boundaries: the span form's student
  span totals then get the student's cover corrections at the batch's span_cover_BxRx4. teacher_cover_rank: the
  teacher's, for the marginal form at corrected boundaries (projection then has its offset tables).
  """
  mask = batch.mask_BxR
  B = mask.shape[0]
  M = micro_batch_size or B
  if B % M:
    raise InputError(f"train.micro_batch_size={M} does not divide the batch of {B} responses")
  if objective.needs_teacher_hidden and (teacher_state is None or teacher_graphdef is None
                                         or batch.teacher_hidden_BxRxD is None):
    raise InputError(f"objective {objective.name} needs the teacher (teacher_state, teacher_graphdef) and the "
                     "batch's teacher_hidden_BxRxD")
  teacher = nnx.merge(teacher_graphdef, teacher_state) if objective.needs_teacher_hidden else None
  vocab_metrics = mismatch_metrics and batch.sampler_top_logprobs_BxRxK is not None
  advantage_B = None if batch.reward_B is None else group_advantages(batch.reward_B, objective.group_size)
  token_count = jnp.sum(mask)
  events = None if projection is None else (
      jnp.asarray(projection[0], jnp.int32), jnp.asarray(projection[1], jnp.int32), projection[2],
      None if len(projection) < 4 or projection[3] is None else jnp.asarray(projection[3], jnp.int32))
  if events is not None and len(projection) > 4:  # offset tables, and the teacher's ranks beside them
    events = events + (tuple(jnp.asarray(t, jnp.int32) for t in projection[4]) + (
        jnp.asarray(teacher_cover_rank, jnp.int32),),)
  rank_V = None if cover_rank is None else jnp.asarray(cover_rank, jnp.int32)
  forward = functools.partial(_learner_forward, graphdef, objective, temperature, logits_chunk, teacher,
                              vocab_metrics, events, rank_V)
  loss, aux, grads, per_token = _gradients(forward, objective, state.params, batch, advantage_B, token_count, M)
  learner_logp_BxR = per_token.pop("learner_logp")
  new_state, update = _guarded_update(optimizer, objective, state, loss, aux, grads)
  metrics = _learner_metrics(objective, batch, loss, aux, update, advantage_B, learner_logp_BxR, teacher_names,
                             per_token.pop("span_correction", None))
  if mismatch_metrics:
    metrics.update(_mismatch_metrics(batch, learner_logp_BxR, per_token, is_cap, vocab_metrics))
  return new_state, metrics


def _gradients(forward, objective: ObjectiveConfig, params, batch: RolloutBatch, advantage_B, token_count, M: int):
  """(loss, aux, grads, per-token values) of the whole batch, M rows at a time (summed; the loss is normalized
  by the whole batch's token_count, so the sum is the whole batch's loss)."""
  def loss_fn(params, micro: RolloutBatch, micro_advantage_B):
    per_token = forward(params, micro)
    learner_logp_BxR = per_token.pop("logp") * micro.mask_BxR
    correction_BxR = None
    if "cover_delta" in per_token:  # the student's cover corrections of its span totals (opd_jax.crosstok.cover)
      correction_BxR = span_corrections(per_token.pop("cover_delta") * micro.mask_BxR, micro.span_cover_BxRx4,
                                        micro.span_BxR)
      per_token["span_correction"] = correction_BxR
    inputs = LossInputs(learner_logp_BxR, micro.sampler_logp_BxR, micro.teacher_logp_BxR, micro.mask_BxR,
                        per_token.pop("divergence", None), micro_advantage_B, micro.span_BxR, correction_BxR,
                        per_token.pop("first_logq", None), per_token.pop("teacher_first_logq", None))
    loss, aux = compute_loss(inputs, objective, token_count)
    per_token["learner_logp"] = learner_logp_BxR
    return loss, (aux, jax.lax.stop_gradient(per_token))

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if M == batch.mask_BxR.shape[0]:
    (loss, (aux, per_token)), grads = grad_fn(params, batch, advantage_B)
    return loss, aux, grads, per_token
  micro_batches = split_rows((batch, advantage_B), M)
  first = jax.tree.map(lambda x: x[0], micro_batches)
  (loss0, (aux0, _)), grads0 = jax.eval_shape(grad_fn, params, *first)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (loss0, aux0, grads0))

  def accumulate(total, micro):
    (loss, (aux, per_token)), grads = grad_fn(params, *micro)
    return jax.tree.map(jnp.add, total, (loss, aux, grads)), per_token

  (loss, aux, grads), per_token = jax.lax.scan(accumulate, zeros, micro_batches)
  return loss, aux, grads, merge_rows(per_token)


def _guarded_update(optimizer: optax.GradientTransformation, objective: ObjectiveConfig, state: TrainState, loss,
                    aux: dict, grads) -> tuple[TrainState, dict]:
  """The optimizer's update, applied only when the loss and gradient are finite (and the importance weights'
  ESS share reaches objective.min_ess); else the state stays as it was. Returns it and what decided."""
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  ess = effective_sample_size(aux)
  aux.pop("is_weight_sq", None)
  apply = finite & (ess >= objective.min_ess) if ess is not None and objective.min_ess else finite
  updates, new_opt_state = optimizer.update(grads, state.opt_state, state.params)
  new_params = optax.apply_updates(state.params, updates)
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(apply, n, o), new, old)
  new_state = TrainState(keep(new_params, state.params), keep(new_opt_state, state.opt_state),
                         state.step + apply.astype(jnp.int32))
  return new_state, {"grad_norm": grad_norm, "finite": finite, "ess": ess, "apply": apply}


def _learner_metrics(objective: ObjectiveConfig, batch: RolloutBatch, loss, aux: dict, update: dict, advantage_B,
                     learner_logp_BxR, teacher_names: tuple[str, ...], span_correction_BxR=None) -> dict:
  """The step's loss, update and OPD metrics (and per teacher, in a routed run). span_correction_BxR: the
  student's cover corrections with corrected boundaries (the k1 estimate compares character-level spans)."""
  mask, teacher_logp_BxR = batch.mask_BxR, batch.teacher_logp_BxR
  if span_correction_BxR is not None:
    teacher_logp_BxR = teacher_logp_BxR - span_correction_BxR
  if batch.span_BxR is not None:  # a span's teacher log-prob, shared evenly by its student tokens
    teacher_logp_BxR = teacher_logp_BxR / jnp.maximum(span_total(mask, batch.span_BxR, batch.span_BxR), 1.0)
  metrics = {
      "loss": loss,
      "grad_norm": update["grad_norm"],
      "skipped": 1.0 - update["finite"].astype(jnp.float32),  # non-finite (the loop stops after max_skipped_steps)
      "response_tokens": jnp.sum(mask) / mask.shape[0],
      # k1 estimate of KL(student || teacher) on the student's own samples: what OPD minimizes.
      "opd/reverse_kl": masked_mean(learner_logp_BxR - teacher_logp_BxR, mask),
      **{f"opd/{k}": v for k, v in aux.items()},
  }
  if update["ess"] is not None:
    metrics["opd/is_ess"] = update["ess"]
    if objective.min_ess:
      metrics["skipped_low_ess"] = (update["finite"] & ~update["apply"]).astype(jnp.float32)
  if objective.name == "grpo" and advantage_B is not None:
    metrics["opd/zero_advantage_fraction"] = jnp.mean((jnp.abs(advantage_B) < 1e-3).astype(jnp.float32))
  if batch.reward_B is not None:
    metrics["rollout/reward"] = jnp.mean(batch.reward_B)
  if batch.teacher_route_BxN is not None:
    metrics.update(_per_teacher(teacher_names, learner_logp_BxR, batch.teacher_logp_BxR, mask,
                                batch.teacher_route_BxN))
  return metrics


def _mismatch_metrics(batch: RolloutBatch, learner_logp_BxR, per_token: dict, is_cap: float,
                      vocab_metrics: bool) -> dict:
  """Sampler against learner on the one scale: per token, over the vocabulary (the sampler's top-k), and split
  into precision and staleness factors where the batch carries the dense snapshot's log-probs."""
  mask = batch.mask_BxR
  metrics = _prefixed("mismatch", token_metrics(learner_logp_BxR, batch.sampler_logp_BxR, mask, is_cap))
  if vocab_metrics:
    metrics.update(_prefixed("mismatch_vocab", token_mean(
        {k.removeprefix("vocab/"): v for k, v in per_token.items() if k.startswith("vocab/")}, mask)))
  if batch.version_lag_BxR is not None:  # in-flight updates: the mismatch of the tokens each version lag drew
    lag_BxR = batch.version_lag_BxR
    metrics["mismatch/token_version_lag"] = token_mean({"lag": lag_BxR}, mask)["lag"]
    for lag, name in ((0, "0"), (1, "1"), (2, "2"), (3, "3+")):
      in_bucket = mask * ((lag_BxR >= lag) if name.endswith("+") else (lag_BxR == lag))
      metrics[f"mismatch_lag/tokens_lag{name}"] = jnp.sum(in_bucket) / jnp.maximum(jnp.sum(mask), 1.0)
      metrics[f"mismatch_lag/k3_lag{name}"] = token_metrics(learner_logp_BxR, batch.sampler_logp_BxR, in_bucket,
                                                           is_cap)["k3"]
  if batch.snapshot_logp_BxR is not None:
    precision = token_metrics(batch.snapshot_logp_BxR, batch.sampler_logp_BxR, mask, is_cap)
    staleness = token_metrics(learner_logp_BxR, batch.snapshot_logp_BxR, mask, is_cap)
    metrics.update({"mismatch_split/precision_k3": precision["k3"], "mismatch_split/staleness_k3": staleness["k3"],
                    "mismatch_split/precision_k1": precision["k1"], "mismatch_split/staleness_k1": staleness["k1"]})
  return metrics
