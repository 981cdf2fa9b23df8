"""What a top-k transport costs: bytes per token on the wire, and the loss / gradient error of the *_topk objective.

Legend: B rows, R response tokens, V vocab, K top-k.

`measure(cal, ks)`: on a calibration batch (the student's own temperature-1 samples of held-out prompts), the exact
reverse KL (the teacher's whole distribution, from its hidden states) against reverse_kl_topk with the teacher's K
most likely tokens plus a tail bin, for each K: relative error of the loss, and of the gradient (L2 norm of the
difference over the norm of the exact gradient; and their cosine), through the train step itself (plain SGD at
learning rate 1, so the update is the gradient). Bytes per token: the request and the vLLM-format response a served
teacher sends for these rows at that K (opd_jax.serving.protocol, decoded tokens included when the pair has a
tokenizer), divided by the response tokens scored; K = 0 is the sampled token's log-prob only (reverse_kl_pg), and
K = V (the whole distribution) is encoded for one position and scaled to a token.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax

from opd_jax.objectives.logprobs import score
from opd_jax.objectives.losses import ObjectiveConfig
from opd_jax.rollout.config import RolloutConfig
from opd_jax.serving import protocol
from opd_jax.train.step import RolloutBatch, TrainState, train_step


def _gradient_and_loss(cal, objective: ObjectiveConfig, batch: RolloutBatch):
  step = jax.jit(functools.partial(train_step, cal.graphdef, optax.sgd(1.0), objective, 1.0, 2.0,
                                   teacher_graphdef=cal.teacher_graphdef, logits_chunk=cal.logits_chunk,
                                   mismatch_metrics=False))
  state = TrainState(cal.params, optax.sgd(1.0).init(cal.params), jnp.zeros((), jnp.int32))
  new_state, metrics = step(state, batch, cal.teacher_state)
  gradient = jax.tree.map(lambda old, new: old - new, state.params, new_state.params)
  return float(metrics["loss"]), jnp.concatenate([g.reshape(-1) for g in jax.tree.leaves(gradient)])


def _wire_bytes(rows, logp, top_logp, top_ids, k: int, decode) -> int:
  request = protocol.completions_request("teacher", rows, k)
  rank = [np.zeros(len(r) - 1, np.int64) for r in rows]
  response = protocol.completions_response("teacher", rows, logp, top_logp, top_ids, rank, decode=decode)
  return len(json.dumps(request, separators=(",", ":"))) + len(json.dumps(response, separators=(",", ":")))


def measure(cal, ks: list[int], max_new_tokens: int, seed: int = 0) -> list[dict]:
  """One row per K (module docstring), K = 0 and K = V included."""
  out = cal.sample(RolloutConfig(max_new_tokens=max_new_tokens), cal.params, jax.random.key(seed))
  prompt, valid, tokens, mask = cal.prompt_BxP, cal.valid_BxP, out.tokens_BxN, out.mask_BxN
  V = cal.vocab_size
  host = [np.asarray(x) for x in (prompt, valid, tokens, mask)]
  rows = [protocol.row_tokens(*(x[b] for x in host)) for b in range(host[0].shape[0])]
  scored_tokens = int(host[3].sum())
  decode = (lambda t: cal.tokenizer.convert_ids_to_tokens(t)) if hasattr(cal.tokenizer, "convert_ids_to_tokens") \
      else None
  teacher = score(cal.teacher_graphdef, cal.teacher_state, prompt, valid, tokens, mask, temperature=1.0,
                  logits_chunk=cal.logits_chunk, return_hidden=True)
  batch = RolloutBatch(jnp.asarray(prompt), jnp.asarray(valid), tokens, mask, out.logprobs_BxN, teacher.logp_BxR,
                       teacher_hidden_BxRxD=teacher.hidden_BxRxD)
  exact_loss, exact_grad = _gradient_and_loss(cal, ObjectiveConfig(name="reverse_kl"), batch)
  results = []
  for k in sorted(set(ks) | {0, V}):
    row = {"k": k, "vocab_size": V, "rows": len(rows), "scored_tokens": scored_tokens}
    if k == V:  # one position of the whole distribution, scaled to a token
      ids = np.arange(V)[None]
      one = [[rows[0][0], rows[0][1]]]
      row["bytes_per_token"] = _wire_bytes(one, [np.zeros(1, np.float32)], [np.full((1, V), -10.123456, np.float32)],
                                           [ids], V, decode)
    else:
      full = score(cal.teacher_graphdef, cal.teacher_state, prompt, valid, tokens, mask, temperature=1.0,
                   logits_chunk=cal.logits_chunk, top_k=max(k, 1))
      lp, tl, ti = (np.asarray(x) for x in (full.logp_BxR, full.top_logp_BxRxK, full.top_ids_BxRxK))
      per_row = [_row_arrays(lp[b], tl[b, :, :k], ti[b, :, :k], host, b) for b in range(len(rows))]
      row["bytes_per_token"] = _wire_bytes(rows, *map(list, zip(*per_row)), k, decode) / scored_tokens
    if 0 < k:
      topk = score(cal.teacher_graphdef, cal.teacher_state, prompt, valid, tokens, mask, temperature=1.0,
                   logits_chunk=cal.logits_chunk, top_k=k)
      batch_k = dataclasses.replace(batch, teacher_hidden_BxRxD=None, teacher_top_logprobs_BxRxK=topk.top_logp_BxRxK,
                                    teacher_top_ids_BxRxK=topk.top_ids_BxRxK)
      loss, grad = _gradient_and_loss(cal, ObjectiveConfig(name="reverse_kl_topk", top_k=k), batch_k)
      norm = float(jnp.linalg.norm(exact_grad))
      row.update(loss=loss, exact_loss=exact_loss, loss_rel_error=abs(loss - exact_loss) / abs(exact_loss),
                 grad_rel_error=float(jnp.linalg.norm(grad - exact_grad)) / norm,
                 grad_cosine=float(jnp.dot(grad, exact_grad) / (jnp.linalg.norm(grad) * norm)))
    results.append(row)
  return results


def _row_arrays(logp_R, top_logp_RxK, top_ids_RxK, host, b):
  """A row's arrays over its prompt + response positions 1.. (the prompt's own positions: zeros; their bytes are
  the same kind of entries, and a served request scores them too)."""
  prompt_len, n = int(host[1][b].sum()), int(host[3][b].sum())
  positions = prompt_len - 1 + n
  logp = np.zeros(positions, np.float32)
  top_logp = np.full((positions, top_logp_RxK.shape[1]), -10.123456, np.float32)
  top_ids = np.tile(np.arange(top_ids_RxK.shape[1]), (positions, 1))
  logp[prompt_len - 1:] = logp_R[:n]
  top_logp[prompt_len - 1:], top_ids[prompt_len - 1:] = top_logp_RxK[:n], top_ids_RxK[:n]
  return logp, top_logp, top_ids

