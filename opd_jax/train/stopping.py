"""End-of-turn diagnostics: does a student stop where its teacher would, and which way OPD pushes its EOS logit.

Legend: B rows, R response positions, V vocab.

For responses sampled by some policy (the student at its rollout temperature, the teacher greedy, ...), both
models score every response position. With p_S and p_T the student's and the teacher's next-token
distributions at a position, the exact reverse-KL objective's gradient on the student's end-of-turn logit z_e is

  d KL(p_S || p_T) / d z_e = p_S(e) * (log p_S(e) - log p_T(e) - KL(p_S || p_T))

(the softmax Jacobian applied to log p_S - log p_T). A positive mean over the response tokens means gradient
descent lowers the EOS logit: OPD teaches the student to stop less. The report splits it into the positions
where the sampled response ended and the others, and gives both models' EOS probabilities there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from opd_jax.objectives.logprobs import response_logits
from opd_jax.rollout.sampler import Sampler, SamplingConfig


def _log_softmax_rows(model, prompt_BxP, valid_BxP, response_BxR, mask_BxR, rows: int) -> np.ndarray:
  """log p over the vocabulary at every response position, [B, R, V] float32 on the host, `rows` at a time."""
  fn = jax.jit(lambda m, *xs: jax.nn.log_softmax(response_logits(m, *xs), axis=-1))
  out = [np.asarray(fn(model, prompt_BxP[i:i + rows], valid_BxP[i:i + rows], response_BxR[i:i + rows],
                       mask_BxR[i:i + rows])) for i in range(0, prompt_BxP.shape[0], rows)]
  return np.concatenate(out)


def eos_report(student, teacher, prompt_BxP, valid_BxP, response_BxR, mask_BxR, eos_id: int,
               rows: int = 8) -> dict:
  """Where `response_BxR` (mask through its first EOS) ends, both models' EOS probabilities, and the exact
  reverse-KL gradient on the student's EOS logit per response token (module docstring)."""
  logp_s = _log_softmax_rows(student, prompt_BxP, valid_BxP, response_BxR, mask_BxR, rows)
  logp_t = _log_softmax_rows(teacher, prompt_BxP, valid_BxP, response_BxR, mask_BxR, rows)
  p_s, p_t = np.exp(logp_s[..., eos_id]), np.exp(logp_t[..., eos_id])
  kl_BxR = (np.exp(logp_s) * (logp_s - logp_t)).sum(-1)
  grad_BxR = p_s * (logp_s[..., eos_id] - logp_t[..., eos_id] - kl_BxR)
  in_response = np.asarray(mask_BxR) > 0
  ended = (np.asarray(response_BxR) == eos_id) & in_response
  tokens = in_response.sum()
  mean_at = lambda x, where: float(x[where].mean()) if where.any() else None
  teacher_would_end = (p_t > 0.5) & in_response
  return {
      "rows": int(in_response.shape[0]),
      "mean_length": float(in_response.sum(1).mean()),
      "share_at_cap": float((~ended.any(1)).mean()),
      "eos_grad_per_token": float((grad_BxR * in_response).sum() / tokens),
      "eos_grad_per_token_at_ends": float((grad_BxR * ended).sum() / tokens),
      "eos_grad_per_token_elsewhere": float((grad_BxR * (in_response & ~ended)).sum() / tokens),
      "student_p_eos_mean": mean_at(p_s, in_response), "teacher_p_eos_mean": mean_at(p_t, in_response),
      "student_p_eos_at_ends": mean_at(p_s, ended), "teacher_p_eos_at_ends": mean_at(p_t, ended),
      "positions_teacher_p_eos_over_half": int(teacher_would_end.sum()),
      "student_p_eos_where_teacher_over_half": mean_at(p_s, teacher_would_end),
  }


def sample(model, prompt_BxP, valid_BxP, *, max_new_tokens: int, temperature: float, eos_id: int, pad_id: int,
           key: jax.Array):
  """(response_BxR, mask_BxR) numpy from `model` (float32 weights, no mismatch knob)."""
  graphdef, state = nnx.split(model)
  out = Sampler(graphdef, SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, eos_ids=(eos_id,),
                                         pad_id=pad_id))(state, prompt_BxP, valid_BxP, key)
  return np.asarray(out.tokens_BxN), np.asarray(out.mask_BxN)


def stopping_study(student, teacher, prompt_BxP, valid_BxP, *, max_new_tokens: int, temperature: float,
                   eos_id: int, pad_id: int, seed: int = 0) -> dict:
  """eos_report on three response sets: the student's rollouts (what OPD trains on), the teacher's greedy and the
  student's greedy responses."""
  key = jax.random.key(seed)
  out = {}
  for name, model, temp in (("student_rollouts", student, temperature), ("teacher_greedy", teacher, 0.0),
                            ("student_greedy", student, 0.0)):
    response, mask = sample(model, prompt_BxP, valid_BxP, max_new_tokens=max_new_tokens, temperature=temp,
                            eos_id=eos_id, pad_id=pad_id, key=key)
    out[name] = eos_report(student, teacher, prompt_BxP, valid_BxP, jnp.asarray(response), jnp.asarray(mask),
                           eos_id)
  return out
