"""Admission check: measure a candidate rollout configuration's mismatch in seconds, compare it to a budget.

The candidate's sampler (weight recipe, KV dtype, noise) generates on a calibration batch of held-out prompts
and the unquantized learner scores the same tokens (`Calibration.measure`): the same k3 the training step logs.
For staleness s, a short run of s OPD updates (the real learner step, on the calibration prompts) builds the
lagged versions: the sampler is version 0 with the candidate's knobs, the learner is version s. Those updates use
the config's peak learning rate (no warmup): a warmup from 0 would make the first lag vanish, while a real run
spends nearly all of its steps near the peak.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax

from opd_jax.mismatch import budget as budget_lib
from opd_jax.mismatch.calibration import Calibration
from opd_jax.objectives.losses import ObjectiveConfig
from opd_jax.rollout.config import RolloutConfig
from opd_jax.train.optimizer import make_optimizer, make_schedule
from opd_jax.train.rollouts import RolloutProducer
from opd_jax.train.step import TrainState, train_step


def lagged_versions(cal: Calibration, config, updates: int, seed: int = 0) -> list:
  """Learner parameters after 0, 1, ..., `updates` OPD steps (exact sampler, config's objective/optimizer)."""
  objective = ObjectiveConfig(**dict(config.objective))
  o = config.optimizer
  make_schedule(learning_rate=o.learning_rate, warmup_steps=o.warmup_steps, total_steps=config.train.steps,
                end_lr_fraction=o.end_lr_fraction)  # validates the optimizer fields like a real run would
  schedule = optax.constant_schedule(o.learning_rate)  # steady-state updates, see the module docstring
  optimizer = make_optimizer(schedule, weight_decay=o.weight_decay, grad_clip_norm=o.grad_clip_norm)
  rollout = RolloutConfig(temperature=config.rollout.temperature, max_new_tokens=config.rollout.max_new_tokens)
  producer = RolloutProducer(student_graphdef=cal.graphdef, teacher_graphdef=cal.teacher_graphdef,
                             teacher_state=cal.teacher_state, rollout=rollout,
                             sampler=cal.sampler(rollout), need_teacher_logits=objective.needs_teacher_logits,
                             put_batch=jnp.asarray, seed=seed)
  step = jax.jit(functools.partial(train_step, cal.graphdef, optimizer, objective, rollout.temperature,
                                   objective.is_cap))
  state = TrainState(cal.params, optimizer.init(cal.params), jnp.zeros((), jnp.int32))
  versions = [cal.params]
  prompts = {"prompt_BxP": cal.prompt_BxP, "prompt_valid_BxP": cal.valid_BxP}
  for i in range(updates):
    batch = producer.produce(i, i, state.params, prompts)
    state, _ = step(state, batch)
    versions.append(state.params)
  return versions


def measure_candidate(cal: Calibration, config, rollout: RolloutConfig, seed: int = 0) -> dict:
  """Mismatch metrics of `rollout` against the learner (see module docstring)."""
  key = jax.random.key(seed)
  if rollout.staleness_steps == 0:
    return cal.measure(rollout, key)
  versions = lagged_versions(cal, config, rollout.staleness_steps, seed)
  fresh = dataclasses.replace(rollout, staleness_steps=0)
  return cal.measure(fresh, key, sampler_params=versions[0], learner_params=versions[-1])


def pick_budget(budget_file: dict, pair: str) -> tuple[str, dict]:
  """The pair's own budget when calibrated, else the pooled one."""
  budgets = budget_file.get("budgets", {})
  for name in (pair, "pooled"):
    if name in budgets:
      return name, budgets[name]
  raise ValueError(f"budget file has no budget for pair {pair!r} and no 'pooled' budget "
                   f"(it has: {sorted(budgets)})")


def admit(measured: dict, budget_file: dict, pair: str) -> dict:
  scale = budget_file["scale"]
  source, budget = pick_budget(budget_file, pair)
  value = budget_lib.SCALES[scale]({f"mismatch/{k}": v for k, v in measured.items()})
  return {**budget_lib.verdict(value, budget), "scale": scale, "budget_source": source}
