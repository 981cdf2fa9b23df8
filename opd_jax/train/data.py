"""Prompt pipeline: grain over problems -> shuffled, repeating, fixed-shape prompt batches, checkpointable."""

from __future__ import annotations

import grain
import numpy as np

from opd_jax.data.batching import encode_prompts
from opd_jax.data.task import Problem


class PromptPipeline:
  """Yields {"prompt_BxP", "prompt_valid_BxP", "index_B"} numpy batches; state via get_state/set_state."""

  def __init__(self, problems: list[Problem], tokenizer, *, batch_size: int, max_prompt_tokens: int, seed: int,
               use_chat_template: bool = False):
    if not problems:
      raise ValueError("the training problem set is empty")

    def encode(index: int):
      tokens, valid = encode_prompts(tokenizer, [problems[index]], max_prompt_tokens, use_chat_template)
      return {"prompt_BxP": tokens[0], "prompt_valid_BxP": valid[0], "index_B": np.int64(index)}

    dataset = (grain.MapDataset.range(len(problems)).shuffle(seed=seed).repeat().map(encode)
               .batch(batch_size, drop_remainder=True))
    self._iterator = iter(dataset.to_iter_dataset())

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self._iterator)

  def __iter__(self):
    return self

  def get_state(self) -> dict:
    return self._iterator.get_state()

  def set_state(self, state: dict) -> None:
    self._iterator.set_state(state)
