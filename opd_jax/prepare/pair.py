"""A config's `prepare` section: make its teacher and student directories when they do not exist yet.

  config.prepare.gguf         installed package or .gguf file the teacher is imported from
  config.prepare.keep_layers  the student is the teacher pruned to this many layers (opd_jax.prepare.prune), on
                              the teacher's greedy responses to the first prepare.prompts training prompts
  config.prepare.student_gguf optional: the student is imported from this package or file instead (a pair of two
                              models, e.g. of two families with their own tokenizers); nothing is pruned
  config.teacher / .student   where the two HF directories are (or will be) written

Both steps are idempotent (a finished directory made from the same source and settings is reused), so every
launch script that loads the pair calls `prepare_pair` first and pays nothing once it has run.
"""

from __future__ import annotations

import sys

from opd_jax.data.problems import load_jsonl
from opd_jax.errors import InputError
from opd_jax.models.gguf_import import import_gguf
from opd_jax.prepare.prune import prune


def _log(message: str) -> None:
  print(f"prepare: {message}", file=sys.stderr, flush=True)


def prepare_pair(config) -> None:
  """Imports the teacher and prunes the student as `config.prepare` says; a config without one is left as is."""
  if "prepare" not in config:
    return
  p = config.prepare
  if p.get("student_gguf"):  # two imported models
    for source, out in ((p.gguf, config.teacher), (p.student_gguf, config.student)):
      summary = import_gguf(source, out)
      if not summary["skipped"]:
        _log(f"imported {source} into {out}: {summary['architecture']}, {summary['layers']} layers, "
             f"{summary['params'] / 1e6:.1f}M params in {summary['seconds']:.0f} s")
    return
  for field in ("keep_layers", "prompts", "max_prompt_tokens", "max_new_tokens", "drops_per_round"):
    if isinstance(p[field], bool) or not isinstance(p[field], int) or p[field] < 1:
      raise InputError(f"prepare.{field} must be a positive integer, got {p[field]!r}")
  # Both steps check what is already there: a finished directory made from the same source and settings is
  # kept (a hash comparison, about a second), anything else at the path is an error naming it.
  summary = import_gguf(p.gguf, config.teacher)
  if not summary["skipped"]:
    _log(f"imported {p.gguf} into {config.teacher}: {summary['architecture']}, {summary['layers']} layers, "
         f"{summary['params'] / 1e6:.1f}M params ({', '.join(f'{n} {k}' for k, n in summary['tensor_types'].items())}"
         f" tensors dequantized to float32) in {summary['seconds']:.0f} s")
  d = config.data
  problems = load_jsonl(d.train_file)[:p.prompts]  # calibration on training prompts: held-out stays unseen
  report = prune(config.teacher, config.student, p.keep_layers, problems, max_prompt_tokens=p.max_prompt_tokens,
                 max_new_tokens=p.max_new_tokens, use_chat_template=d.use_chat_template,
                 logits_chunk=config.train.logits_chunk, drops_per_round=p.drops_per_round,
                 log=lambda message: _log(f"pruning to {p.keep_layers} layers: {message}"))
  if not report["skipped"]:
    _log(f"student {config.student}: kept layers {report['kept']} (KL to the teacher on its calibration responses "
         f"{report['kl_to_source']:.3f}) in {report['seconds']:.0f} s")
