"""Exact span scoring by an in-process teacher of another tokenizer.

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

import jax
import numpy as np
from flax import nnx

from opd_jax.crosstok.view import STATS, CrossTokenizerView
from opd_jax.objectives.logprobs import response_hidden
from opd_jax.objectives.chunked import score_tokens
from opd_jax.objectives.spans import span_total


def span_score_program(teacher_graphdef, temperature: float, logits_chunk: int):
  """jit (teacher_state, teacher prompt, valid, teacher response, mask, teacher_span_BxRt, student_span_BxR) ->
  [B, R] float32: each student token's span total of the teacher's log-probs (0 where unscored)."""
  def run(state, prompt_BxPt, valid_BxPt, response_BxRt, mask_BxRt, teacher_span_BxRt, student_span_BxR):
    model = nnx.merge(teacher_graphdef, state)
    hidden_BxRtxD = response_hidden(model, prompt_BxPt, valid_BxPt, response_BxRt, mask_BxRt)
    logp_BxRt = score_tokens(model, hidden_BxRtxD, response_BxRt, temperature=temperature,
                             chunk=logits_chunk)["logp"] * mask_BxRt
    return span_total(logp_BxRt, teacher_span_BxRt, student_span_BxR)
  return jax.jit(run)


class CrossTokenizerScorer:
  """The teacher's span scores of student rollouts (module docstring); `last_stats` holds the latest batch's
  alignment counts (opd_jax.crosstok.view.STATS), logged as cross_tokenizer/*."""

  def __init__(self, view: CrossTokenizerView, teacher_graphdef, temperature: float, logits_chunk: int, put_batch):
    self.view, self.put_batch = view, put_batch
    self._program = span_score_program(teacher_graphdef, temperature, logits_chunk)
    self.last_stats: dict = {}

  def score(self, teacher_state, index_B, tokens_BxR, mask_BxR) -> tuple[jax.Array, jax.Array]:
    """(teacher span log-prob per student token [B, R], student_span_BxR) on the learner's batch layout."""
    host = lambda x: np.asarray(jax.device_get(x))
    arrays, self.last_stats = self.view.build(np.asarray(index_B), host(tokens_BxR), host(mask_BxR))
    put = {k: self.put_batch(v) for k, v in arrays.items()}
    span_logp_BxR = self._program(teacher_state, put["teacher_prompt_BxPt"], put["teacher_prompt_valid_BxPt"],
                                  put["teacher_response_BxRt"], put["teacher_mask_BxRt"], put["teacher_span_BxRt"],
                                  put["student_span_BxR"])
    return span_logp_BxR, put["student_span_BxR"]

  def metrics(self) -> dict:
    """The latest batch's alignment as metrics: shares of spans and student tokens scored, student and teacher
    tokens per scored span, and the counts of what was not scored."""
    s = self.last_stats
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
    self._teacher = span_score_program(teacher_graphdef, 1.0, logits_chunk)

    def student(state, prompt_BxP, valid_BxP, response_BxR, mask_BxR, span_BxR, teacher_span_logp_BxR):
      model = nnx.merge(student_graphdef, state)
      hidden_BxRxD = response_hidden(model, prompt_BxP, valid_BxP, response_BxR, mask_BxR)
      logp_BxR = score_tokens(model, hidden_BxRxD, response_BxR, temperature=1.0, chunk=logits_chunk)["logp"]
      scored_BxR = mask_BxR * (span_BxR >= 0)
      share_BxR = teacher_span_logp_BxR / jax.numpy.maximum(span_total(scored_BxR, span_BxR, span_BxR), 1.0)
      return jax.numpy.sum((logp_BxR - share_BxR) * scored_BxR), jax.numpy.sum(scored_BxR)
    self._student = jax.jit(student)

  def __call__(self, student_state, teacher_state, prompt_BxP, valid_BxP, response_BxR, mask_BxR):
    host = lambda x: np.asarray(jax.device_get(x))
    index_B = self.view.lookup(host(prompt_BxP), host(valid_BxP))
    arrays, _ = self.view.build(index_B, host(response_BxR), host(mask_BxR))
    put = {k: self.put_batch(v) for k, v in arrays.items()}
    teacher_BxR = self._teacher(teacher_state, put["teacher_prompt_BxPt"], put["teacher_prompt_valid_BxPt"],
                                put["teacher_response_BxRt"], put["teacher_mask_BxRt"], put["teacher_span_BxRt"],
                                put["student_span_BxR"])
    return self._student(student_state, prompt_BxP, valid_BxP, response_BxR, mask_BxR, put["student_span_BxR"],
                         teacher_BxR)


def build(cross, *, student_tokenizer, teacher_dir: str, problems: list, eos_ids: tuple[int, ...],
          max_prompt_tokens: int, max_new_tokens: int, use_chat_template: bool, student_graphdef, teacher_graphdef,
          temperature: float, logits_chunk: int, put_batch) -> tuple[CrossTokenizerScorer, SpanKL]:
  """The run's scorer and held-out span KL for a CrossTokenizerSpec `cross` (enabled). problems: the training
  problems (batch indices refer to them) followed by the held-out ones."""
  from opd_jax.data.batching import encode_prompts
  from opd_jax.models import load_tokenizer
  prompt_tokens, response_tokens = cross.lengths(max_prompt_tokens, max_new_tokens)
  view = CrossTokenizerView(student_tokenizer, load_tokenizer(teacher_dir), cross.teacher_format,
                            [p.prompt for p in problems], eos_ids, teacher_end=cross.teacher_end,
                            max_prompt=prompt_tokens, max_response=response_tokens)
  view.register_student_prompts(*encode_prompts(student_tokenizer, problems, max_prompt_tokens, use_chat_template))
  return (CrossTokenizerScorer(view, teacher_graphdef, temperature, logits_chunk, put_batch),
          SpanKL(view, student_graphdef, teacher_graphdef, logits_chunk, put_batch))
