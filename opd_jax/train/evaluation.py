"""Held-out evaluation: sample responses, grade answers, and measure KL to the teacher.

Legend: B batch, P prompt length, R response length, V vocab.

Quantities (token means over the responses' real tokens, exact over the vocabulary, temperature 1):
  reverse_kl          KL(student || teacher) at the student's own sampled prefixes: what OPD minimizes.
  teacher_forced_kl   KL(teacher || student) at the teacher's own greedy responses: how well the student
                      predicts the teacher where the teacher leads (the quantity supervised distillation fits).
  accuracy            share of the problems that carry an answer graded correct (none: not reported).
Teacher and student weights are arguments of every jitted function here, never captured constants.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from opd_jax.data.batching import decode_responses, encode_prompts
from opd_jax.data.grader import is_correct
from opd_jax.data.task import Problem
from opd_jax.errors import InputError
from opd_jax.models import sharding as shard_lib
from opd_jax.objectives.chunked import exact_reverse_kl, row_map
from opd_jax.objectives.logprobs import response_hidden
from opd_jax.rollout.sampler import Sampler
from opd_jax.train import distributed

KL_DIRECTIONS = ("reverse", "forward")


def make_kl_fn(student_graphdef, teacher_graphdef, logits_chunk: int = 0, direction: str = "reverse",
               micro_batch_size: int = 0, mesh=None):
  """Jitted (student_state, teacher_state, prompt, valid, response, mask) -> (sum over tokens of the KL, token
  count); direction "reverse" is KL(student || teacher), "forward" KL(teacher || student).

  Exact over the vocabulary at each response prefix, computed from both models' final hidden states chunk by
  chunk (`logits_chunk` tokens at a time; 0 = all at once), `micro_batch_size` rows at a time (0 = all); with
  the learner's mesh, logit chunks stay batch-sharded (shard_lib.constrain_batch).
  """
  if direction not in KL_DIRECTIONS:
    raise ValueError(f"direction must be one of {KL_DIRECTIONS}, got {direction!r}")

  def kl(student_state, teacher_state, prompt_BxP, valid_BxP, response_BxR, mask_BxR):
    student = nnx.merge(student_graphdef, student_state)
    teacher = nnx.merge(teacher_graphdef, teacher_state)
    first, second = (student, teacher) if direction == "reverse" else (teacher, student)

    def per_row(prompt_BxP, valid_BxP, response_BxR, mask_BxR):
      hidden = lambda model: response_hidden(model, prompt_BxP, valid_BxP, response_BxR, mask_BxR)
      return exact_reverse_kl(first, second, hidden(first), hidden(second), logits_chunk)

    kl_BxR = row_map(per_row, (prompt_BxP, valid_BxP, response_BxR, mask_BxR), micro_batch_size)
    return jnp.sum(kl_BxR * mask_BxR), jnp.sum(mask_BxR)

  return jax.jit(shard_lib.with_activations_on(mesh, kl))


REPEAT_NGRAM = 8  # a response "repeats itself" when some run of this many tokens occurs in it twice


def repeats(tokens_N) -> bool:
  """Whether some REPEAT_NGRAM-token sequence occurs at least twice in the response's tokens."""
  seen = set()
  for i in range(len(tokens_N) - REPEAT_NGRAM + 1):
    gram = tuple(tokens_N[i:i + REPEAT_NGRAM])
    if gram in seen:
      return True
    seen.add(gram)
  return False


def grade(text: str, problem: Problem) -> bool | None:
  """Whether `text` answers `problem` correctly; None for a problem without an answer."""
  return None if problem.answer is None else is_correct(text, problem.answer, problem.grader)


def answer_reward_fn(tokenizer, problems: list[Problem]) -> Callable:
  """(index_B, tokens_BxR, mask_BxR) -> numpy reward_B: 1.0 where the response's final answer is correct for
  problems[index], else 0.0 (the same grader as held-out accuracy). Every problem needs an answer."""
  missing = sum(p.answer is None for p in problems)
  if missing:
    raise InputError(f"a reward needs an answer for every training problem; {missing} of {len(problems)} have "
                     "none (use an OPD objective, or give every JSONL row an 'answer')")

  def reward(index_B, tokens_BxR, mask_BxR) -> np.ndarray:
    texts = decode_responses(tokenizer, tokens_BxR, mask_BxR)
    return np.asarray([float(grade(text, problems[int(i)])) for text, i in zip(texts, index_B)], np.float32)

  return reward


@dataclasses.dataclass
class Responses:
  """Responses to held-out problems, batch by batch, kept for scoring again (e.g. the teacher's greedy ones)."""
  batches: list  # (prompt_BxP, valid_BxP, tokens_BxR, mask_BxR) per batch, padding rows masked out
  texts: list[str]


