"""Problems -> fixed-shape token arrays (left-padded prompts, right-padded responses)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from opd_jax.data.char_tokenizer import check_text, is_char_tokenizer
from opd_jax.data.task import Problem
from opd_jax.models.tokenizer import encode_prompt


def encode_prompts(tokenizer, problems: list[Problem], max_prompt_tokens: int, use_chat_template: bool = False,
                   *, prompt_format: str = "", on_truncate: Callable[[int, int], None] | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
  """(prompt_BxP int32, valid_BxP bool), left-padded to max_prompt_tokens.

  A prompt longer than max_prompt_tokens keeps its last max_prompt_tokens tokens: the question usually sits
  at the end of a prompt, and a chat-wrapped prompt ends with the assistant header the response follows.
  prompt_format (data.prompt_format), when given, renders each prompt instead (models.tokenizer.encode_prompt).
  on_truncate(index in problems, full token count) is called for each prompt cut, so callers can count them.
  With the embedded character tokenizer, a prompt with characters outside its vocabulary is an InputError.
  """
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
  check = is_char_tokenizer(tokenizer)
  tokens = np.full((len(problems), max_prompt_tokens), pad, np.int32)
  valid = np.zeros((len(problems), max_prompt_tokens), bool)
  for i, problem in enumerate(problems):
    if check:
      check_text(problem.prompt, "prompt")
    ids = encode_prompt(tokenizer, problem.prompt, use_chat_template, prompt_format)
    if len(ids) > max_prompt_tokens:
      if on_truncate is not None:
        on_truncate(i, len(ids))
      ids = ids[-max_prompt_tokens:]
    tokens[i, max_prompt_tokens - len(ids):] = ids
    valid[i, max_prompt_tokens - len(ids):] = True
  return tokens, valid


def encode_solutions(tokenizer, problems: list[Problem], max_response_tokens: int) -> tuple[np.ndarray, np.ndarray]:
  """(response_BxR int32, mask_BxR float32): each reference solution + EOS, right-padded (for SFT)."""
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
  tokens = np.full((len(problems), max_response_tokens), pad, np.int32)
  mask = np.zeros((len(problems), max_response_tokens), np.float32)
  check = is_char_tokenizer(tokenizer)
  for i, problem in enumerate(problems):
    if check:
      check_text(problem.solution, "solution")
    ids = tokenizer.encode(problem.solution, add_special_tokens=False) + [tokenizer.eos_token_id]
    if len(ids) > max_response_tokens:
      raise ValueError(f"solution of problem {problem.prompt!r} has {len(ids)} tokens > "
                       f"max_response_tokens={max_response_tokens}")
    tokens[i, :len(ids)] = ids
    mask[i, :len(ids)] = 1.0
  return tokens, mask


def decode_responses(tokenizer, tokens_BxN: np.ndarray, mask_BxN: np.ndarray) -> list[str]:
  """Response texts (special tokens, EOS and padding dropped)."""
  return [tokenizer.decode([int(t) for t, m in zip(row, mrow) if m > 0], skip_special_tokens=True)
          for row, mrow in zip(tokens_BxN, mask_BxN)]
