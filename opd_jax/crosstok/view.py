"""The teacher's view of a batch of student rollouts when the two tokenizers differ (host side, numpy).

Legend: B rows, R student response length, Pt / Rt the teacher's prompt / response length (static).

For each row the student's response tokens are decoded to text; the teacher reads its own rendering of the row's
prompt (opd_jax.models.prompt_format) followed by `response_prefix` and that text, tokenized together by its own
tokenizer (a teacher token of prefix only is context, in no span), and the two
tokenizations are aligned into spans (opd_jax.crosstok.align). What is never scored, and counted instead:
  - a span holding a teacher token that is the teacher's unknown token, or no teacher token (`spans_unscorable`);
  - everything after a student special token inside the response (chat-format tokens are not text the teacher
    could produce; `tokens_special`);
  - a row whose text the teacher's tokenizer does not spell back exactly (normalization, unknown characters;
    `rows_not_round_tripped`);
  - spans whose teacher tokens run past Rt (`spans_truncated`);
  - the last span of a response cut before its end was settled (a number cut after its first digit), in
    `spans_unscorable`.
Student tokens the teacher cannot read -- a special token inside the response (the first one), a token that spells
nothing (a padded embedding row) -- are not free: each one's span gets the teacher log-probability
UNREADABLE_LOGP on top of its teacher tokens' (`fixed_logp_BxR`; counted as `tokens_unreadable`). Left free, the
span objectives would reward them: they lower the student's log-prob of a span whose teacher log-prob they leave
unchanged (pairx's student learned to write padded rows until its answers were gone).
Shared boundaries where the two tokenizations stand for different events are not span ends
(opd_jax.crosstok.boundaries; counted as `boundaries_unsettled`), unless the view corrects them (`covers`: the
span form with cross_tokenizer.boundaries="corrected"): then each such boundary ends a span, and its last token on
either side carries its cover (opd_jax.crosstok.cover) in student_cover_BxRx4 / teacher_cover_BxRtx4 (lo, hi,
the span it ends, the span after it), which the scoring programs turn into character-level span log-probs
(counted as `boundaries_corrected`; a boundary whose last token on either side has no cover stays unsettled).
At the first student token of the span after a corrected boundary, marginal_cover_BxRx6 holds both last tokens'
covers and lengths (student lo, hi, characters, teacher lo, hi, characters; -1 elsewhere): the marginal form
turns each side's next-token distribution there into the character-level one (opd_jax.crosstok.projection).
A response that ended with one of the student's EOS ids ends with one span more: that EOS token against the
teacher's end token (`teacher_end`, by default its tokenizer's EOS), so the student learns when the teacher
would stop (joining the last span when the text's end is not settled). Without a teacher end token the EOS is
not scored.
"""

from __future__ import annotations

import math

import numpy as np

from opd_jax.crosstok.align import UNSCORED, align, shared_ends, token_ends
from opd_jax.crosstok.boundaries import BoundaryProbe, settled
from opd_jax.crosstok.cover import NONE
from opd_jax.models.prompt_format import PromptFormat
from opd_jax.errors import InputError

UNREADABLE_LOGP = math.log(1e-30)  # the teacher's log-prob of a student token it cannot read: what a probability
# of 0 clamps to in the marginal objectives (opd_jax.objectives.marginal.divergence_marginalized)
STATS = ("spans", "spans_scored", "spans_unscorable", "spans_truncated", "tokens", "tokens_scored",
         "tokens_special", "teacher_tokens_scored", "rows_not_round_tripped", "boundaries_unsettled",
         "tokens_unreadable", "boundaries_corrected")


def _decoder(tokenizer):
  return lambda ids: tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def special_ids(tokenizer) -> set[int]:
  ids = set(getattr(tokenizer, "all_special_ids", []) or [])
  ids |= {int(i) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(t, "special", False)}
  return ids


