"""Admission check: measure a candidate rollout configuration's mismatch in seconds, compare it to a budget.

The candidate's sampler (weight recipe, KV dtype, noise) generates on a calibration batch of held-out prompts
and the unquantized learner scores the same tokens (`Calibration.measure`): the same k3 the training step logs.
For staleness s, a short run of s OPD updates (the real learner step, on the calibration prompts) builds the
lagged versions: the sampler is version 0 with the candidate's knobs, the learner is version s. Version 0 is taken
after a burn-in of the config's warmup steps (at least 10), so the lagged updates have the learning rate and Adam
moments of a run in progress: from a cold start the first update is a no-op (lr 0) and fresh Adam moments make
the next ones sign-like and far larger than a running learner's.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from opd_jax.errors import InputError
from opd_jax.mismatch import budget as budget_lib
from opd_jax.rollout.config import RolloutConfig
from opd_jax.screening import k3_conversion
from opd_jax.screening.calibration import Calibration
from opd_jax.spec import RunSpec
from opd_jax.train.optimizer import make_optimizer, make_schedule
from opd_jax.train.rollouts import RolloutProducer
from opd_jax.train.step import TrainState, train_step


def update_micro_batch(spec: RunSpec, rows: int) -> int:
  """Rows per pass of lagged_versions' updates: the run's (micro-batch, else batch) where it divides `rows`."""
  micro = spec.train.micro_batch_size or spec.train.batch_size
  return micro if 0 < micro < rows and rows % micro == 0 else 0


def lagged_versions(cal: Calibration, spec: RunSpec, updates: int, seed: int = 0, keep=None) -> list:
  """Learner parameters at burn-in + 0, 1, ..., `updates` OPD steps (exact sampler, the run's objective and
  optimizer). keep: the offsets to hold (None: all); the others are None, so a lag of 32 on a real model holds two
  copies of the weights, not 33. Each update is one step on the whole calibration batch, its gradient accumulated
  over the run's micro-batches (train.micro_batch_size, else train.batch_size, where it divides the batch): the
  same update to float rounding, at the run's activation memory (128 SmolLM2 rows in one pass took 21 GB)."""
  objective = spec.objective
  o = spec.optimizer
  schedule = make_schedule(learning_rate=o.learning_rate, warmup_steps=o.warmup_steps,
                           total_steps=spec.train.steps, end_lr_fraction=o.end_lr_fraction)
  burn_in = max(o.warmup_steps, 10)
  optimizer = make_optimizer(schedule, weight_decay=o.weight_decay, grad_clip_norm=o.grad_clip_norm)
  rollout = RolloutConfig(temperature=spec.rollout.temperature, max_new_tokens=spec.rollout.max_new_tokens)
  producer = RolloutProducer(student_graphdef=cal.graphdef, teacher_graphdef=cal.teacher_graphdef,
                             teacher_state=cal.teacher_state, rollout=rollout,
                             sampler=cal.sampler(rollout), objective=objective, put_batch=jnp.asarray, seed=seed,
                             logits_chunk=cal.logits_chunk)
  micro = update_micro_batch(spec, cal.prompt_BxP.shape[0])
  step = jax.jit(functools.partial(train_step, cal.graphdef, optimizer, objective, rollout.temperature,
                                   objective.is_cap, teacher_graphdef=cal.teacher_graphdef,
                                   logits_chunk=cal.logits_chunk, micro_batch_size=micro))
  state = TrainState(cal.params, optimizer.init(cal.params), jnp.zeros((), jnp.int32))
  versions = []
  prompts = {"prompt_BxP": cal.prompt_BxP, "prompt_valid_BxP": cal.valid_BxP}
  for i in range(burn_in + updates):
    if i >= burn_in:
      versions.append(state.params if keep is None or i - burn_in in keep else None)
    batch = producer.produce(i, i, {"sampler": state.params}, prompts)  # an exact sampler
    state, _ = step(state, batch, cal.teacher_state)
  versions.append(state.params if keep is None or updates in keep else None)
  return versions


def measure_candidate(cal: Calibration, spec: RunSpec, rollout: RolloutConfig, seed: int = 0, versions=None) -> dict:
  """Mismatch metrics of `rollout` against the learner (see module docstring). versions: lagged_versions()
  with at least rollout.staleness_steps updates, to share one run between candidates (default: its own)."""
  key = jax.random.key(seed)
  s = rollout.staleness_steps
  if s == 0:
    return cal.measure(rollout, key)
  if versions is None or len(versions) <= s:
    versions = lagged_versions(cal, spec, s, seed, keep={0, s})
  fresh = dataclasses.replace(rollout, staleness_steps=0)
  return cal.measure(fresh, key, sampler_params=versions[0], learner_params=versions[s])


