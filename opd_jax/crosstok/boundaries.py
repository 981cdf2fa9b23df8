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

# Probe characters: printable ASCII, newline and tab, and the Latin-1 letters (accented Latin text).
PROBES = "".join(sorted(set(string.printable) - set("\r\x0b\x0c") | {chr(c) for c in range(0xC0, 0x100)} - {"×", "÷"}))


class BoundaryProbe:
  """One tokenizer's answer to: after `prefix`, which probe characters would it merge across the boundary?"""

  def __init__(self, tokenizer, probes: str = PROBES):
    self.tokenizer = tokenizer
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer)) if i not in special],
                                   clean_up_tokenization_spaces=False)
    allowed = set(probes)
    # inner[a]: the probe characters that follow character a inside some token (only they can merge across)
    self.inner: dict[str, set[str]] = {}
    for text in texts:
      for a, x in zip(text, text[1:]):
        if x in allowed:
          self.inner.setdefault(a, set()).add(x)

  def candidates(self, prefix: str) -> set[str]:
    """The probe characters this tokenizer might merge with the end of `prefix`."""
    return self.inner.get(prefix[-1], set()) if prefix else set()

  def merged(self, prefix: str, probes: list[str]) -> set[str]:
    """The characters of `probes` after which this tokenizer has no boundary at the end of `prefix`."""
    if not probes:
      return set()
    ids = self.tokenizer([prefix, *[prefix + x for x in probes]], add_special_tokens=False)["input_ids"]
    base = ids[0]
    return {x for x, probed in zip(probes, ids[1:]) if probed[:len(base)] != base}


def settled(student: BoundaryProbe, teacher: BoundaryProbe, text: str, ends: list[int], teacher_prefix: str = ""
            ) -> set[int]:
  """The boundaries of `ends` (character offsets into the student's response `text`, > 0) that are settled
  (module docstring); the teacher reads `teacher_prefix + text`."""
  out = set()
  for e in ends:
    s_prefix, t_prefix = text[:e], teacher_prefix + text[:e]
    s_try, t_try = student.candidates(s_prefix), teacher.candidates(t_prefix)
    probes = sorted(s_try | t_try)
    if student.merged(s_prefix, [x for x in probes if x in s_try]) == teacher.merged(
        t_prefix, [x for x in probes if x in t_try]):
      out.add(e)
  return out
