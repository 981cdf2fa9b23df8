"""Where a student's greedy responses loop, does the teacher continue the loop too?

A response loops when some n-token sequence occurs twice in it (the evaluation's repetition metric,
opd_jax/train/evaluation.py). Both models are teacher-forced on the student's looping responses; at every token
of a repeated n-gram's later occurrence ("in a loop") and at every other response token ("elsewhere") we record
the probability each model gives the token greedy decoding chose. If the teacher gives the loop's tokens as much
probability as the student does, OPD (which moves the student toward the teacher at the states the student
visits) has no signal against the loop there: the teacher endorses continuing it.
"""

from __future__ import annotations

import numpy as np


def loop_positions(ids: list[int], n: int = 8) -> list[int]:
  """Indices of the tokens of every repeated n-gram's later occurrences (empty when nothing repeats)."""
  seen, positions = set(), set()
  for i in range(len(ids) - n + 1):
    gram = tuple(ids[i:i + n])
    if gram in seen:
      positions.update(range(i, i + n))
    seen.add(gram)
  return sorted(positions)


def summary(values: list[float]) -> dict:
  x = np.asarray(values, dtype=np.float64)
  if x.size == 0:
    return {"tokens": 0}
  return {"tokens": int(x.size), "mean": float(x.mean()), "median": float(np.median(x)),
          "share_above_half": float(np.mean(x > 0.5))}


def chosen_token_probs(logprobs_TxV: np.ndarray, ids: list[int], prompt_len: int) -> np.ndarray:
  """p(response token i | its prefix) for i >= 1 of a sequence prompt + response (row t predicts token t + 1)."""
  rows = np.arange(prompt_len, prompt_len + len(ids) - 1)
  return np.exp(logprobs_TxV[rows, np.asarray(ids[1:])])


def loop_report(responses: list[tuple[list[int], list[int]]], score, n: int = 8) -> dict:
  """responses: (prompt ids, response ids) of greedy responses; score(ids) -> {model: log-probs [T, V]}. Returns
  per model the chosen-token probabilities in loops and elsewhere, over the responses that loop."""
  found = {"in_loop": {}, "elsewhere": {}}
  looping = 0
  for prompt_ids, response_ids in responses:
    loop = set(loop_positions(response_ids, n))
    if not loop:
      continue
    looping += 1
    for model, logprobs in score(prompt_ids + response_ids).items():
      probs = chosen_token_probs(logprobs, response_ids, len(prompt_ids))
      for i, p in enumerate(probs, start=1):
        found["in_loop" if i in loop else "elsewhere"].setdefault(model, []).append(float(p))
  return {"responses": len(responses), "looping": looping, "ngram": n,
          **{where: {model: summary(v) for model, v in by_model.items()} for where, by_model in found.items()}}
