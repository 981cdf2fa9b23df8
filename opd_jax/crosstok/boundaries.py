"""Which shared boundaries may end a span: those where both tokenizations stand for the same event.

A tokenized model's probability of a token is the probability of its characters *and* of its tokenizer ending a
token there. A teacher that writes "76" as one token gives its one-digit token "7" only the probability that the
number is exactly 7 ("7, then no digit"); a student that writes digits one by one gives "7" the probability of the
character alone. At such a boundary the two sides' span log-probs are probabilities of different events: their
difference is not zero even where the two models agree on every text, and the span objectives push the student
off the teacher (on pairx, toward ending every number after its first digit; docs/cross_tokenizer.md).

A shared boundary after `prefix` is *settled* when, for every probe character x that may follow it, both tokenizers
keep a boundary there in `prefix + x` or both merge across it: then the event "the text so far, then a token ends"
means the same next-character condition on both sides, and the span log-probs compare the same event. An
unsettled boundary is dropped; its span runs on to the next settled one (the "7" above joins the character after
it, "7\\n", whose probability both sides state exactly).

Only a character pair that occurs inside some token of a vocabulary can be merged across by that tokenizer, so a
side is probed (tokenized) only for the probe characters x where (last character, x) occurs inside one of its
tokens. The probes look one character ahead: a merge that needs two or more following characters is not seen.
"""

from __future__ import annotations

import string

from opd_jax.data.token_texts import token_texts

# Probe characters: printable ASCII, newline and tab, and the Latin-1 letters (accented Latin text).
_LATIN1_LETTERS = {chr(c) for c in range(0xC0, 0x100)} - {"×", "÷"}
PROBES = "".join(sorted(set(string.printable) - set("\r\x0b\x0c") | _LATIN1_LETTERS))


class BoundaryProbe:
  """One tokenizer's answer to: after `prefix`, which probe characters would it merge across the boundary?"""

  def __init__(self, tokenizer, probes: str = PROBES):
    self.tokenizer = tokenizer
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    texts = [t for i, t in enumerate(token_texts(tokenizer)) if t is not None and i not in special]
    allowed = set(probes)
    # inner[a]: the probe characters that follow character a inside some token (only they can merge across)
    self.inner: dict[str, set[str]] = {}
    for text in texts:
      for a, x in zip(text, text[1:]):
        if x in allowed:
          self.inner.setdefault(a, set()).add(x)

  def merged(self, prefixes: list[str]) -> list[set[str]]:
    """Per prefix: the probe characters after which this tokenizer has no boundary at the prefix's end (one
    tokenizer call for all of them)."""
    jobs = [(prefix, sorted(self.inner.get(prefix[-1], ()))) if prefix else (prefix, []) for prefix in prefixes]
    texts = [text for prefix, probes in jobs if probes for text in (prefix, *[prefix + x for x in probes])]
    ids = iter(self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])
    out = []
    for prefix, probes in jobs:
      base = next(ids) if probes else None
      out.append({x for x in probes if next(ids)[:len(base)] != base})
    return out


def settled(student: BoundaryProbe, teacher: BoundaryProbe, text: str, ends: list[int], teacher_prefix: str = ""
            ) -> set[int]:
  """The boundaries of `ends` (character offsets into the student's response `text`, > 0) that are settled
  (module docstring); the teacher reads `teacher_prefix + text`."""
  s_merged = student.merged([text[:e] for e in ends])
  t_merged = teacher.merged([teacher_prefix + text[:e] for e in ends])
  return {e for e, s, t in zip(ends, s_merged, t_merged) if s == t}
