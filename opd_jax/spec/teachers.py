"""The teachers of a run spec: config.teacher and config.teachers as `TeacherSpec`s, routing rules, and the
checks and objective form of a multi-teacher run (opd_jax/train/teachers.py describes routing and scoring).

A single-teacher run is a one-entry set: `Teachers.multi` is False, its rows carry no route and its metrics keep
the `teacher/` prefix.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from opd_jax.data.task import Problem
from opd_jax.models.prompt_format import check_format
from opd_jax.errors import InputError
from opd_jax.models import read_hf_config
from opd_jax.models.tokenizer_compat import PairVocab, check_pair
from opd_jax.objectives.losses import ObjectiveConfig
from opd_jax.serving.client import check_endpoint
from opd_jax.spec.parts import TeacherSpec

_NAME = re.compile(r"^[A-Za-z0-9_\-]+$")
_ENTRY_KEYS = ("checkpoint", "endpoint", "format", "end")  # what an entry of config.teachers may hold
SMALL_VOCAB = 1024  # largest vocabulary whose exact objective multi-teacher runs train as top-k over all of it


@dataclasses.dataclass(frozen=True)
class Teachers:
  """Every teacher in route order (config.teacher first) and the routing rules ((regex, teacher name), ...)."""
  specs: tuple[TeacherSpec, ...]
  rules: tuple[tuple[str, str], ...] = ()

  @classmethod
  def from_config(cls, config) -> "Teachers":
    specs = [TeacherSpec(config.routing.teacher_name, config.teacher, config.teacher_endpoint)]
    for name, entry in config.teachers.items():
      if not hasattr(entry, "keys") or set(entry.keys()) - set(_ENTRY_KEYS) or "checkpoint" not in entry:
        raise InputError(f"teachers.{name} must be a dict with 'checkpoint' (an HF dir) and optionally 'endpoint' "
                         "(a served teacher's URL) and, with cross_tokenizer.enabled, 'format' and 'end' (its "
                         f"prompt format and end token); got {entry!r}")
      if entry.get("format"):
        check_format(entry["format"], f"teachers.{name}.format")
      specs.append(TeacherSpec(name, entry["checkpoint"], entry.get("endpoint", "") or "",
                               entry.get("format", "") or "", entry.get("end", "") or ""))
    return cls(tuple(specs), tuple(config.routing.rules))

  @property
  def multi(self) -> bool:
    return len(self.specs) > 1

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(s.name for s in self.specs)

  @property
  def endpoints(self) -> list[str]:
    return [s.endpoint for s in self.specs if s.endpoint]

  def check(self, objective: ObjectiveConfig, vocab: PairVocab, max_tokens: int, *, student: str, tokenizer: str,
            eval_teacher_forced: bool, cross: bool = False) -> ObjectiveConfig:
    """Names, checkpoints, endpoints, rules and one vocabulary; returns the objective the run trains (module
    docstring of opd_jax/train/teachers.py). max_tokens: prompt + response tokens every teacher must fit;
    tokenizer: the data tokenizer's dir ("" = the student's)."""
    if not self.multi:
      if self.rules:
        raise InputError("routing.rules route prompts between teachers, but config.teachers names no second "
                         "teacher; add teachers or set routing.rules=()")
      return objective
    names = list(self.names)
    for name in names:
      if not _NAME.match(name):
        raise InputError(f"teacher name {name!r} (routing.teacher_name or a key of config.teachers) may use only "
                         "letters, digits, '_' and '-'")
    if len(set(names)) != len(names):
      raise InputError(f"teacher names must differ; got {names} (routing.teacher_name is config.teacher's)")
    self.compiled_rules()  # each rule compiles and names a teacher
    for spec in self.specs[1:]:
      if spec.endpoint:
        check_endpoint(spec.endpoint)
      model = read_hf_config(spec.checkpoint)  # errors name the file
      if max_tokens > model.max_position_embeddings:
        raise InputError(f"teacher {spec.name!r}: data.max_prompt_tokens + rollout.max_new_tokens = {max_tokens} "
                         f"exceeds its max_position_embeddings {model.max_position_embeddings}; shorten one of them")
      if cross:  # each teacher keeps its own tokenizer (opd_jax/crosstok); the span form needs no common vocabulary
        continue
      if spec.format or spec.end:
        raise InputError(f"teachers.{spec.name}: 'format' and 'end' are a cross-tokenizer teacher's; set "
                         "cross_tokenizer.enabled=True or drop them")
      own = check_pair(spec.checkpoint, student, model, read_hf_config(student), tokenizer_dir=tokenizer or None)
      if own.vocab_size != vocab.vocab_size:
        raise InputError(f"teacher {spec.name!r} ({spec.checkpoint}) and the student share {own.vocab_size} "
                         f"tokens, but config.teacher and the student {vocab.vocab_size}: every teacher must score "
                         "over one vocabulary")
    if eval_teacher_forced:
      raise InputError("train.eval_teacher_forced is single-teacher for now (whose greedy responses?); set it to "
                       "False with config.teachers")
    if cross:
      return objective  # reverse_kl_pg (opd_jax/spec/run_spec.py _check_cross)
    if objective.needs_teacher_hidden:
      if vocab.vocab_size > SMALL_VOCAB:
        raise InputError(f"objective.name={objective.name!r} recomputes the teacher's logits from its hidden "
                         "states with one teacher's head; with config.teachers use reverse_kl_pg or a *_topk "
                         "objective")
      return objective.over_the_wire(vocab.vocab_size)
    return objective

  def compiled_rules(self) -> list[tuple[re.Pattern, int]]:
    """(compiled regex, teacher index) per rule, in order."""
    names, rules = list(self.names), []
    for i, rule in enumerate(self.rules):
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

  def route(self, problems: list[Problem], what: str) -> np.ndarray:
    """int32 [len(problems)]: each problem's teacher (an index into `specs`): the teacher its row names, else the
    first rule whose regex is found in its prompt, else config.teacher. `what` names the set in errors."""
    names, rules = list(self.names), self.compiled_rules()
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
