"""Final-answer extraction and checking, for the embedded task and for real math data.

Accepted answer forms, last one in the text wins: GSM8K `#### 42`, LaTeX `\\boxed{42}`. Numbers are
compared numerically after removing thousands separators, `$`, `%` and trailing periods, so `1,234`,
`1234.0` and `$1234` all equal `1234`. A response without an answer line scores 0.
"""

from __future__ import annotations

import math
import re

_HASH_ANSWER = re.compile(r"####\s*([^\n]*)")
_BOXED = re.compile(r"\\boxed\s*\{")


def _boxed_contents(text: str) -> list[tuple[int, str]]:
  """(position, contents) of every \\boxed{...}, with nested braces balanced."""
  out = []
  for match in _BOXED.finditer(text):
    depth, start = 1, match.end()
    for i in range(start, len(text)):
      depth += {"{": 1, "}": -1}.get(text[i], 0)
      if depth == 0:
        out.append((match.start(), text[start:i]))
        break
  return out


def extract_answer(text: str) -> str | None:
  """The last `#### x` or `\\boxed{x}` answer in `text`, stripped; None when there is none."""
  candidates = [(m.start(), m.group(1)) for m in _HASH_ANSWER.finditer(text)] + _boxed_contents(text)
  if not candidates:
    return None
  answer = max(candidates)[1].strip()
  return answer or None


def normalize(answer: str) -> str:
  answer = answer.strip().replace(",", "").replace("$", "").replace("%", "").rstrip(".").strip()
  try:
    value = float(answer)
  except ValueError:
    return answer
  if not math.isfinite(value):
    return answer
  return str(int(value)) if value == int(value) else repr(value)


def gold_answer(answer_field: str) -> str:
  """A dataset's answer field: a bare value, or a full solution that ends in `#### x` / `\\boxed{x}`."""
  extracted = extract_answer(answer_field)
  return normalize(extracted if extracted is not None else answer_field)


def is_correct(response: str, gold: str) -> bool:
  predicted = extract_answer(response)
  return predicted is not None and normalize(predicted) == gold_answer(gold)
