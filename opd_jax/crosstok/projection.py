"""The common event space of the full-distribution cross-tokenizer objective: the next character.

Legend: Vs / Vt the student's / teacher's vocabulary, E events.

At a position where both tokenizations start a span, both models predict the same next characters, but over
different token sets. Both distributions are marginalized onto one event both can name: the first character of
the next token (byte-prefix marginalization at the first character). q_S(c) sums p_S over the student tokens
whose text starts with c, q_T(c) sums p_T over the teacher's; the objective is KL(q_S || q_T). A student that
writes digits one by one and a teacher that writes "12" as one token then compare P(next character is "1")
exactly: the teacher's "1", "10", ..., "19" all count for "1". The student's EOS and the teacher's end token are
one event ("end"); another special token is an event of its own, shared with the other side's token of the same
spelling; a student token that spells nothing (a padded embedding row) is the event "unreadable", which no teacher
token is in (q_T = 0, clamped at 1e-30: the student's mass there is penalized, not renormalized away; the span
form gives such tokens the same log-prob, opd_jax.crosstok.view.UNREADABLE_LOGP); a token whose text does not
start with a whole character (a partial UTF-8 byte) is in no event, and each side's q is renormalized over the
tokens that are.

With one vocabulary on both sides nothing is marginalized: `character_events` returns None and the objective is
today's exact reverse KL over tokens.

A response prefix the teacher reads before the student's text (cross_tokenizer.teacher_response_prefix, e.g. the
space after "A:") may merge with the text's first characters into the teacher's first token ("▁The"). At that
position the teacher's next token begins with the prefix, so its event is the character after it: a fourth
table maps each teacher token that starts with the prefix to the character that follows it (a token that is the
prefix alone, or does not start with it, in no event), used where a row's first teacher token merged the prefix
(opd_jax.crosstok.view, `after_prefix_BxR`).

Corrected boundaries (cross_tokenizer.boundaries="corrected", opd_jax.crosstok.cover): at a span start after a
boundary where the two tokenizers would not both end a token, a side's next-token distribution there is that of
"its last token t ended here", not of the text. The character-level next-character distribution after the text
is, one token back (at the position that predicted t, with t's L characters):
    q'(c) = [p(tokens spelling exactly t's text) * q(c) + sum of p(u) over u spelling t's text, then c, ...] / C(t),
q the next-character marginal after t. `max_chars` > 0 adds, per side, each token's event at every character
offset below it ([max_chars, V]: ENDS_HERE where its text has exactly that many characters, NO_EVENT where it is
shorter or the character is in no event), and every character of both vocabularies to the events.
"""

from __future__ import annotations

import numpy as np

from opd_jax.crosstok.view import special_ids
from opd_jax.data.token_texts import token_texts

NO_EVENT = -1
ENDS_HERE = -2  # offset tables: the token's text has exactly this many characters
_END = ("end",)
_UNREADABLE = ("unreadable",)


def _texts(tokenizer) -> dict[int, str]:
  """{id: text} of every token of the vocabulary (token_texts, which decodes it once per tokenizer)."""
  return {i: t for i, t in enumerate(token_texts(tokenizer)) if t is not None}


def _keys(tokenizer, vocab_size: int, end_ids: set[int], student: bool) -> list:
  """Each token id's event key: _END, ("special", spelling), ("char", first character), _UNREADABLE (a student
  token that spells nothing), or None."""
  specials, by_id, texts = special_ids(tokenizer), {i: t for t, i in tokenizer.get_vocab().items()}, _texts(tokenizer)
  keys = []
  for i in range(vocab_size):
    if i in end_ids:
      keys.append(_END)
    elif i in specials:
      keys.append(("special", by_id.get(i)))
    elif texts.get(i) is None:
      keys.append(_UNREADABLE if student else None)  # a padded embedding row: no token
    else:
      text = texts[i]
      keys.append(("char", text[0]) if text and text[0] != "\ufffd" else _UNREADABLE if student and not text else None)
  return keys


def _after_prefix(tokenizer, vocab_size: int, keys: list, prefix: str) -> list:
  """Each teacher token's event key where its text must begin with `prefix`: the character after the prefix;
  ends and specials as in `keys`; None for the rest."""
  texts = _texts(tokenizer)
  out = []
  for i, key in zip(range(vocab_size), keys):
    if key is None or key[0] != "char":
      out.append(key)
      continue
    text = texts.get(i) or ""
    rest = text[len(prefix):] if text.startswith(prefix) else ""
    out.append(("char", rest[0]) if rest and rest[0] != "\ufffd" else None)
  return out


def character_events(student_tokenizer, teacher_tokenizer, student_vocab_size: int, teacher_vocab_size: int,
                     eos_ids: tuple[int, ...], teacher_end_id: int | None, teacher_prefix: str = "",
                     max_chars: int = 0) -> tuple | None:
  """(event of each student token id, event of each teacher token id, number of events, event of each teacher
  token id after `teacher_prefix` or None without one[, (student offsets [max_chars, Vs], teacher offsets
  [max_chars, Vt]) with max_chars > 0]), NO_EVENT for a token in none; None for identical vocabularies. Reads
  each vocabulary's decoded texts once (token_texts, shared with the boundary probes)."""
  if student_tokenizer.get_vocab() == teacher_tokenizer.get_vocab():
    return None
  student = _keys(student_tokenizer, student_vocab_size, set(eos_ids), True)
  teacher = _keys(teacher_tokenizer, teacher_vocab_size, set() if teacher_end_id is None else {teacher_end_id}, False)
  shifted = _after_prefix(teacher_tokenizer, teacher_vocab_size, teacher, teacher_prefix) if teacher_prefix else None
  index: dict = {}
  for key in student + teacher + (shifted or []):
    if key is not None:
      index.setdefault(key, len(index))
  event = lambda keys: tuple(NO_EVENT if key is None else index[key] for key in keys)
  out = (event(student), event(teacher), len(index), None if shifted is None else event(shifted))
  if max_chars <= 0:
    return out
  texts = [_covered_texts(student_tokenizer, student_vocab_size, student),
           _covered_texts(teacher_tokenizer, teacher_vocab_size, teacher)]
  for side in texts:
    for text in side:
      for c in (text or "")[1:max_chars]:
        if c != "\ufffd":
          index.setdefault(("char", c), len(index))
  offsets = tuple(_offsets(side, max_chars, index) for side in texts)
  return out[:2] + (len(index), out[3], offsets)


def _covered_texts(tokenizer, vocab_size: int, keys: list) -> list:
  """Each token id's text where its event is a character (what a cover may hold), else None."""
  texts = _texts(tokenizer)
  return [texts.get(i) if key is not None and key[0] == "char" else None for i, key in zip(range(vocab_size), keys)]


def _offsets(texts: list, max_chars: int, index: dict):
  """[max_chars, V] int32: each token's event at each character offset (module docstring)."""
  table = np.full((max_chars, len(texts)), NO_EVENT, np.int32)
  for i, text in enumerate(texts):
    if not text:
      continue
    for L in range(1, max_chars):
      if L == len(text):
        table[L, i] = ENDS_HERE
      elif L < len(text) and text[L] != "\ufffd":
        table[L, i] = index[("char", text[L])]
  return table
