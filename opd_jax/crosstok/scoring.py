"""Exact span scoring by a teacher of another tokenizer (in this process, or served: `served`).

Legend: B rows, R student response length, Pt / Rt the teacher's prompt / response length.

`CrossTokenizerScorer.score` turns a batch of student rollouts into what the span objective needs: the host
builds the teacher's view (opd_jax.crosstok.view: its prompt format, the response re-tokenized, the spans); the
teacher, teacher-forced on its own tokens, gives each teacher token its log-probability (at the sampling
temperature, as same-tokenizer scoring does); the program sums them per span and hands each student token its
span's total. The student side of each span is summed in the train step from the learner's own log-probs
(opd_jax.objectives.losses, `LossInputs.span_BxR`), so the advantage of every student token of span s is
log pi_T(s) - log pi_S(s), the exact log-ratio of the same characters under the two models.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from opd_jax.crosstok.projection import character_events
from opd_jax.crosstok.view import STATS, CrossTokenizerView
from opd_jax.errors import InputError
from opd_jax.objectives.chunked import score_tokens
from opd_jax.objectives.logprobs import Scores, response_hidden
from opd_jax.objectives.losses import ObjectiveConfig
from opd_jax.objectives.spans import span_corrections, span_total


def span_score_program(teacher_graphdef, temperature: float, logits_chunk: int, *, hidden: bool = False,
                       top_k: int = 0, top_k_temperature: float = 1.0, cover_rank=None):
  """jit (teacher_state, teacher prompt, valid, teacher response, mask, teacher_span_BxRt, student_span_BxR,
  teacher_first_BxR, fixed_logp_BxR[, teacher_cover_BxRtx4]) -> Scores on the student's tokens: logp_BxR, each
  student token's span total of the teacher's log-probs plus the span's fixed log-probs (unreadable student tokens;
  0 where unscored); with `hidden` / `top_k`, the teacher's final hidden state / top-k log-probs where it predicts
  each span's first teacher token, at the span's first student token (zeros elsewhere): what the full-distribution
  and ULD objectives read. cover_rank: the teacher vocabulary's cover ranks (opd_jax.crosstok.cover.CoverTable
  .rank_V): the spans of corrected boundaries get their cover corrections (teacher_cover_BxRtx4 and
  marginal_cover_BxRx6 are then given); with `hidden` too, the hidden state where the teacher predicted the last
  token before each span start after a corrected boundary (prev_hidden_BxRxD; the marginal form's one token back,
  opd_jax.crosstok.projection)."""
  rank_V = None if cover_rank is None else jnp.asarray(cover_rank, jnp.int32)

  def run(state, prompt_BxPt, valid_BxPt, response_BxRt, mask_BxRt, teacher_span_BxRt, student_span_BxR,
          teacher_first_BxR, fixed_logp_BxR, teacher_cover_BxRtx4=None, marginal_cover_BxRx6=None):
    model = nnx.merge(teacher_graphdef, state)
    hidden_BxRtxD = response_hidden(model, prompt_BxPt, valid_BxPt, response_BxRt, mask_BxRt)
    cover = None if rank_V is None else (teacher_cover_BxRtx4[..., :2], rank_V)
    out = score_tokens(model, hidden_BxRtxD, response_BxRt, temperature=temperature, chunk=logits_chunk,
                       top_k=top_k, top_k_temperature=top_k_temperature, cover=cover)
    at_start = lambda x_BxRtx: _at_student_starts(x_BxRtx, teacher_first_BxR)
    logp_BxR = (span_total(out["logp"] * mask_BxRt, teacher_span_BxRt, student_span_BxR)
                + span_total(fixed_logp_BxR, student_span_BxR, student_span_BxR))
    if rank_V is not None:
      logp_BxR = logp_BxR + span_corrections(out["cover_delta"] * mask_BxRt, teacher_cover_BxRtx4, student_span_BxR)
    prev_hidden_BxRxD = None
    if hidden and rank_V is not None:
      prev_BxR = jnp.where(marginal_cover_BxRx6[..., 0] >= 0, teacher_first_BxR - 1, -1)
      prev_hidden_BxRxD = _at_student_starts(hidden_BxRtxD, prev_BxR)
    return Scores(logp_BxR, at_start(hidden_BxRtxD) if hidden else None,
                  at_start(out["top_logp"]) if top_k else None, at_start(out["top_ids"]) if top_k else None,
                  prev_hidden_BxRxD)
  return jax.jit(run)


def _at_student_starts(x_BxRtx: jax.Array, teacher_first_BxR: jax.Array) -> jax.Array:
  """[B, R, ...]: row teacher_first_BxR[b, t] of x_BxRtx[b] at each span start t, zeros elsewhere."""
  index_BxR = jnp.maximum(teacher_first_BxR, 0)
  picked = jax.vmap(lambda x, i: x[i])(x_BxRtx, index_BxR)
  keep = (teacher_first_BxR >= 0).reshape(teacher_first_BxR.shape + (1,) * (x_BxRtx.ndim - 2))
  return jnp.where(keep, picked, jnp.zeros_like(picked))


@dataclasses.dataclass
class TeacherTokens:
  """A batch in the teacher's tokens, with the field names the served teacher's preflight reads."""
  prompt_BxP: np.ndarray
  prompt_valid_BxP: np.ndarray
  response_BxR: np.ndarray
  mask_BxR: np.ndarray


def _teacher_inputs(arrays: dict) -> tuple:
  """span_score_program's inputs after the teacher's state, from a CrossTokenizerView.build's arrays (with the
  teacher's covers where the view corrects boundaries)."""
  names = ("teacher_prompt_BxPt", "teacher_prompt_valid_BxPt", "teacher_response_BxRt", "teacher_mask_BxRt",
           "teacher_span_BxRt", "student_span_BxR", "teacher_first_BxR", "fixed_logp_BxR")
  covers = ("teacher_cover_BxRtx4", "marginal_cover_BxRx6") if "teacher_cover_BxRtx4" in arrays else ()
  return tuple(arrays[k] for k in names + covers)


