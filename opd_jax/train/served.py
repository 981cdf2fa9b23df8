"""The training loop's side of a served teacher (a teacher's endpoint, opd_jax/serving): connecting, and the
preflight that compares the served scores of the first batch with the same checkpoint's own in this process."""

from __future__ import annotations

import sys

import jax.numpy as jnp

from opd_jax.errors import InputError
from opd_jax.mismatch.metrics import token_metrics
from opd_jax.serving.client import ServedTeacher
from opd_jax.spec import ServedSpec
from opd_jax.train import distributed


def connect(s: ServedSpec, endpoint: str, objective, vocab_size: int, tokenizer):
  """The client of the teacher served at `endpoint` (tokenizer checked against the student's), or None for
  in-process scoring (endpoint "")."""
  if not endpoint:
    return None
  warn = lambda message: print(f"warning: {message}", file=sys.stderr, flush=True)
  served = ServedTeacher(endpoint, vocab_size=vocab_size,
                         top_k=objective.top_k if objective.needs_teacher_topk else 0, model=s.model,
                         rows_per_request=s.rows_per_request, max_in_flight=s.max_in_flight, timeout_s=s.timeout_s,
                         retry_for_s=s.retry_for_s, warn=warn)
  try:
    served.check_tokenizer(tokenizer)
  except BaseException:
    served.close()
    raise
  return served


def preflight(s: ServedSpec, served, teacher_score, teacher_state, batch, warn, name: str = "") -> dict:
  """k3 of the served teacher's scores of `batch` (the run's first, every row) against its checkpoint's in this
  process, and between two served scorings; refused (InputError) or warned about above
  served_teacher.preflight_max_k3. name: a multi-teacher run's teacher (metrics teachers/<name>/preflight_*;
  "" = config.teacher, teacher/preflight_*)."""
  local = teacher_score(teacher_state, batch.prompt_BxP, batch.prompt_valid_BxP, batch.response_BxR,
                        batch.mask_BxR).logp_BxR
  # Compared on whole host copies, on one device: the served scores are host arrays (every process has them). Mixing
  # them with the mesh-sharded scores ran an 8-device program here that aborted the process inside XLA (SIGABRT),
  # twice in full test-suite runs on 2 cores; the one-device comparison needs no cross-device step at all.
  prompt_BxP, valid_BxP, response_BxR, mask_BxR, local_BxR = distributed.to_host(
      (batch.prompt_BxP, batch.prompt_valid_BxP, batch.response_BxR, batch.mask_BxR, local))
  first, again = (jnp.asarray(served.score(prompt_BxP, valid_BxP, response_BxR, mask_BxR)[0]) for _ in range(2))
  mask = jnp.asarray(mask_BxR)
  served_vs_local = token_metrics(first, jnp.asarray(local_BxR), mask)
  repeat = token_metrics(again, first, mask)
  prefix = f"teachers/{name}/" if name else "teacher/"
  k3, repeat_k3 = float(served_vs_local["k3"]), float(repeat["k3"])
  row = {prefix + "preflight_k3": k3, prefix + "preflight_max_abs_logp_diff":
         float(served_vs_local["max_abs_logp_diff"]), prefix + "preflight_repeat_k3": repeat_k3}
  if max(k3, repeat_k3) > s.preflight_max_k3:
    message = (f"the served teacher at {served.endpoint} scores the first batch at k3 {k3:.3g} from "
               f"{'teacher ' + repr(name) if name else 'config.teacher'} in this process (and {repeat_k3:.3g} from "
               f"its own second scoring), above served_teacher.preflight_max_k3={s.preflight_max_k3:g}: it serves "
               "another model, precision or engine")
    if s.preflight == "refuse":
      raise InputError(message + "; serve that checkpoint as it is, or raise served_teacher.preflight_max_k3 (or "
                       "set served_teacher.preflight='warn') to train against it anyway")
    warn(message)
  return row
