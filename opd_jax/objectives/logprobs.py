"""The one teacher-forced scoring path: logits and log-probs of a response given its prompt.

Legend: B batch, P prompt length (left-padded), R response length (right-padded), V vocab.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def response_logits(model, prompt_BxP, prompt_valid_BxP, response_BxR, response_mask_BxR) -> jax.Array:
  """Float32 logits [B, R, V]; row t is the distribution that predicts response token t."""
  P, R = prompt_BxP.shape[1], response_BxR.shape[1]
  tokens_BxT = jnp.concatenate([prompt_BxP, response_BxR], axis=1)
  valid_BxT = jnp.concatenate([prompt_valid_BxP.astype(bool), response_mask_BxR > 0], axis=1)
  return model(tokens_BxT, valid_BxT=valid_BxT, logits_span=(P - 1, P + R - 1))


def token_logprobs(logits_BxRxV, tokens_BxR, temperature: float = 1.0) -> jax.Array:
  """log softmax(logits / temperature) at the given tokens, [B, R]."""
  if temperature not in (0.0, 1.0):
    logits_BxRxV = logits_BxRxV / temperature
  logp_BxRxV = jax.nn.log_softmax(logits_BxRxV, axis=-1)
  return jnp.take_along_axis(logp_BxRxV, tokens_BxR[..., None].astype(jnp.int32), axis=-1)[..., 0]


def score(graphdef, state, prompt_BxP, prompt_valid_BxP, response_BxR, mask_BxR, temperature: float,
          return_logits: bool):
  """Teacher-forced log-probs of the response tokens (and the logits when asked)."""
  model = nnx.merge(graphdef, state)
  logits_BxRxV = response_logits(model, prompt_BxP, prompt_valid_BxP, response_BxR, mask_BxR)
  logp_BxR = token_logprobs(logits_BxRxV, response_BxR, temperature) * mask_BxR
  return logp_BxR, (logits_BxRxV if return_logits else None)