class CrossTokenizerScorer:
  """The teacher's span scores of student rollouts (module docstring); `last_stats` holds the latest batch's
  alignment counts (opd_jax.crosstok.view.STATS), logged as cross_tokenizer/*."""

  def __init__(self, view: CrossTokenizerView, teacher_graphdef, temperature: float, logits_chunk: int, put_batch,
               objective: ObjectiveConfig = ObjectiveConfig(), served=None):
    """served: the client of the same teacher served elsewhere (opd_jax.serving.client): it scores the teacher's own
    tokens over the wire (the span form only: log-probs of the sampled text), spans are summed here."""
    self.view, self.put_batch, self.served = view, put_batch, served
    self._span_sums = jax.jit(span_total)
    self.last_arrays: dict = {}  # the latest batch's teacher-side arrays, on the host (the served preflight's)
    covers = view.covers
    if covers is not None and served is not None:
      raise InputError("cross_tokenizer.boundaries='corrected' needs the teacher's whole next-token distribution at "
                       "corrected boundaries, which a served teacher does not send; score it in this process or use "
                       "boundaries='settled'")
    self._program = span_score_program(
        teacher_graphdef, temperature, logits_chunk, hidden=objective.needs_teacher_hidden,
        top_k=objective.top_k if objective.needs_teacher_topk else 0, top_k_temperature=objective.temperature,
        cover_rank=None if covers is None else covers[1].rank_V)
    self.last_stats: dict = {}
    self.projection: tuple | None = None  # set by `build` for the full-distribution form (character_events)

  def score(self, teacher_state, index_B, tokens_BxR, mask_BxR) -> tuple[Scores, jax.Array]:
    """(the teacher's Scores on the student's tokens (span_score_program), student_span_BxR) on the learner's
    batch layout."""
    host = lambda x: np.asarray(jax.device_get(x))
    arrays, self.last_stats = self.view.build(np.asarray(index_B), host(tokens_BxR), host(mask_BxR))
    self.last_arrays = arrays
    put = {k: self.put_batch(v) for k, v in arrays.items()}
    if self.served is not None:  # the teacher's own tokens over the wire, their span totals here
      logp_BxRt = self.served.score(*_teacher_inputs(arrays)[:4])[0]
      span_logp_BxR = (self._span_sums(self.put_batch(logp_BxRt), put["teacher_span_BxRt"], put["student_span_BxR"])
                       + self._span_sums(put["fixed_logp_BxR"], put["student_span_BxR"], put["student_span_BxR"]))
      return Scores(span_logp_BxR), put["student_span_BxR"]
    return self._program(teacher_state, *_teacher_inputs(put)), put["student_span_BxR"]

  def student_cover(self):
    """The latest batch's student_cover_BxRx4 (opd_jax.crosstok.view) on the learner's layout where the view
    corrects boundaries (the train step adds the student's cover corrections to its span totals); None otherwise."""
    if "student_cover_BxRx4" not in self.last_arrays:
      return None
    return self.put_batch(self.last_arrays["student_cover_BxRx4"])

  def marginal_cover(self):
    """The latest batch's marginal_cover_BxRx6 (opd_jax.crosstok.view) on the learner's layout for the marginal
    form with corrected boundaries (`projection` has its offset tables); None otherwise."""
    if self.projection is None or len(self.projection) < 5:
      return None
    return self.put_batch(self.last_arrays["marginal_cover_BxRx6"])

  def after_prefix(self):
    """The latest batch's after_prefix_BxR (opd_jax.crosstok.view) on the learner's layout, for the marginal form
    with a response prefix (`projection` has its fourth table); None otherwise."""
    if self.projection is None or self.projection[3] is None:
      return None
    return self.put_batch(self.last_arrays["after_prefix_BxR"])

  def teacher_batch(self) -> "TeacherTokens":
    """The latest batch as the teacher read it (prompt, valid, response, mask on the host): what a served teacher's
    preflight compares with the checkpoint's own scoring."""
    a = self.last_arrays
    return TeacherTokens(a["teacher_prompt_BxPt"], a["teacher_prompt_valid_BxPt"], a["teacher_response_BxRt"],
                         a["teacher_mask_BxRt"])

  def metrics(self) -> dict:
    """The latest batch's alignment as metrics (`alignment_metrics`)."""
    return alignment_metrics(self.last_stats)


