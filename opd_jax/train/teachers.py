"""The teachers of a run as one set: config.teacher alone (a one-entry set) or several, each prompt scored by one of
them (config.teachers, config.routing; their specs and checks are in opd_jax/spec/teachers.py).

Legend: B rows, P prompt length, R response length, K top-k, N teachers.

Teachers: config.teacher (called routing.teacher_name in routes and logs) and every entry of config.teachers,
{"checkpoint": HF dir, "endpoint": "" or a served teacher's URL}. Every teacher needs its checkpoint here: the
held-out evaluation measures each prompt's KL to its own teacher in this process, and a served one is
preflighted against it.

Routing: a prompt goes to the teacher its JSONL row names in "teacher"; else to the first of routing.rules
((regex, teacher name), ...) whose regex is found in the prompt text; else to config.teacher. Routes are fixed
per problem before training (`opd_jax.spec.Teachers.route`), so a resumed run routes alike.

Scoring (`TeacherSet`): an in-process teacher scores the whole batch with the rows routed elsewhere masked out
(the batch keeps its shape: one compiled program per teacher whatever the split) and is skipped for a batch
with none of its rows; a served teacher is sent only its own rows. Each row carries its own teacher's
log-probs (and top-k). Teachers have heads of their own, so the train step cannot recompute a row's teacher
logits from hidden states: multi-teacher runs train on per-token log-probs (reverse_kl_pg, grpo) or top-k
(*_topk); an exact objective becomes its top-k form over the whole vocabulary where the vocabulary is small
(as with a served teacher, ObjectiveConfig.over_the_wire), else it is refused. The train step logs, per teacher,
the k1 and k3 estimates of KL(student || teacher) over that teacher's tokens and their count
(`teachers/<name>/...`, opd_jax/train/step.py).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from flax import nnx

from opd_jax.models import read_hf_config
from opd_jax.models.tokenizer_compat import check_pair
from opd_jax.objectives.logprobs import Scores
from opd_jax.spec import RunSpec
from opd_jax.train import distributed, programs
from opd_jax.train import served as served_lib
from opd_jax.train.evaluation import make_kl_fn


@dataclasses.dataclass
class RoutedTeacher:
  """One teacher of the run: in-process (state + its scoring program) or served (client)."""
  name: str
  graphdef: object
  state: object
  score: object  # jit (state, prompt, valid, response, mask) -> Scores (programs.teacher_score_program)
  served: object = None  # an opd_jax.serving.client.ServedTeacher, or None (in this process)
  kl_fn: object = None  # the evaluation's reverse KL program for this teacher (programs.make_kl_fn)
  cross: object = None  # a teacher of another tokenizer: its opd_jax.crosstok.scoring.CrossTokenizerScorer


def connect(spec: RunSpec, main: RoutedTeacher, *, student_graphdef, settings, tokenizer, mesh, put_batch,
            load, cross_for=None) -> "TeacherSet":
  """Every teacher of the run: `main` (config.teacher, loaded by the run's setup, with its client when served)
  first, then every other entry of spec.teachers loaded (load(checkpoint, its PairVocab) -> model) and
  connected, with its scoring and evaluation-KL programs built by the run's builders. cross_for(teacher spec,
  graphdef) -> (CrossTokenizerScorer, SpanKL): each teacher's own view with cross_tokenizer.enabled."""
  teachers, student = [main], read_hf_config(spec.pair.student)
  try:
    for teacher in spec.teachers.specs[1:]:
      vocab = spec.vocab if cross_for is not None else check_pair(
          teacher.checkpoint, spec.pair.student, read_hf_config(teacher.checkpoint), student,
          tokenizer_dir=spec.pair.tokenizer or None)
      graphdef, state = nnx.split(load(teacher.checkpoint, vocab))
      cross, span_kl = cross_for(teacher, graphdef) if cross_for is not None else (None, None)
      teachers.append(RoutedTeacher(
          teacher.name, graphdef, state,
          programs.teacher_score_program(graphdef, spec.objective, settings.rollout.temperature,
                                         settings.logits_chunk, settings.micro_batch_size, mesh),
          served_lib.connect(spec.served, teacher.endpoint, spec.objective, vocab.vocab_size, tokenizer),
          span_kl or make_kl_fn(student_graphdef, graphdef, settings.logits_chunk, "reverse",
                                settings.micro_batch_size, mesh), cross))
  except BaseException:
    TeacherSet(teachers, put_batch).close()
    raise
  return TeacherSet(teachers, put_batch)


