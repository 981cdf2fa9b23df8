"""Held-out evaluation: sample responses, grade final answers, and measure reverse KL to the teacher.

Legend: B batch, P prompt length, R response length, V vocab.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from opd_jax.data.batching import decode_responses, encode_prompts
from opd_jax.data.grader import is_correct
from opd_jax.data.task import Problem
from opd_jax.objectives.chunked import exact_reverse_kl
from opd_jax.objectives.logprobs import response_hidden
from opd_jax.rollout.sampler import Sampler
from opd_jax.train import distributed


def make_reverse_kl_fn(student_graphdef, teacher_graphdef, teacher_state, logits_chunk: int = 0):
  """Jitted (student_state, prompt, valid, response, mask) -> (sum over tokens of KL(S || T), token count).

  Exact over the vocabulary at each of the student's own sampled prefixes (temperature 1), computed from both
  models' final hidden states chunk by chunk (`logits_chunk` tokens at a time; 0 = all at once).
  """

  @jax.jit
  def reverse_kl(student_state, prompt_BxP, valid_BxP, response_BxR, mask_BxR):
    student = nnx.merge(student_graphdef, student_state)
    teacher = nnx.merge(teacher_graphdef, teacher_state)
    hidden = lambda model: response_hidden(model, prompt_BxP, valid_BxP, response_BxR, mask_BxR)
    kl_BxR = exact_reverse_kl(student, teacher, hidden(student), hidden(teacher), logits_chunk)
    return jnp.sum(kl_BxR * mask_BxR), jnp.sum(mask_BxR)

  return reverse_kl


def answer_reward_fn(tokenizer, problems: list[Problem]) -> Callable:
  """(index_B, tokens_BxR, mask_BxR) -> numpy reward_B: 1.0 where the response's final answer is correct for
  problems[index], else 0.0 (the same grader as held-out accuracy)."""

  def reward(index_B, tokens_BxR, mask_BxR) -> np.ndarray:
    texts = decode_responses(tokenizer, tokens_BxR, mask_BxR)
    return np.asarray([float(is_correct(text, problems[int(i)].answer)) for text, i in zip(texts, index_B)],
                      np.float32)

  return reward


def evaluate(sampler: Sampler, state, tokenizer, problems: list[Problem], *, max_prompt_tokens: int,
             batch_size: int, key: jax.Array, use_chat_template: bool = False,
             put: Callable = lambda x: x, reverse_kl_fn=None) -> dict[str, float]:
  """Accuracy (grader), mean response tokens and, given reverse_kl_fn, the token-mean KL(student || teacher).

  Problems are processed in batches of `batch_size` (the last one padded by repeating, then dropped);
  `put` places each input batch (e.g. onto a sharded mesh).
  """
  correct, lengths, kl_sum, kl_count = [], [], 0.0, 0.0
  for start in range(0, len(problems), batch_size):
    chunk = problems[start:start + batch_size]
    padded = chunk + [chunk[-1]] * (batch_size - len(chunk))
    prompts, valid = encode_prompts(tokenizer, padded, max_prompt_tokens, use_chat_template)
    prompts, valid = put(prompts), put(valid)
    key, sub = jax.random.split(key)
    out = sampler(state, prompts, valid, sub)
    if reverse_kl_fn is not None:
      weight = np.zeros((batch_size, 1), np.float32)
      weight[:len(chunk)] = 1.0
      total, count = reverse_kl_fn(state, prompts, valid, out.tokens_BxN, out.mask_BxN * put(weight))
      kl_sum, kl_count = kl_sum + float(total), kl_count + float(count)
    tokens, mask = distributed.to_host((out.tokens_BxN, out.mask_BxN))
    texts = decode_responses(tokenizer, tokens, mask)[:len(chunk)]
    correct += [is_correct(t, p.answer) for t, p in zip(texts, chunk)]
    lengths += list(np.asarray(mask).sum(1)[:len(chunk)])
  result = {"accuracy": float(np.mean(correct)), "response_tokens": float(np.mean(lengths))}
  if reverse_kl_fn is not None:
    result["reverse_kl"] = kl_sum / max(kl_count, 1.0)
  return result
