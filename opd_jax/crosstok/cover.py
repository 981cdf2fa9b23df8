"""Covers: the tokens whose text starts with a given token's text, as one contiguous range of a sorted vocabulary.

A model's log-probability of its token t at a span end states two things: the characters of t, and that its
tokenizer ended a token there. Where the other tokenizer would not have ended one (an unsettled boundary,
opd_jax.crosstok.boundaries), the two sides' span log-probs are of different events. The character-level
probability of the text up to the boundary replaces the last token's probability p(t) by the mass of every token
that spells t's text and maybe more: the *cover* of t, C(t) = sum of p(v) over tokens v whose text starts with
t's (the one-token-back estimate of a text prefix's probability; Phan et al. 2024, "Understanding and mitigating
tokenization bias in language models"). A span between unsettled boundaries then scores
    log p(its tokens) + [log C(last) - log p(last)] - [log C(previous span's last) - log p(that token)],
the log-ratio of two character-level prefix probabilities, on both sides alike.

Sorted by text (code point order), the tokens whose text starts with s are one range [lo, hi) of ranks, so a
model program needs only each vocabulary id's rank (`rank_V`, -1 for tokens that are in no cover: special tokens,
tokens that spell nothing or part of a character) and each corrected position's (lo, hi).
"""

from __future__ import annotations

import bisect

import numpy as np

from opd_jax.data.token_texts import token_texts

NONE = (-1, -1)  # (lo, hi) of a token that has no cover


def _readable(text: str | None) -> bool:
  return bool(text) and "\ufffd" not in text


class CoverTable:
  """One vocabulary's ranks and covers (module docstring). vocab_size: the model's logits width (>= the
  tokenizer's length; rows past it are in no cover). specials: ids never in a cover (the tokenizer's special ids)."""

  def __init__(self, tokenizer, vocab_size: int, specials: set[int]):
    texts = token_texts(tokenizer)
    ids = sorted((i for i, t in enumerate(texts) if i < vocab_size and i not in specials and _readable(t)),
                 key=lambda i: (texts[i], i))
    self.rank_V = np.full(vocab_size, -1, np.int32)
    self.rank_V[ids] = np.arange(len(ids), dtype=np.int32)
    self._sorted = [texts[i] for i in ids]
    self._texts = texts

  def length(self, token: int) -> int:
    """The number of characters of `token`'s text (that of a token with a cover)."""
    return len(self._texts[token])

  @property
  def longest(self) -> int:
    """The most characters of any token with a cover (0 for none)."""
    return max(map(len, self._sorted), default=0)

  def cover(self, token: int) -> tuple[int, int]:
    """(lo, hi): the ranks of the tokens whose text starts with `token`'s (it among them); NONE if it has none."""
    if token >= len(self.rank_V) or self.rank_V[token] < 0:
      return NONE
    text = self._texts[token]
    lo = bisect.bisect_left(self._sorted, text)
    hi = bisect.bisect_left(self._sorted, text[:-1] + chr(ord(text[-1]) + 1)) if ord(text[-1]) < 0x10FFFF \
        else len(self._sorted)
    return lo, hi