class TeacherSet:
  """Scores each row of a batch with its own teacher (module docstring); one teacher scores every row."""

  def __init__(self, teachers: list[RoutedTeacher], put_batch):
    self.teachers, self.put_batch = teachers, put_batch
    self.names = tuple(t.name for t in teachers)

  @property
  def multi(self) -> bool:
    return len(self.teachers) > 1

  def prefix(self, teacher: RoutedTeacher) -> str:
    """Where a teacher's own metrics go: `teacher/` alone, `teachers/<name>/` in a routed run."""
    return f"teachers/{teacher.name}/" if self.multi else "teacher/"

  @property
  def served(self) -> list[RoutedTeacher]:
    return [t for t in self.teachers if t.served is not None]

  def eval_kl(self, heldout_routes: np.ndarray) -> dict:
    """evaluation.evaluate's KL arguments: the one teacher's program, or each held-out prompt's own teacher."""
    if not self.multi:
      return dict(kl_fn=self.teachers[0].kl_fn, teacher_state=self.teachers[0].state)
    return dict(routes=heldout_routes, teachers_kl=[(t.kl_fn, t.state) for t in self.teachers])

  def score(self, host_prompts: dict, prompt_BxP, valid_BxP, tokens_BxN, mask_BxN, route_B: np.ndarray | None
            ) -> tuple[Scores, jnp.ndarray | None]:
    """(Scores of every row by its teacher, route_BxN: one-hot float32 of each row's teacher; None alone)."""
    if not self.multi:
      teacher = self.teachers[0]
      if teacher.served is None:
        return teacher.score(teacher.state, prompt_BxP, valid_BxP, tokens_BxN, mask_BxN), None
      # Over the wire: the host's tokens in, per-token log-probs (and top-k) back onto the learner's rows.
      tokens, mask = distributed.to_host((tokens_BxN, mask_BxN))
      scored = teacher.served.score(host_prompts["prompt_BxP"], host_prompts["prompt_valid_BxP"], tokens, mask)
      return Scores(*(None if x is None else self.put_batch(x) for x in (scored[0], None, *scored[1:]))), None
    return self._routed(host_prompts, prompt_BxP, valid_BxP, tokens_BxN, mask_BxN, np.asarray(route_B))

  def _routed(self, host_prompts: dict, prompt_BxP, valid_BxP, tokens_BxN, mask_BxN, route_B: np.ndarray):
    route_BxN = np.eye(len(self.teachers), dtype=np.float32)[route_B]
    logp_BxR = top_logp_BxRxK = top_ids_BxRxK = None
    host = None
    for n, teacher in enumerate(self.teachers):
      rows = np.flatnonzero(route_B == n)
      if not rows.size:
        continue
      if teacher.served is None:
        mine_Bx1 = self.put_batch(route_BxN[:, n:n + 1])
        scores = teacher.score(teacher.state, prompt_BxP, valid_BxP, tokens_BxN, mask_BxN * mine_Bx1)
        logp, top_logp, top_ids = scores.logp_BxR, scores.top_logp_BxRxK, scores.top_ids_BxRxK
      else:
        if host is None:
          host = [np.asarray(x) for x in distributed.to_host((tokens_BxN, mask_BxN))]
        logp, top_logp, top_ids = self._served(teacher, host_prompts, host, rows)
      logp_BxR = logp if logp_BxR is None else logp_BxR + logp  # 0 outside the teacher's rows
      if top_logp is not None:
        mine_Bx1x1 = self.put_batch(route_BxN[:, n, None, None])
        pick = lambda new, old: new if old is None else jnp.where(mine_Bx1x1 > 0, new, old)
        top_logp_BxRxK, top_ids_BxRxK = pick(top_logp, top_logp_BxRxK), pick(top_ids, top_ids_BxRxK)
    return Scores(logp_BxR, None, top_logp_BxRxK, top_ids_BxRxK), self.put_batch(route_BxN)

  def _served(self, teacher: RoutedTeacher, host_prompts: dict, host: list[np.ndarray], rows: np.ndarray):
    """A served teacher's scores of `rows`, scattered into whole-batch arrays (zeros elsewhere) on the learner."""
    tokens, mask = host
    prompt, valid = host_prompts["prompt_BxP"], host_prompts["prompt_valid_BxP"]
    logp, top_logp, top_ids = teacher.served.score(prompt[rows], valid[rows], tokens[rows], mask[rows])
    B = tokens.shape[0]

    def whole(x):
      if x is None:
        return None
      out = np.zeros((B, *x.shape[1:]), x.dtype)
      out[rows] = x
      return self.put_batch(out)

    return whole(logp), whole(top_logp), whole(top_ids)

  def cross_score(self, index_B: np.ndarray, tokens_BxN, mask_BxN, route_B: np.ndarray):
    """Teachers of their own tokenizers (opd_jax/crosstok), each row by its own: (Scores with each row's span
    log-probs, span_BxN of each row's own spans, route_BxN one-hot), and the alignment counts summed over the
    teachers (`cross_metrics`)."""
    route_BxN = np.eye(len(self.teachers), dtype=np.float32)[route_B]
    logp_BxN = span_BxN = None
    for n, teacher in enumerate(self.teachers):
      if not np.any(route_B == n):
        teacher.cross.last_stats = {}
        continue
      mine_Bx1 = self.put_batch(route_BxN[:, n:n + 1])
      scores, span = teacher.cross.score(teacher.state, index_B, tokens_BxN, mask_BxN * mine_Bx1)
      mine = mine_Bx1 > 0
      logp_BxN = scores.logp_BxR if logp_BxN is None else jnp.where(mine, scores.logp_BxR, logp_BxN)
      span_BxN = span if span_BxN is None else jnp.where(mine, span, span_BxN)
    return Scores(logp_BxN), span_BxN, self.put_batch(route_BxN)

  def cross_metrics(self) -> dict:
    """cross_tokenizer/* of the latest batch over every teacher's rows (counts summed, shares recomputed)."""
    from opd_jax.crosstok.scoring import alignment_metrics
    total: dict = {}
    for teacher in self.teachers:
      for key, value in (teacher.cross.last_stats or {}).items():
        total[key] = total.get(key, 0) + value
    return alignment_metrics(total)

  def close(self) -> None:
    """Closes the served teachers' clients."""
    for teacher in self.teachers:
      if teacher.served is not None:
        teacher.served.close()
