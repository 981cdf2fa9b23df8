"""Which factual questions a model answers correctly (greedy decoding), to grade a task only where a teacher is
reliable: the embedded capitals task keeps the countries its teacher knows (study/build_chat_prompts.py)."""

from __future__ import annotations

import jax.numpy as jnp

from opd_jax.data.batching import decode_responses
from opd_jax.data.grader import is_correct
from opd_jax.data.task import Problem
from opd_jax.models import load_pretrained, load_tokenizer
from opd_jax.prepare.prune import CalibrationSet


def answered_correctly(model_dir: str, problems: list[Problem], *, max_prompt_tokens: int = 64,
                       max_new_tokens: int = 24, use_chat_template: bool = True, batch_size: int = 48
                       ) -> list[tuple[bool, str]]:
  """(correct, response text) per problem: the model's greedy response, graded by the problem's grader."""
  model, tokenizer = load_pretrained(model_dir, jnp.float32), load_tokenizer(model_dir)
  responses = CalibrationSet.make(model, tokenizer, problems, max_prompt_tokens=max_prompt_tokens,
                                  max_new_tokens=max_new_tokens, use_chat_template=use_chat_template,
                                  batch_size=batch_size)
  texts = [text for _, _, tokens, mask in responses.batches for text in decode_responses(tokenizer, tokens, mask)]
  return [(is_correct(text, p.answer, p.grader), text) for text, p in zip(texts, problems)]