def evaluate(sampler: Sampler, state, tokenizer, problems: list[Problem], *, max_prompt_tokens: int,
             batch_size: int, key: jax.Array, use_chat_template: bool = False, prompt_format: str = "",
             put: Callable = lambda x: x,
             kl_fn=None, teacher_state=None, keep: Responses | None = None, sampler_state=None,
             put_sampler: Callable | None = None, routes=None, teachers_kl=None) -> dict[str, float]:
  """Accuracy (over the problems with an answer), mean response tokens, "at_cap" (the share of responses that
  used every token of the sampler's budget, i.e. did not end), "repetition" (the share in which some
  REPEAT_NGRAM-token sequence occurs twice) and, given kl_fn (a `make_kl_fn` function, called with `state` and
  `teacher_state`), its token mean as "kl" and its mean per response as "kl_per_response".

  Problems are processed in batches of `batch_size` (the last one padded by repeating, then dropped); `put`
  places each input batch (e.g. onto a sharded mesh). `keep` collects the responses and texts. With
  `sampler_state` and `put_sampler` the sampler decodes with those weights and placement (the rollout engine's
  mesh) and its responses come back through the host onto `put`'s placement for kl_fn and `keep`.
  Multi-teacher runs: `routes` (each problem's teacher) and `teachers_kl` ([(kl_fn, teacher_state)] per teacher)
  measure each problem's KL to its own teacher instead; "kl_by_teacher" maps each teacher with held-out tokens
  (its index) to its token mean.
  """
  correct, lengths, repeated = [], [], []
  budget = 0
  teachers_kl = teachers_kl or ([(kl_fn, teacher_state)] if kl_fn is not None else [])
  kl_sums, kl_counts = np.zeros(len(teachers_kl)), np.zeros(len(teachers_kl))
  for start in range(0, len(problems), batch_size):
    chunk = problems[start:start + batch_size]
    padded = chunk + [chunk[-1]] * (batch_size - len(chunk))
    host_prompts, host_valid = encode_prompts(tokenizer, padded, max_prompt_tokens, use_chat_template,
                                              prompt_format=prompt_format)
    prompts, valid = put(host_prompts), put(host_valid)
    key, sub = jax.random.split(key)
    weight = np.zeros((batch_size, 1), np.float32)
    weight[:len(chunk)] = 1.0
    if put_sampler is None:
      out = sampler(state if sampler_state is None else sampler_state, prompts, valid, sub)
      tokens, host_mask = distributed.to_host((out.tokens_BxN, out.mask_BxN))
      response, mask = out.tokens_BxN, out.mask_BxN * put(weight)
    else:  # decoded on the sampler's mesh; the learner-side programs get the responses through the host
      out = sampler(sampler_state, put_sampler(host_prompts), put_sampler(host_valid), sub)
      tokens, host_mask = distributed.to_host((out.tokens_BxN, out.mask_BxN))
      response, mask = put(np.asarray(tokens)), put(np.asarray(host_mask) * weight)
    route = np.zeros(batch_size, np.int64) if routes is None else np.asarray(routes)[
        [min(i, len(problems) - 1) for i in range(start, start + batch_size)]]
    for n, (fn, teacher) in enumerate(teachers_kl):
      if not np.any(route[:len(chunk)] == n):
        continue
      mine = mask if len(teachers_kl) == 1 else mask * put((route == n).astype(np.float32)[:, None])
      total, count = fn(state, teacher, prompts, valid, response, mine)
      kl_sums[n], kl_counts[n] = kl_sums[n] + float(total), kl_counts[n] + float(count)
    texts = decode_responses(tokenizer, tokens, host_mask)[:len(chunk)]
    correct += [ok for ok in (grade(t, p) for t, p in zip(texts, chunk)) if ok is not None]
    host_tokens, host_mask = np.asarray(tokens), np.asarray(host_mask)
    budget = host_mask.shape[1]
    lengths += list(host_mask.sum(1)[:len(chunk)])
    repeated += [repeats(row[m > 0].tolist()) for row, m in zip(host_tokens[:len(chunk)], host_mask[:len(chunk)])]
    if keep is not None:
      keep.batches.append((prompts, valid, response, mask))
      keep.texts += texts
  result = {"response_tokens": float(np.mean(lengths)),
            "at_cap": float(np.mean([n >= budget for n in lengths])), "repetition": float(np.mean(repeated))}
  if correct:
    result["accuracy"] = float(np.mean(correct))
  if teachers_kl:
    result["kl"] = float(kl_sums.sum() / max(kl_counts.sum(), 1.0))
    result["kl_per_response"] = float(kl_sums.sum() / max(len(lengths), 1))
  if len(teachers_kl) > 1:
    result["kl_by_teacher"] = {n: float(t / c) for n, (t, c) in enumerate(zip(kl_sums, kl_counts)) if c}
  return result


def kl_on(responses: Responses, kl_fn, student_state, teacher_state) -> float:
  """Token mean of `kl_fn` over kept responses (e.g. KL(teacher || student) on the teacher's greedy ones)."""
  total = count = 0.0
  for prompts, valid, tokens, mask in responses.batches:
    batch_total, batch_count = kl_fn(student_state, teacher_state, prompts, valid, tokens, mask)
    total, count = total + float(batch_total), count + float(batch_count)
  return total / max(count, 1.0)
