"""Every token's own text, decoded once per tokenizer: the stop tokens, the cross-tokenizer boundary probes and the
next-character event tables all read a whole vocabulary (262,144 tokens for Gemma 3, seconds per pass)."""

from __future__ import annotations

import weakref

_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def token_texts(tokenizer) -> tuple:
  """Per id in range(len(tokenizer)): the token's text as decode([id]) gives it (special tokens spelled, no space
  clean-up), or None where the id is no token of the vocabulary (a hole in its ids). Cached per tokenizer object."""
  try:
    return _CACHE[tokenizer]
  except (KeyError, TypeError):
    pass
  known = set(tokenizer.get_vocab().values())
  ids = [i for i in range(len(tokenizer)) if i in known]
  decoded = dict(zip(ids, tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False,
                                                 clean_up_tokenization_spaces=False)))
  texts = tuple(decoded.get(i) for i in range(len(tokenizer)))
  try:
    _CACHE[tokenizer] = texts
  except TypeError:  # not weak-referenceable: no cache
    pass
  return texts
