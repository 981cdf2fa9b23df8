"""The run's held-out evaluation: the student's own greedy and sampled answers, no mismatch knobs; optionally the
teacher's greedy responses (made once) scored by the student (teacher-forced KL) and graded (the teacher's
accuracy). Each evaluation writes its samples through the run's writer and returns its metrics row."""

from __future__ import annotations

import time

import jax

from opd_jax.data.task import Problem
from opd_jax.train import evaluation
from opd_jax.train.setup import Run


class Evaluator:

  def __init__(self, run: Run, writer):
    self._run, self._writer = run, writer
    self._teacher_reference: evaluation.Responses | None = None  # the teacher's greedy responses, once made

  def __call__(self, params, step: int) -> dict:
    run, t, d = self._run, self._run.spec.train, self._run.spec.data
    built, teacher_state, heldout = run.programs, run.teacher_state, run.heldout
    row, start = {}, time.time()
    common = dict(max_prompt_tokens=d.max_prompt_tokens, batch_size=t.eval_batch_size,
                  use_chat_template=d.use_chat_template, prompt_format=d.prompt_format, put=run.put_batch,
                  key=jax.random.key(run.spec.seed + 7))
    # train.eval_weights='sampler': decode with the rollout engine's weights of this version on its mesh.
    on_sampler = (dict(sampler_state=built.weight_sync(params, step), put_sampler=run.put_sampler_batch)
                  if t.eval_weights == "sampler" else {})
    samples = []
    if t.eval_teacher_forced and self._teacher_reference is None:
      self._teacher_reference = evaluation.Responses([], [])
      result = evaluation.evaluate(built.teacher_greedy, teacher_state, run.tokenizer, heldout,
                                   keep=self._teacher_reference, **common)
      row.update({f"eval/teacher_{k}": v for k, v in result.items()})
      samples += sample_rows("teacher", heldout[:t.eval_samples], self._teacher_reference.texts)
    for suffix, eval_sampler in built.eval_samplers.items():
      kept = evaluation.Responses([], []) if not suffix else None
      kl = run.teachers.eval_kl(run.heldout_routes) if suffix == "_sampled" else {}
      result = evaluation.evaluate(eval_sampler, params, run.tokenizer, heldout, **common, **on_sampler, keep=kept,
                                   **kl)
      # a cross-tokenizer teacher's KL is a span estimate, named as such (crosstok.SpanKL)
      metric = getattr(kl.get("kl_fn") or next(iter(kl.get("teachers_kl") or []), (None,))[0], "metric",
                       "reverse_kl")
      if "kl" in result:
        row[f"eval/{metric}"] = result.pop("kl")
      per_response = result.pop("kl_per_response", None)
      if per_response is not None and metric != "reverse_kl":  # a span estimate: its per-token mean moves with
        row[f"eval/{metric}_per_response"] = per_response  # which tokens answers keep as they change length
      for n, value in result.pop("kl_by_teacher", {}).items():  # each held-out prompt against its own teacher
        row[f"eval/teachers/{run.teachers.names[n]}/{metric}"] = value
      row.update({f"eval/{k}{suffix}": v for k, v in result.items()})
      if kept is not None:
        samples += sample_rows("student", heldout[:t.eval_samples], kept.texts)
    if self._teacher_reference is not None:
      row["eval/teacher_forced_kl"] = evaluation.kl_on(self._teacher_reference, built.eval_forward_kl, params,
                                                       teacher_state)
    self._writer.write_samples(step, samples)
    row["eval/seconds"] = time.time() - start
    return row


def sample_rows(model: str, problems: list[Problem], texts: list[str]) -> list[dict]:
  """samples.jsonl rows: one per problem, with its grade where it has an answer."""
  rows = []
  for problem, text in zip(problems, texts):
    row = {"model": model, "prompt": problem.prompt, "response": text}
    if problem.answer is not None:
      row.update(answer=problem.answer, correct=evaluation.grade(text, problem))
    rows.append(row)
  return rows
