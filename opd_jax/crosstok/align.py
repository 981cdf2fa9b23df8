"""Aligning two tokenizations of one text into spans whose boundaries both share.

The student sampled token ids; their text is what the student's tokenizer decodes them to. The teacher reads
that same text re-tokenized by its own tokenizer. Each tokenization puts boundaries (character offsets) between
its tokens; a *span* runs from one boundary both share to the next. Within a span neither side can be split
to match the other, but over a span both sides spell exactly the same characters, so the teacher's
log-probability of the span (the sum over its teacher tokens, teacher-forced) and the student's (the sum over
its student tokens) are two probabilities of the same event: the exact quantities the span objective compares.

Boundaries are character offsets into the decoded text. A student token that ends inside a character (byte-level
BPE may split a multi-byte character) has no boundary of its own; it joins the next token's span. With one
tokenizer on both sides every token boundary is shared and every span is one token.
"""

from __future__ import annotations

import bisect
import dataclasses

UNSCORED = -1  # span id of a token no span scores


@dataclasses.dataclass(frozen=True)
class Alignment:
  """Spans of one response: span s covers student tokens student_span[k] == s and teacher tokens
  teacher_span[j] == s. `valid[s]` is False for a span the teacher cannot score (it holds an unknown teacher token,
  or no teacher token); such spans are dropped from the loss and counted."""
  student_span: list[int]  # per student token: its span, or UNSCORED
  teacher_span: list[int]  # per teacher token: its span, or UNSCORED
  valid: list[bool]  # per span


def token_ends(decode, ids: list[int], text: str) -> list[int | None]:
  """Character offset where each token of `ids` ends in `text` (their decoding), or None for a token that ends
  inside a character. decode(ids) -> str must decode without cleaning spaces, so that the decoding of a prefix of
  the ids is a prefix of the whole text wherever the prefix ends at a character boundary. Costs one decode per
  token (quadratic in the response length; ~0.5 ms per 256-token row)."""
  ends: list[int | None] = []
  for k in range(1, len(ids) + 1):
    prefix = decode(ids[:k])
    ends.append(len(prefix) if text.startswith(prefix) and not prefix.endswith("\ufffd") else None)
  return ends


def _known_ends(ends: list[int | None], length: int) -> list[int]:
  """Each token's end, a token ending inside a character taking the next token's (the text's length at the end)."""
  out, later = [length] * len(ends), length
  for k in range(len(ends) - 1, -1, -1):
    later = ends[k] if ends[k] is not None else later
    out[k] = later
  return out


def shared_ends(student_end: list[int | None], teacher_end: list[int | None]) -> set[int]:
  """The boundaries (> 0) both tokenizations put between tokens."""
  return {e for e in student_end if e} & {e for e in teacher_end if e}


def align(student_end: list[int | None], teacher_end: list[int | None], teacher_known: list[bool],
          length: int, allowed: set[int] | None = None) -> Alignment:
  """Spans of a text of `length` characters tokenized both ways. student_end / teacher_end: each side's
  `token_ends` (the caller checks that both sides' tokens spell the whole text); teacher_known: False for a
  teacher token that is its unknown token; allowed: the shared boundaries that may end a span (None: all of them;
  opd_jax.crosstok.boundaries drops those where the two sides' events differ). The text's end always ends one."""
  # span s ends at shared[s]: a token ending at e (<= length) is in the first span whose boundary is >= e
  shared = shared_ends(student_end, teacher_end)
  shared = sorted((shared if allowed is None else shared & allowed) | {length})
  student_span = [bisect.bisect_left(shared, e) for e in _known_ends(student_end, length)]
  teacher_span = [bisect.bisect_left(shared, e) for e in _known_ends(teacher_end, length)]
  valid = [False] * len(shared)
  for s in teacher_span:
    valid[s] = True
  for s, known in zip(teacher_span, teacher_known):
    valid[s] = valid[s] and known
  student_has = set(student_span)
  valid = [v and s in student_has for s, v in enumerate(valid)]
  return Alignment(student_span, teacher_span, valid)
