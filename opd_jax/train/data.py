"""Prompt pipeline: grain over problems -> shuffled, repeating, fixed-shape prompt batches, checkpointable."""

from __future__ import annotations

import grain
import numpy as np

from opd_jax.data.batching import encode_prompts
from opd_jax.data.char_tokenizer import check_text, is_char_tokenizer
from opd_jax.data.problems import mix_groups
from opd_jax.data.task import Problem
from opd_jax.errors import InputError


class PromptPipeline:
  """Yields {"prompt_BxP", "prompt_valid_BxP", "index_B"} numpy batches; state via get_state/set_state.

  Prompts longer than max_prompt_tokens keep their end (see encode_prompts) and are counted: `truncated` is
  how many of the `prompts_drawn` prompts yielded so far were cut; report it, e.g. as a metric. Both counts
  are part of the state, so a resumed run counts on from the checkpoint, like an uninterrupted one. With the
  embedded character tokenizer every prompt is checked for characters outside its vocabulary up front, so a bad
  problem set fails here rather than mid-run.

  mix: {source: weight} (`data.mix`): each source's prompts are shuffled and repeated on their own and drawn in
  proportion to the weights (grain's MapDataset.mix), whatever each source's size; empty = every prompt equally
  often.
  """

  def __init__(self, problems: list[Problem], tokenizer, *, batch_size: int, max_prompt_tokens: int, seed: int,
               use_chat_template: bool = False, prompt_format: str = "", mix: dict[str, float] | None = None):
    if not problems:
      raise InputError("the training problem set is empty")
    if is_char_tokenizer(tokenizer):
      for index, problem in enumerate(problems):
        check_text(problem.prompt, f"training problem {index}: prompt")
    self.truncated = 0  # prompts yielded that were cut to max_prompt_tokens
    self.prompts_drawn = 0  # prompts yielded

    def encode(index: int):
      cut = []
      tokens, valid = encode_prompts(tokenizer, [problems[index]], max_prompt_tokens, use_chat_template,
                                     prompt_format=prompt_format,
                                     on_truncate=lambda i, n: cut.append(n))
      return {"prompt_BxP": tokens[0], "prompt_valid_BxP": valid[0], "index_B": np.int64(index),
              "truncated_B": np.bool_(bool(cut))}

    if mix:
      parts = [(grain.MapDataset.source(indices).shuffle(seed=seed + i).repeat(), weight)
               for i, (indices, weight) in enumerate(mix_groups(problems, mix))]
      indices = grain.MapDataset.mix([p for p, _ in parts], [w for _, w in parts])
    else:
      indices = grain.MapDataset.range(len(problems)).shuffle(seed=seed).repeat()
    dataset = indices.map(lambda i: encode(int(i))).batch(batch_size, drop_remainder=True)
    self._iterator = iter(dataset.to_iter_dataset())

  def __next__(self) -> dict[str, np.ndarray]:
    # Counted here, not in `encode`: grain encodes ahead on worker threads, and only yielded batches count.
    batch = next(self._iterator)
    truncated_B = batch.pop("truncated_B")
    self.truncated += int(truncated_B.sum())
    self.prompts_drawn += len(truncated_B)
    return batch

  def __iter__(self):
    return self

  def get_state(self) -> dict:
    """JSON: grain's iterator state and the counts of prompts yielded and cut so far."""
    return {"grain": self._iterator.get_state(), "truncated": self.truncated, "prompts_drawn": self.prompts_drawn}

  def set_state(self, state: dict) -> None:
    if "grain" not in state:  # written before the counts were kept: grain's state alone; count from 0
      state = {"grain": state, "truncated": 0, "prompts_drawn": 0}
    self._iterator.set_state(state["grain"])
    self.truncated, self.prompts_drawn = int(state["truncated"]), int(state["prompts_drawn"])
