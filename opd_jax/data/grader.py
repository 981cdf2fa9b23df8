"""Answer checking: final-answer extraction for the embedded task and real math data, and short-answer match.

Graders (a problem's `grader` field, GRADERS):
  final_answer  the last GSM8K `#### 42` or LaTeX `\\boxed{42}` answer in the text is the prediction. Numbers are
                compared numerically after removing thousands separators, `$`, `%` and trailing periods, so
                `1,234`, `1234.0` and `$1234` all equal `1234`. A response without an answer line scores 0.
  contains      the gold answer appears as whole words in the response's first non-empty line, ignoring case,
                accents and punctuation (`The capital of Colombia is Bogota.` answers `Bogotá`): for short
                factual answers a chat model states in a sentence.
"""

from __future__ import annotations

import math
import re
import unicodedata

GRADERS = ("final_answer", "contains")

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


def _words(text: str) -> str:
  """Lower-case words without accents or punctuation, space-separated and space-padded."""
  plain = "".join(c for c in unicodedata.normalize("NFKD", text.casefold()) if not unicodedata.combining(c))
  return " " + " ".join(re.findall(r"\w+", plain)) + " "


def is_correct(response: str, gold: str, grader: str = "final_answer") -> bool:
  if grader == "contains":
    first_line = next((line for line in response.splitlines() if line.strip()), "")
    return _words(gold).strip() != "" and _words(gold) in _words(first_line)
  predicted = extract_answer(response)
  return predicted is not None and normalize(predicted) == gold_answer(gold)
