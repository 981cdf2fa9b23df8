"""The teacher side of the mismatch at admission: a served teacher (config.teacher_endpoint) against
config.teacher in this process on the calibration batch, measured as the training run's preflight measures it
(with the run's own teacher-scoring program).

The student learns from what the server says, so a server at another precision or engine is a mismatch on the
same k3 scale as the sampler's; `launch/admit.py` reports it next to the sampler's and rejects a configuration
whose run the preflight would refuse (served_teacher.preflight_max_k3).
"""

from __future__ import annotations

import dataclasses
import types

import jax

from opd_jax.rollout.config import RolloutConfig
from opd_jax.screening.calibration import Calibration
from opd_jax.spec import RunSpec
from opd_jax.train import served as served_lib
from opd_jax.train.programs import teacher_score_program


def served_teacher_mismatch(cal: Calibration, spec: RunSpec, seed: int = 0) -> dict | None:
  """None without a served teacher (config.teacher_endpoint); else {"k3", "repeat_k3", "max_abs_logp_diff",
  "max_k3", "ok", "endpoint"} on the student's exact-sampler responses to the calibration prompts (`ok`: both k3
  at most served_teacher.preflight_max_k3), with the objective the run trains (as the run's preflight scores)."""
  endpoint = "" if spec.teachers.multi else spec.teachers.specs[0].endpoint
  if not endpoint:
    return None
  objective, served, temperature = spec.objective, spec.served, spec.rollout.temperature
  client = served_lib.connect(served, endpoint, objective, cal.vocab_size, cal.tokenizer)
  try:
    rollout = RolloutConfig(temperature=temperature, max_new_tokens=spec.rollout.max_new_tokens)
    out = cal.sample(rollout, cal.sampler_state(rollout), jax.random.key(seed))
    batch = types.SimpleNamespace(prompt_BxP=cal.prompt_BxP, prompt_valid_BxP=cal.valid_BxP,
                                  response_BxR=out.tokens_BxN, mask_BxR=out.mask_BxN)
    warn_only = dataclasses.replace(served, preflight="warn")  # measured and reported here, not raised
    score = teacher_score_program(cal.teacher_graphdef, objective, temperature, cal.logits_chunk)
    row = served_lib.preflight(warn_only, client, score, cal.teacher_state, batch,
                               warn=lambda message: None)
  finally:
    client.close()
  k3, repeat = row["teacher/preflight_k3"], row["teacher/preflight_repeat_k3"]
  limit = served.preflight_max_k3
  return {"endpoint": endpoint, "k3": k3, "repeat_k3": repeat,
          "max_abs_logp_diff": row["teacher/preflight_max_abs_logp_diff"], "max_k3": limit,
          "ok": max(k3, repeat) <= limit}