def pick_budget(budget_file: dict, pair: str, steps: int | None = None) -> tuple[str, dict, str]:
  """The pair's own budget when its runs bound it; else the pooled one; at the horizon nearest `steps`.

  A budget is calibrated by runs of one length (budget.json's `horizons`; the main one has plain pair keys,
  others "pair@steps"), so the run length a candidate is for picks the horizon: the nearest in log steps
  (default: the main one), and the note says when it is not the same length. A pair whose runs never lost
  quality has an unbounded budget: only a lower bound (the largest mismatch its runs tested). Then a bounded
  pooled budget, fitted on all pairs' runs, is the better estimate. Returns (key in budget_file["budgets"],
  budget, note); the note says when and why the pooled budget was borrowed. A budget file whose pre-registered
  per-pair test (`per_pair_test`, study/pair_budgets.py) decided "pooled" gives every pair the pooled budget;
  one whose pre-registered horizon test (`horizon_test`, experiments/horizon.py) did not show that run length moves
  the budget judges every run length against the main length's budgets.
  """
  budgets = budget_file.get("budgets", {})
  main, horizons = budget_file.get("steps"), [h for h in budget_file.get("horizons", []) if h]
  horizon_test = budget_file.get("horizon_test") or {}
  horizon = main
  if steps and horizons and horizon_test.get("decision", "moves") == "moves":
    horizon = min(horizons, key=lambda h: (abs(math.log(h / steps)), -h))
  key = lambda name: name if horizon == main else f"{name}@{horizon}"
  notes = [f"calibrated on {horizon}-step runs" + (f", this run trains {steps}" if steps and steps != horizon else "")
           ] if horizon else []
  if horizon_test and horizon_test.get("decision") != "moves" and steps and steps != main:
    notes.append("the horizon test did not show run length moves the budget")
  own, pooled = budgets.get(key(pair)), budgets.get(key("pooled"))
  test = budget_file.get("per_pair_test") or {}
  if test.get("decision") == "pooled" and pooled is not None:
    return key("pooled"), pooled, "; ".join(notes + [f"pooled: the per-pair test found the pairs indistinguishable "
                                                     f"({test.get('file', 'per_pair_test')})"])
  if own is not None and not own.get("bounded", True) and pooled is not None and pooled.get("bounded", True) \
      and pooled["budget"] > own["budget"]:
    return key("pooled"), pooled, "; ".join(notes + [f"{pair} lost nothing up to {own['budget']:.3g}"])
  for name in (key(pair), key("pooled")):
    if name in budgets:
      return name, budgets[name], "; ".join(notes)
  raise InputError(f"budget file has no budget for pair {pair!r} and no 'pooled' budget "
                   f"{'at ' + str(horizon) + ' steps ' if horizon else ''}(it has: {sorted(budgets)})")


def admit(measured: dict, budget_file: dict, pair: str, steps: int | None = None) -> dict:
  """The verdict on `measured` (Calibration.measure's metrics): admit_value on the budget file's scale."""
  value = budget_lib.SCALES[budget_file["scale"]]({f"mismatch/{k}": v for k, v in measured.items()})
  return admit_value(value, budget_file, pair, steps)


def admit_value(value: float, budget_file: dict, pair: str, steps: int | None = None) -> dict:
  """The verdict on a measured value on the budget file's scale: the one rule launch/admit.py and the validation
  (study/analysis/validation.py) apply. The budgets are in run-mean k3, so the step-0 measurement is divided by the
  budget file's measured factor first (k3_conversion.factor_for): `measured` is what the check measured,
  `compared` what it compared with the budget (the margin is on it; the confidence counts joint bootstrap draws
  of the budget and the factor). The budget is pick_budget's, so the file's pre-registered decisions apply."""
  scale = budget_file["scale"]
  source, budget, note = pick_budget(budget_file, pair, steps)
  factor, conversion = k3_conversion.factor_for(budget_file, pair, budget.get("steps"))
  result = budget_lib.verdict(value / factor, budget)
  joint = k3_conversion.confidence(value, result["admit"], budget, budget_file, pair)
  if joint is not None:  # the factor's uncertainty too
    result["confidence"] = joint
  return {**result, "measured": value, "compared": result["measured"], "k3_factor": factor,
          "conversion_note": conversion, "scale": scale, "budget_source": source, "budget_note": note}
