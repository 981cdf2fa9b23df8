"""Held-out evaluation: sample responses, grade the final answers."""

from __future__ import annotations

import jax
import numpy as np

from opd_jax.data.batching import decode_responses, encode_prompts
from opd_jax.data.grader import is_correct
from opd_jax.data.task import Problem
from opd_jax.rollout.sampler import Sampler


def accuracy(sampler: Sampler, state, tokenizer, problems: list[Problem], *, max_prompt_tokens: int,
             batch_size: int, key: jax.Array, use_chat_template: bool = False) -> dict[str, float]:
  """Grader accuracy and mean response length of `sampler` on `problems` (batched; last batch padded)."""
  correct, lengths = [], []
  for start in range(0, len(problems), batch_size):
    chunk = problems[start:start + batch_size]
    padded = chunk + [chunk[-1]] * (batch_size - len(chunk))
    prompts, valid = encode_prompts(tokenizer, padded, max_prompt_tokens, use_chat_template)
    key, sub = jax.random.split(key)
    out = jax.device_get(sampler(state, prompts, valid, sub))
    texts = decode_responses(tokenizer, out.tokens_BxN, out.mask_BxN)[:len(chunk)]
    correct += [is_correct(t, p.answer) for t, p in zip(texts, chunk)]
    lengths += list(np.asarray(out.mask_BxN).sum(1)[:len(chunk)])
  return {"accuracy": float(np.mean(correct)), "response_tokens": float(np.mean(lengths))}
