"""The embedded reasoning task: multi-step integer arithmetic with a worked solution.

A problem is a chain like `47+85-19+6` (left to right, every intermediate value non-negative). The
response works it out one operation per line and ends with a GSM8K-style answer line:

    prompt:   "47+85-19+6\n"
    response: "47+85=132\n132-19=113\n113+6=119\n#### 119"

Responses are 16-64 characters (tokens, with the embedded character tokenizer). Problems are generated
from a seeded stream and assigned to a split by a hash of the prompt text, so the train and held-out splits
are disjoint by construction and every call with the same seed returns the same problems.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from opd_jax.errors import InputError


@dataclasses.dataclass(frozen=True)
class Problem:
  prompt: str  # text the model is conditioned on (ends with a newline)
  answer: str | None  # the final answer, as the grader compares it; None = an open prompt (OPD needs none)
  solution: str = ""  # the worked reference solution (what a supervised model is trained to write)
  grader: str = "final_answer"  # how `answer` is checked: see opd_jax.data.grader.GRADERS
  teacher: str = ""  # multi-teacher runs: the teacher that scores this prompt ("" = routed by rule or default)
  source: str = ""  # the part of the training set it belongs to; `data.mix` weights the parts


@dataclasses.dataclass(frozen=True)
class ArithmeticTask:
  """Chains of + and - over integers; difficulty grows with terms and digits."""

  min_terms: int = 3
  max_terms: int = 6
  min_digits: int = 1
  max_digits: int = 2
  heldout_fraction: float = 0.1  # share of the problem space (by prompt hash) reserved for evaluation

  def __post_init__(self):
    if not 2 <= self.min_terms <= self.max_terms:
      raise InputError(f"task terms: need 2 <= min_terms <= max_terms, got {self.min_terms}, {self.max_terms}")
    if not 1 <= self.min_digits <= self.max_digits <= 4:
      raise InputError(f"task digits: need 1 <= min_digits <= max_digits <= 4, got "
                       f"{self.min_digits}, {self.max_digits}")
    if not 0 < self.heldout_fraction < 1:
      raise InputError(f"task heldout_fraction must be in (0, 1), got {self.heldout_fraction}")

  def max_prompt_chars(self) -> int:
    return self.max_terms * (self.max_digits + 1)

  def max_response_chars(self) -> int:
    top = self.max_terms * (10 ** self.max_digits - 1)
    step = 2 * len(str(top)) + self.max_digits + 3
    return (self.max_terms - 1) * step + 5 + len(str(top))

  def _number(self, rng: np.random.Generator) -> int:
    digits = int(rng.integers(self.min_digits, self.max_digits + 1))
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return int(rng.integers(low, 10 ** digits))

  def _make(self, rng: np.random.Generator) -> Problem:
    terms = int(rng.integers(self.min_terms, self.max_terms + 1))
    value = self._number(rng)
    expression, lines = str(value), []
    for _ in range(terms - 1):
      operand = self._number(rng)
      op = "+" if operand > value or rng.random() < 0.5 else "-"
      result = value + operand if op == "+" else value - operand
      lines.append(f"{value}{op}{operand}={result}")
      expression += f"{op}{operand}"
      value = result
    lines.append(f"#### {value}")
    return Problem(prompt=expression + "\n", answer=str(value), solution="\n".join(lines))

  def is_heldout(self, prompt: str) -> bool:
    digest = hashlib.blake2b(prompt.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0 ** 64 < self.heldout_fraction

  def problems(self, split: str, count: int, seed: int = 0) -> list[Problem]:
    """`count` problems of `split` ('train' or 'heldout'), deterministic in (split, seed)."""
    if split not in ("train", "heldout"):
      raise InputError(f"split must be 'train' or 'heldout', got {split!r}")
    rng = np.random.default_rng([seed, 0 if split == "train" else 1])
    out = []
    want_heldout = split == "heldout"
    while len(out) < count:
      problem = self._make(rng)
      if self.is_heldout(problem.prompt) == want_heldout:
        out.append(problem)
    return out