class CrossTokenizerView:
  """Teacher-side arrays of student rollouts (module docstring). prompts: the text of every problem a batch may
  index (its `index_B`), rendered once here; eos_ids: the student's EOS ids."""

  def __init__(self, student_tokenizer, teacher_tokenizer, teacher_format: str, prompts: list[str],
               eos_ids: tuple[int, ...], *, teacher_end: str = "", response_prefix: str = "", max_prompt: int,
               max_response: int, covers: tuple | None = None):
    self.student, self.teacher, self.prefix = student_tokenizer, teacher_tokenizer, response_prefix
    self.format = PromptFormat(teacher_format, teacher_tokenizer)
    self.eos_ids, self.max_prompt, self.max_response = set(eos_ids), max_prompt, max_response
    self.specials = special_ids(student_tokenizer) - self.eos_ids
    self.unk = getattr(teacher_tokenizer, "unk_token_id", None)
    end = teacher_end or getattr(teacher_tokenizer, "eos_token", None) or ""
    self.end_id = None
    if end:
      ids = teacher_tokenizer.encode(end, add_special_tokens=False)
      if len(ids) != 1:
        raise InputError(f"cross_tokenizer.teacher_end={end!r} is {len(ids)} tokens of the teacher's tokenizer, not "
                         "one; name the teacher's end-of-response token (e.g. '<end_of_turn>' or '<eos>')")
      self.end_id = ids[0]
    self.prompt_ids = [self.format.ids(p) for p in prompts]
    longest = max(range(len(prompts)), key=lambda i: len(self.prompt_ids[i]), default=None)
    if longest is not None and len(self.prompt_ids[longest]) > max_prompt:
      raise InputError(f"problem {longest}'s prompt is {len(self.prompt_ids[longest])} tokens in the teacher's "
                       f"format, above cross_tokenizer.max_teacher_prompt_tokens={max_prompt}; raise it")
    self._s_decode, self._t_decode = _decoder(student_tokenizer), _decoder(teacher_tokenizer)
    self._s_probe, self._t_probe = BoundaryProbe(student_tokenizer), BoundaryProbe(teacher_tokenizer)
    self._empty: dict[int, bool] = {}  # student token -> whether it spells nothing
    self.covers = covers  # (student CoverTable, teacher CoverTable): correct unsettled boundaries (docstring)

  def register_student_prompts(self, prompt_NxP: np.ndarray, valid_NxP: np.ndarray) -> None:
    """The student's encoding of each of `prompts` (data.batching.encode_prompts), so that `lookup` finds a
    batch's problems from its prompt tokens alone (held-out evaluation batches carry no problem indices)."""
    self._by_prompt = {tuple(row[ok].tolist()): i for i, (row, ok) in enumerate(zip(prompt_NxP, valid_NxP))}

  def lookup(self, prompt_BxP: np.ndarray, valid_BxP: np.ndarray) -> np.ndarray:
    """The problem index of each row's prompt tokens (`register_student_prompts`)."""
    out = []
    for row, ok in zip(prompt_BxP, valid_BxP.astype(bool)):
      index = self._by_prompt.get(tuple(row[ok].tolist()))
      if index is None:
        raise InputError("a prompt reached the cross-tokenizer teacher that the run did not register; score only "
                         "the run's training and held-out problems")
      out.append(index)
    return np.asarray(out, np.int64)

  def build(self, index_B: np.ndarray, response_BxR: np.ndarray, mask_BxR: np.ndarray) -> tuple[dict, dict]:
    """(arrays, stats): teacher_prompt_BxPt (left-padded) / teacher_prompt_valid_BxPt, teacher_response_BxRt /
    teacher_mask_BxRt (right-padded), teacher_span_BxRt and student_span_BxR (each token's span in its row, or
    UNSCORED), teacher_first_BxR (at the first student token of each scored span: the index of the span's first
    teacher token, where both models predict the span's start from the same text; UNSCORED elsewhere),
    fixed_logp_BxR (UNREADABLE_LOGP at each scored token the teacher cannot read, 0 elsewhere: added to its span's
    teacher log-prob), after_prefix_BxR (1 at a row's first student token where the teacher's first token holds the
    whole response prefix and the text's first characters), and the counts of STATS over the batch."""
    B, R = response_BxR.shape
    out = {"teacher_prompt_BxPt": np.zeros((B, self.max_prompt), np.int32),
           "teacher_prompt_valid_BxPt": np.zeros((B, self.max_prompt), bool),
           "teacher_response_BxRt": np.zeros((B, self.max_response), np.int32),
           "teacher_mask_BxRt": np.zeros((B, self.max_response), np.float32),
           "teacher_span_BxRt": np.full((B, self.max_response), UNSCORED, np.int32),
           "student_span_BxR": np.full((B, R), UNSCORED, np.int32),
           "teacher_first_BxR": np.full((B, R), UNSCORED, np.int32),
           "fixed_logp_BxR": np.zeros((B, R), np.float32),
           "after_prefix_BxR": np.zeros((B, R), np.float32)}
    if self.covers is not None:
      out["student_cover_BxRx4"] = np.full((B, R, 4), -1, np.int32)
      out["teacher_cover_BxRtx4"] = np.full((B, self.max_response, 4), -1, np.int32)
      out["marginal_cover_BxRx6"] = np.full((B, R, 6), -1, np.int32)
    stats = dict.fromkeys(STATS, 0)
    for b in range(B):
      prompt = self.prompt_ids[int(index_B[b])]
      out["teacher_prompt_BxPt"][b, self.max_prompt - len(prompt):] = prompt
      out["teacher_prompt_valid_BxPt"][b, self.max_prompt - len(prompt):] = True
      ids = [int(t) for t in response_BxR[b, :int(np.sum(mask_BxR[b] > 0))]]
      stats["tokens"] += len(ids)
      self._row(ids, out, b, stats)
    return out, stats

  def _spells_nothing(self, token: int) -> bool:
    if token not in self._empty:
      self._empty[token] = self._s_decode([token]) == ""
    return self._empty[token]

  def _correctable(self, unsettled: set[int], s_end: list, t_end: list, body: list[int], t_ids: list[int],
                   length: int, ended: bool) -> dict[int, tuple[int, int]]:
    """{boundary: (its last student token, its last teacher token)} of the `unsettled` shared boundaries the view
    corrects: both last tokens have a cover; not the text's end when an EOS follows it (the EOS joins the last
    span, and "the text, then the end" is one event on both sides). {} without covers."""
    if self.covers is None:
      return {}
    last_s = {e: k for k, e in enumerate(s_end) if e}
    last_t = {e: j for j, e in enumerate(t_end) if e}
    out = {}
    for e in sorted(unsettled):
      if e == length and ended and self.end_id is not None:
        continue
      k, j = last_s[e], last_t[e]
      if self.covers[0].cover(body[k]) != NONE and self.covers[1].cover(t_ids[j]) != NONE:
        out[e] = (k, j)
    return out

  def _write_covers(self, out: dict, b: int, corrected: dict, body: list[int], t_ids: list[int], s_span: list[int],
                    spans: int, starts: set[int], first_teacher: dict) -> None:
    """Row b's covers of the last tokens of each corrected boundary, with the spans they end and start, and both
    at the first student token of the span after it (marginal_cover_BxRx6)."""
    for k, j in corrected.values():
      span, after = s_span[k], (s_span[k] + 1 if s_span[k] + 1 < spans else UNSCORED)
      out["student_cover_BxRx4"][b, k] = (*self.covers[0].cover(body[k]), span, after)
      if j < self.max_response:
        out["teacher_cover_BxRtx4"][b, j] = (*self.covers[1].cover(t_ids[j]), span, after)
        if k + 1 in starts and first_teacher[s_span[k + 1]] == j + 1:
          out["marginal_cover_BxRx6"][b, k + 1] = (*self.covers[0].cover(body[k]), self.covers[0].length(body[k]),
                                                   *self.covers[1].cover(t_ids[j]), self.covers[1].length(t_ids[j]))

  def _row(self, ids: list[int], out: dict, b: int, stats: dict) -> None:
    ended = bool(ids) and ids[-1] in self.eos_ids
    body = ids[:-1] if ended else ids
    cut = next((k for k, t in enumerate(body) if t in self.specials), None)
    if cut is not None:
      stats["tokens_special"] += len(ids) - cut - 1  # the tokens after it (it is scored, as unreadable)
      body, ended = body[:cut], False
    unreadable = [k for k, t in enumerate(body) if self._spells_nothing(t)] + ([cut] if cut is not None else [])
    text = self._s_decode(body)
    # The teacher reads response_prefix + text (e.g. the space its examples put after "A:"), tokenized together so
    # the prefix joins the first word as the teacher's own tokenization does; a teacher token of prefix only is
    # context, in no span.
    t_text, shift = self.prefix + text, len(self.prefix)
    t_ids = list(self.teacher.encode(t_text, add_special_tokens=False))
    if self._t_decode(t_ids) != t_text:
      stats["rows_not_round_tripped"] += 1
      return
    t_end = [None if e is None else e - shift for e in token_ends(self._t_decode, t_ids, t_text)]
    context = [e is not None and e <= 0 for e in t_end]
    # the teacher's first token of text merged the whole prefix ("▁The" for " " + "The"): the marginal form reads
    # the character after the prefix there (opd_jax.crosstok.projection)
    first = next((j for j, c in enumerate(context) if not c), None)
    merged = shift > 0 and first == 0
    end_settled = True
    if text:
      s_end, t_end = token_ends(self._s_decode, body, text), [None if c else e for c, e in zip(context, t_end)]
      shared = shared_ends(s_end, t_end) | {len(text)}
      allowed = settled(self._s_probe, self._t_probe, text, sorted(shared), self.prefix)
      corrected = self._correctable(shared - allowed, s_end, t_end, body, t_ids, len(text), ended)
      allowed = allowed | set(corrected)
      stats["boundaries_unsettled"] += len(shared - allowed - {len(text)})
      stats["boundaries_corrected"] += len(corrected)
      end_settled = len(text) in allowed
      alignment = align(s_end, t_end, [t != self.unk for t in t_ids], len(text), allowed)
      s_span, valid = list(alignment.student_span), list(alignment.valid)
      t_span = [UNSCORED if c else s for c, s in zip(context, alignment.teacher_span)]
    else:  # nothing but the EOS (or tokens that spell nothing): no span of text
      s_span, t_span, valid, corrected = [UNSCORED] * len(body), [UNSCORED] * len(t_ids), [], {}
    if ended and self.end_id is not None:  # the student's EOS against the teacher's end token
      if end_settled:  # a span of its own
        valid.append(True)
      s_span.append(len(valid) - 1)  # else it joins the last span, whose end the next character still decided
      t_span.append(len(valid) - 1)
      t_ids.append(self.end_id)
    elif not end_settled:  # cut where the next character could still change what the last span means
      valid[-1] = False
    if cut is not None:  # the special token joins the last span (unreadable: scored below)
      s_span.append(len(valid) - 1 if valid else UNSCORED)
    for k in unreadable:  # a token that spells nothing is in the span of the text before it (the first, if none)
      s_span[k] = s_span[k] if s_span[k] != UNSCORED or not valid else 0
    stats["spans"] += len(valid)
    stats["spans_unscorable"] += len(valid) - sum(valid)
    for j in range(self.max_response, len(t_ids)):  # teacher tokens past Rt: their spans cannot be scored
      if t_span[j] != UNSCORED and valid[t_span[j]]:
        valid[t_span[j]] = False
        stats["spans_truncated"] += 1
    t_ids, t_span = t_ids[:self.max_response], t_span[:self.max_response]
    out["teacher_response_BxRt"][b, :len(t_ids)] = t_ids
    out["teacher_mask_BxRt"][b, :len(t_ids)] = 1.0
    scored = lambda span: span != UNSCORED and valid[span]
    out["teacher_span_BxRt"][b, :len(t_ids)] = [s if scored(s) else UNSCORED for s in t_span]
    out["student_span_BxR"][b, :len(s_span)] = [s if scored(s) else UNSCORED for s in s_span]
    first_teacher = {}
    for j, span in enumerate(t_span):
      first_teacher.setdefault(span, j)
    starts = [k for k, span in enumerate(s_span) if scored(span) and (k == 0 or s_span[k - 1] != span)]
    out["teacher_first_BxR"][b, starts] = [first_teacher[s_span[k]] for k in starts]
    if merged and starts[:1] == [0] and first_teacher[s_span[0]] == 0:
      out["after_prefix_BxR"][b, 0] = 1.0
    self._write_covers(out, b, corrected, body, t_ids, s_span, len(valid), set(starts), first_teacher)
    unreadable = [k for k in unreadable if scored(s_span[k])]
    out["fixed_logp_BxR"][b, unreadable] = UNREADABLE_LOGP
    stats["tokens_unreadable"] += len(unreadable)
    stats["spans_scored"] += sum(valid)
    stats["tokens_scored"] += sum(map(scored, s_span))
    stats["teacher_tokens_scored"] += sum(map(scored, t_span))
