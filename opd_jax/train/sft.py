"""Supervised fine-tuning on reference solutions (used to build the embedded teacher-student pairs).

Legend: B batch, P prompt length, R response length, V vocab.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from opd_jax.data.batching import encode_prompts, encode_solutions
from opd_jax.data.task import ArithmeticTask
from opd_jax.objectives.logprobs import response_logits, token_logprobs
from opd_jax.train.optimizer import make_optimizer, make_schedule


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  steps: int
  batch_size: int = 64
  learning_rate: float = 3e-3
  warmup_steps: int = 100
  end_lr_fraction: float = 0.1  # cosine decay to this fraction of the peak; 1.0 = constant after warmup
  weight_decay: float = 0.01
  grad_clip_norm: float = 1.0
  seed: int = 0  # data order
  max_prompt_tokens: int = 24
  max_response_tokens: int = 66


def sft_loss(params, graphdef, prompt_BxP, prompt_valid_BxP, response_BxR, mask_BxR):
  model = nnx.merge(graphdef, params)
  logits_BxRxV = response_logits(model, prompt_BxP, prompt_valid_BxP, response_BxR, mask_BxR)
  logp_BxR = token_logprobs(logits_BxRxV, response_BxR)
  return -jnp.sum(logp_BxR * mask_BxR) / jnp.maximum(jnp.sum(mask_BxR), 1.0)


def make_sft_step(graphdef, optimizer: optax.GradientTransformation) -> Callable:
  """The jitted step (params, opt_state, (prompt_BxP, prompt_valid_BxP, response_BxR, mask_BxR)) ->
  (params, opt_state, mean response-token NLL)."""

  @jax.jit
  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(sft_loss)(params, graphdef, *batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss
  return step


def train_sft(model, tokenizer, task: ArithmeticTask, sft: SFTConfig,
              log: Callable[[int, float, float], None] | None = None,
              evaluate: Callable[[int, nnx.State], bool] | None = None, eval_every: int = 0) -> int:
  """Trains `model` in place on task solutions; returns the number of steps taken.

  log(step, mean loss, seconds per step) every 100 steps; evaluate(step, model state) every `eval_every` steps
  when given -- returning True stops training there (early stopping at a target accuracy).
  """
  graphdef, params = nnx.split(model)
  schedule = make_schedule(learning_rate=sft.learning_rate, warmup_steps=sft.warmup_steps,
                           total_steps=sft.steps, end_lr_fraction=sft.end_lr_fraction)
  optimizer = make_optimizer(schedule, weight_decay=sft.weight_decay, grad_clip_norm=sft.grad_clip_norm)
  opt_state = optimizer.init(params)
  step = make_sft_step(graphdef, optimizer)
  problems = task.problems("train", sft.steps * sft.batch_size, sft.seed)
  t0, losses = time.time(), []
  for i in range(sft.steps):
    chunk = problems[i * sft.batch_size:(i + 1) * sft.batch_size]
    batch = (*encode_prompts(tokenizer, chunk, sft.max_prompt_tokens),
             *encode_solutions(tokenizer, chunk, sft.max_response_tokens))
    params, opt_state, loss = step(params, opt_state, batch)
    losses.append(loss)
    if log is not None and ((i + 1) % 100 == 0 or i + 1 == sft.steps):
      log(i + 1, float(np.mean(jax.device_get(losses))), (time.time() - t0) / (i + 1))
      losses = []
    if evaluate is not None and eval_every and (i + 1) % eval_every == 0:
      nnx.update(model, params)
      if evaluate(i + 1, nnx.state(model)):
        return i + 1
  nnx.update(model, params)
  return sft.steps