def alignment_metrics(s: dict) -> dict:
  """Alignment counts (opd_jax.crosstok.view.STATS) as metrics: shares of spans and student tokens scored, student
  and teacher tokens per scored span, and the counts of what was not scored; {} without counts."""
  if not s:
    return {}
  per = lambda a, b: float(a) / max(float(b), 1.0)
  out = {"cross_tokenizer/span_share": per(s["spans_scored"], s["spans"]),
         "cross_tokenizer/token_share": per(s["tokens_scored"], s["tokens"]),
         "cross_tokenizer/student_tokens_per_span": per(s["tokens_scored"], s["spans_scored"]),
         "cross_tokenizer/teacher_tokens_per_span": per(s["teacher_tokens_scored"], s["spans_scored"])}
  out.update({f"cross_tokenizer/{k}": float(s[k]) for k in STATS if k not in ("spans", "tokens")})
  return out


class SpanKL:
  """Held-out KL(student || teacher) across tokenizers, with the signature of evaluation.make_kl_fn's programs:
  (student_state, teacher_state, prompt, valid, response, mask) -> (total, count). The k1 estimate on the
  student's own responses: the sum over scored spans of log pi_S(span) - log pi_T(span) (both at temperature 1),
  over the scored student tokens. It is a sampled estimate of the sequences' KL, not the exact per-token
  vocabulary KL of a same-tokenizer run, so it is logged under its own name (`metric`)."""

  metric = "span_reverse_kl"

  def __init__(self, view: CrossTokenizerView, student_graphdef, teacher_graphdef, logits_chunk: int, put_batch):
    self.view, self.put_batch = view, put_batch
    covers = view.covers
    self._teacher = span_score_program(teacher_graphdef, 1.0, logits_chunk,
                                       cover_rank=None if covers is None else covers[1].rank_V)
    rank_V = None if covers is None else jnp.asarray(covers[0].rank_V, jnp.int32)

    def student(state, prompt_BxP, valid_BxP, response_BxR, mask_BxR, span_BxR, teacher_span_logp_BxR, cover_BxRx4):
      model = nnx.merge(student_graphdef, state)
      hidden_BxRxD = response_hidden(model, prompt_BxP, valid_BxP, response_BxR, mask_BxR)
      out = score_tokens(model, hidden_BxRxD, response_BxR, temperature=1.0, chunk=logits_chunk,
                         cover=None if rank_V is None else (cover_BxRx4[..., :2], rank_V))
      scored_BxR = mask_BxR * (span_BxR >= 0)
      teacher_BxR = teacher_span_logp_BxR
      if rank_V is not None:  # the student's cover corrections: compare character-level span log-probs
        teacher_BxR = teacher_BxR - span_corrections(out["cover_delta"] * mask_BxR, cover_BxRx4, span_BxR)
      share_BxR = teacher_BxR / jnp.maximum(span_total(scored_BxR, span_BxR, span_BxR), 1.0)
      return jnp.sum((out["logp"] - share_BxR) * scored_BxR), jnp.sum(scored_BxR)
    self._student = jax.jit(student)

  def __call__(self, student_state, teacher_state, prompt_BxP, valid_BxP, response_BxR, mask_BxR):
    host = lambda x: np.asarray(jax.device_get(x))
    index_B = self.view.lookup(host(prompt_BxP), host(valid_BxP))
    arrays, _ = self.view.build(index_B, host(response_BxR), host(mask_BxR))
    put = {k: self.put_batch(v) for k, v in arrays.items()}
    teacher_BxR = self._teacher(teacher_state, *_teacher_inputs(put)).logp_BxR
    return self._student(student_state, prompt_BxP, valid_BxP, response_BxR, mask_BxR, put["student_span_BxR"],
                         teacher_BxR, put.get("student_cover_BxRx4"))


