"""Multi-teacher OPD: several teachers, each prompt scored by one of them (config.teachers, config.routing).

Legend: B rows, P prompt length, R response length, K top-k, N teachers.

Teachers: config.teacher (called routing.teacher_name in routes and logs) and every entry of config.teachers,
{"checkpoint": HF dir, "endpoint": "" or a served teacher's URL}. Every teacher needs its checkpoint here: the
held-out evaluation measures each prompt's KL to its own teacher in this process, and a served one is
preflighted against it.

Routing: a prompt goes to the teacher its JSONL row names in "teacher"; else to the first of routing.rules
((regex, teacher name), ...) whose regex is found in the prompt text; else to config.teacher. Routes are fixed
per problem before training (`route_problems`), so a resumed run routes alike.

Scoring (`RoutedScoring`): an in-process teacher scores the whole batch with the rows routed elsewhere masked out
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
import re

import jax.numpy as jnp
import numpy as np
from flax import nnx

from opd_jax.data.task import Problem
from opd_jax.errors import InputError
from opd_jax.models import read_hf_config
from opd_jax.models.tokenizer_compat import PairVocab, check_pair
from opd_jax.objectives.logprobs import Scores
from opd_jax.objectives.losses import ObjectiveConfig
from opd_jax.serving.client import check_endpoint
from opd_jax.train import distributed, programs
from opd_jax.train import served as served_lib
from opd_jax.train.evaluation import make_kl_fn

_NAME = re.compile(r"^[A-Za-z0-9_\-]+$")
SMALL_VOCAB = 1024  # largest vocabulary whose exact objective multi-teacher runs train as top-k over all of it


@dataclasses.dataclass(frozen=True)
class TeacherSpec:
  name: str
  checkpoint: str  # HF dir (in-process scoring, evaluation, a served teacher's preflight)
  endpoint: str = ""  # "" = scored in this process; else a served teacher's base URL (.../v1)


def teacher_specs(config) -> list[TeacherSpec]:
  """config.teacher first (as routing.teacher_name), then config.teachers in their order."""
  specs = [TeacherSpec(config.routing.teacher_name, config.teacher, config.teacher_endpoint)]
  for name, entry in config.teachers.items():
    if not hasattr(entry, "keys") or set(entry.keys()) - {"checkpoint", "endpoint"} or "checkpoint" not in entry:
      raise InputError(f"teachers.{name} must be a dict with 'checkpoint' (an HF dir) and optionally 'endpoint' "
                       f"(a served teacher's URL); got {entry!r}")
    specs.append(TeacherSpec(name, entry["checkpoint"], entry.get("endpoint", "") or ""))
  return specs


def is_multi(config) -> bool:
  return len(config.teachers) > 0


def check_teachers(config, objective: ObjectiveConfig, vocab: PairVocab, max_tokens: int) -> ObjectiveConfig:
  """Config checks of a multi-teacher run (names, checkpoints, endpoints, rules, one vocabulary); returns the
  objective it trains (see the module docstring). max_tokens: prompt + response tokens every teacher must fit."""
  if not is_multi(config):
    if config.routing.rules:
      raise InputError("routing.rules route prompts between teachers, but config.teachers names no second "
                       "teacher; add teachers or set routing.rules=()")
    return objective
  specs = teacher_specs(config)
  names = [s.name for s in specs]
  for name in names:
    if not _NAME.match(name):
      raise InputError(f"teacher name {name!r} (routing.teacher_name or a key of config.teachers) may use only "
                       "letters, digits, '_' and '-'")
  if len(set(names)) != len(names):
    raise InputError(f"teacher names must differ; got {names} (routing.teacher_name is config.teacher's)")
  _rules(config, names)  # each rule compiles and names a teacher
  for spec in specs[1:]:
    if spec.endpoint:
      check_endpoint(spec.endpoint)
    model = read_hf_config(spec.checkpoint)  # errors name the file
    if max_tokens > model.max_position_embeddings:
      raise InputError(f"teacher {spec.name!r}: data.max_prompt_tokens + rollout.max_new_tokens = {max_tokens} "
                       f"exceeds its max_position_embeddings {model.max_position_embeddings}; shorten one of them")
    own = check_pair(spec.checkpoint, config.student, model, read_hf_config(config.student),
                     tokenizer_dir=config.tokenizer or None)
    if own.vocab_size != vocab.vocab_size:
      raise InputError(f"teacher {spec.name!r} ({spec.checkpoint}) and the student share {own.vocab_size} tokens, "
                       f"but config.teacher and the student {vocab.vocab_size}: every teacher must score over one "
                       "vocabulary")
  if config.train.eval_teacher_forced:
    raise InputError("train.eval_teacher_forced is single-teacher for now (whose greedy responses?); set it to "
                     "False with config.teachers")
  if objective.needs_teacher_hidden:
    if vocab.vocab_size > SMALL_VOCAB:
      raise InputError(f"objective.name={objective.name!r} recomputes the teacher's logits from its hidden states "
                       "with one teacher's head; with config.teachers use reverse_kl_pg or a *_topk objective")
    return objective.over_the_wire(vocab.vocab_size)
  return objective


def _rules(config, names: list[str]) -> list[tuple[re.Pattern, int]]:
  rules = []
  for i, rule in enumerate(config.routing.rules):
    if not isinstance(rule, (tuple, list)) or len(rule) != 2 or not all(isinstance(x, str) for x in rule):
      raise InputError(f"routing.rules[{i}] must be a (regex, teacher name) pair of strings, got {rule!r}")
    pattern, name = rule
    if name not in names:
      raise InputError(f"routing.rules[{i}] routes to teacher {name!r}, which is not one of {names}")
    try:
      rules.append((re.compile(pattern), names.index(name)))
    except re.error as e:
      raise InputError(f"routing.rules[{i}]: {pattern!r} is not a regular expression ({e})") from None
  return rules


def route_problems(config, problems: list[Problem], what: str) -> np.ndarray:
  """int32 [len(problems)]: each problem's teacher (an index into teacher_specs(config)); `what` names the set
  in errors ("training", "held-out")."""
  names = [s.name for s in teacher_specs(config)]
  rules = _rules(config, names)
  routes = np.zeros(len(problems), np.int32)
  for i, problem in enumerate(problems):
    if problem.teacher:
      if problem.teacher not in names:
        raise InputError(f"{what} problem {i} names teacher {problem.teacher!r}, which is not one of {names} "
                         "(config.teachers and routing.teacher_name)")
      routes[i] = names.index(problem.teacher)
      continue
    routes[i] = next((n for pattern, n in rules if pattern.search(problem.prompt)), 0)
  return routes


@dataclasses.dataclass
class RoutedTeacher:
  """One teacher of a routed run: in-process (state + its scoring program) or served (client)."""
  name: str
  graphdef: object
  state: object
  score: object  # jit (state, prompt, valid, response, mask) -> Scores (programs.teacher_score_program)
  served: object = None  # an opd_jax.serving.client.ServedTeacher, or None (in this process)
  kl_fn: object = None  # the evaluation's reverse KL program for this teacher (programs.make_kl_fn)


def connect(config, main: RoutedTeacher, *, student_graphdef, settings, objective: ObjectiveConfig, tokenizer,
            mesh, put_batch, load) -> RoutedScoring:
  """The routed teachers of a multi-teacher run: `main` (config.teacher, as the loop has it) first, then every
  entry of config.teachers loaded (load(checkpoint, its PairVocab) -> model) or connected, with its scoring and
  evaluation-KL programs built by the run's builders."""
  teachers, student = [main], read_hf_config(config.student)
  try:
    for spec in teacher_specs(config)[1:]:
      vocab = check_pair(spec.checkpoint, config.student, read_hf_config(spec.checkpoint), student,
                         tokenizer_dir=config.tokenizer or None)
      graphdef, state = nnx.split(load(spec.checkpoint, vocab))
      teachers.append(RoutedTeacher(
          spec.name, graphdef, state,
          programs.teacher_score_program(graphdef, objective, settings.rollout.temperature, settings.logits_chunk,
                                         settings.micro_batch_size, mesh),
          served_lib.connect(config, objective, vocab.vocab_size, tokenizer, endpoint=spec.endpoint),
          make_kl_fn(student_graphdef, graphdef, settings.logits_chunk, "reverse", settings.micro_batch_size,
                     mesh)))
  except BaseException:
    RoutedScoring(teachers, put_batch).close()
    raise
  return RoutedScoring(teachers, put_batch)


class RoutedScoring:
  """Scores each row of a batch with its own teacher (module docstring)."""

  def __init__(self, teachers: list[RoutedTeacher], put_batch):
    self.teachers, self.put_batch = teachers, put_batch
    self.names = tuple(t.name for t in teachers)

  def score(self, host_prompts: dict, prompt_BxP, valid_BxP, tokens_BxN, mask_BxN, route_B: np.ndarray
            ) -> tuple[Scores, jnp.ndarray]:
    """(Scores of every row by its teacher, route_BxN: one-hot float32 of each row's teacher)."""
    route_B = np.asarray(route_B)
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

  def close(self) -> None:
    """Closes the other teachers' clients (config.teacher's belongs to the loop)."""
    for teacher in self.teachers[1:]:
      if teacher.served is not None:
        teacher.served.close()
