"""The student-to-teacher token projection of the full-distribution cross-tokenizer objective.

Legend: Vs / Vt the student's / teacher's vocabulary.

At a position where both tokenizations start a span, both models predict the same next characters. The student's
distribution over its tokens is carried into the teacher's vocabulary by mapping each student token to the first
teacher token of the teacher's own tokenization of that token's text (X-Token's idea, arXiv 2605.21699, here as
a single first-token map built once from the two vocabularies): q(t) = sum of p_S(s) over the student tokens s
mapped to t, renormalized over the mapped tokens. The student's EOS maps to the teacher's end token; another
special token maps to the teacher token spelled the same, if any; a token whose text the teacher cannot spell back
(an unknown token, a partial UTF-8 byte) maps nowhere (-1) and its mass leaves q.

With one vocabulary on both sides the map is the identity and there is nothing to project: `first_token_projection`
returns None and the objective is today's exact reverse KL.
"""

from __future__ import annotations

from opd_jax.crosstok.view import special_ids

UNMAPPED = -1


def first_token_projection(student_tokenizer, teacher_tokenizer, student_vocab_size: int, eos_ids: tuple[int, ...],
                           teacher_end_id: int | None) -> tuple[int, ...] | None:
  """Per student token id < student_vocab_size: its teacher token id, or UNMAPPED; None for identical vocabularies.
  Costs one decode and one encode per student token (~1 s for 50k tokens)."""
  student_vocab, teacher_vocab = student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
  if student_vocab == teacher_vocab:
    return None
  specials, unk = special_ids(student_tokenizer), getattr(teacher_tokenizer, "unk_token_id", None)
  out = [UNMAPPED] * student_vocab_size
  for token, s in student_vocab.items():
    if s >= student_vocab_size:
      continue
    if s in eos_ids:
      out[s] = UNMAPPED if teacher_end_id is None else teacher_end_id
      continue
    if s in specials:
      out[s] = teacher_vocab.get(token, UNMAPPED)
      continue
    text = student_tokenizer.decode([s], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if not text or "\ufffd" in text:
      continue
    ids = teacher_tokenizer.encode(text, add_special_tokens=False)
    spelled = teacher_tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if ids and spelled == text and ids[0] != unk:
      out[s] = ids[0]
  return tuple(out)