def _covers(cross, student_tokenizer, teacher, eos_ids, student_vocab_size: int, teacher_vocab_size: int):
  """(student, teacher) CoverTables with cross.boundaries == "corrected", else None."""
  if cross.boundaries != "corrected":
    return None
  from opd_jax.crosstok.cover import CoverTable
  from opd_jax.crosstok.view import special_ids
  return (CoverTable(student_tokenizer, student_vocab_size, special_ids(student_tokenizer) | set(eos_ids)),
          CoverTable(teacher, teacher_vocab_size, special_ids(teacher)))


def build(cross, *, student_tokenizer, teacher_dir: str, problems: list, eos_ids: tuple[int, ...],
          max_prompt_tokens: int, max_new_tokens: int, use_chat_template: bool, prompt_format: str = "",
          student_graphdef, teacher_graphdef,
          temperature: float, logits_chunk: int, put_batch, objective: ObjectiveConfig, student_vocab_size: int,
          teacher_vocab_size: int, served=None) -> tuple[CrossTokenizerScorer, SpanKL]:
  """The run's scorer (with the common events the exact vocabulary objectives need, as `.projection`) and
  held-out span KL for a CrossTokenizerSpec `cross` (enabled). problems: the training problems (batch indices
  refer to them) followed by the held-out ones. served: a served teacher's client (the span form over the wire)."""
  from opd_jax.data.batching import encode_prompts
  from opd_jax.models import load_tokenizer
  prompt_tokens, response_tokens = cross.lengths(max_prompt_tokens, max_new_tokens)
  teacher = load_tokenizer(teacher_dir)
  view = CrossTokenizerView(student_tokenizer, teacher, cross.teacher_format,
                            [p.prompt for p in problems], eos_ids, teacher_end=cross.teacher_end,
                            response_prefix=cross.teacher_response_prefix,
                            max_prompt=prompt_tokens, max_response=response_tokens,
                            covers=_covers(cross, student_tokenizer, teacher, eos_ids, student_vocab_size,
                                           teacher_vocab_size))
  view.register_student_prompts(*encode_prompts(student_tokenizer, problems, max_prompt_tokens, use_chat_template,
                                                prompt_format=prompt_format))
  scorer = CrossTokenizerScorer(view, teacher_graphdef, temperature, logits_chunk, put_batch, objective, served)
  if objective.needs_teacher_hidden:
    longest = 0 if view.covers is None else max(view.covers[0].longest, view.covers[1].longest)
    scorer.projection = character_events(student_tokenizer, view.teacher, student_vocab_size,
                                         teacher_vocab_size, eos_ids, view.end_id, view.prefix,
                                         max_chars=longest + 1 if longest else 0)
  return scorer, SpanKL(view, student_graphdef, teacher_graphdef, logits_chunk, put_batch)
