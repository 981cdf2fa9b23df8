"""The one teacher-forced scoring path: hidden states, logits and log-probs of a response given its prompt.

Legend: B batch, P prompt length (left-padded), R response length (right-padded), D model width, V vocab,
K top-k.

Scoring never holds [B, R, V]: `score` runs the model to its final hidden states [B, R, D] and applies the LM
head chunk by chunk (`opd_jax.objectives.chunked`). What crosses the rollout -> learner boundary is per-token:
log-probs [B, R], optionally the top-k [B, R, K] and, for the exact full-vocabulary objectives, the final
hidden states [B, R, D] from which the learner recomputes the teacher's logits one chunk at a time.
`response_logits` (whole [B, R, V]) stays for small models, tests and supervised warm-up.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from opd_jax.objectives.chunked import score_tokens, tempered_log_softmax


def _response_inputs(prompt_BxP, prompt_valid_BxP, response_BxR, response_mask_BxR):
  tokens_BxT = jnp.concatenate([prompt_BxP, response_BxR], axis=1)
  valid_BxT = jnp.concatenate([prompt_valid_BxP.astype(bool), response_mask_BxR > 0], axis=1)
  P, R = prompt_BxP.shape[1], response_BxR.shape[1]
  return tokens_BxT, valid_BxT, (P - 1, P + R - 1)


def response_hidden(model, prompt_BxP, prompt_valid_BxP, response_BxR, response_mask_BxR,
                    layer_keep_L=None) -> jax.Array:
  """Final normed hidden states [B, R, D] (compute dtype); row t is what predicts response token t.
  layer_keep_L: see Decoder.hidden_states (layers marked False are skipped)."""
  tokens_BxT, valid_BxT, span = _response_inputs(prompt_BxP, prompt_valid_BxP, response_BxR, response_mask_BxR)
  return model.hidden_states(tokens_BxT, valid_BxT=valid_BxT, span=span, layer_keep_L=layer_keep_L)


def response_logits(model, prompt_BxP, prompt_valid_BxP, response_BxR, response_mask_BxR) -> jax.Array:
  """Float32 logits [B, R, V] (whole; for small vocabularies and tests)."""
  return model.logits(response_hidden(model, prompt_BxP, prompt_valid_BxP, response_BxR, response_mask_BxR))


def token_logprobs(logits_BxRxV, tokens_BxR, temperature: float = 1.0) -> jax.Array:
  """log softmax(logits / temperature) at the given tokens, [B, R]."""
  logp_BxRxV = tempered_log_softmax(logits_BxRxV, temperature)
  return jnp.take_along_axis(logp_BxRxV, tokens_BxR[..., None].astype(jnp.int32), axis=-1)[..., 0]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Scores:
  logp_BxR: jax.Array  # log-probs of the response tokens (0 where masked)
  hidden_BxRxD: jax.Array | None = None  # final hidden states, when asked (exact vocabulary objectives)
  top_logp_BxRxK: jax.Array | None = None  # top-k log-probs at top_k_temperature, when asked
  top_ids_BxRxK: jax.Array | None = None
  # cross-tokenizer marginal form, corrected boundaries: the hidden state one teacher token back at a span start
  prev_hidden_BxRxD: jax.Array | None = None


def score(graphdef, state, prompt_BxP, prompt_valid_BxP, response_BxR, mask_BxR, *, temperature: float,
          logits_chunk: int = 0, return_hidden: bool = False, top_k: int = 0,
          top_k_temperature: float = 1.0) -> Scores:
  """Teacher-forced log-probs of the response tokens, chunked over the response (see module docstring)."""
  model = nnx.merge(graphdef, state)
  hidden_BxRxD = response_hidden(model, prompt_BxP, prompt_valid_BxP, response_BxR, mask_BxR)
  out = score_tokens(model, hidden_BxRxD, response_BxR, temperature=temperature, chunk=logits_chunk,
                     top_k=top_k, top_k_temperature=top_k_temperature)
  return Scores(out["logp"] * mask_BxR, hidden_BxRxD if return_hidden else None, out.get("top_logp"),
                out.get("top_ids"))
