"""The mismatch floor of mixed precision: k3 between sampler and learner that share weights but not compute dtype.

A learner computing in bfloat16 and a sampler computing in float32 (or both in bfloat16, with the sampler's
KV cache and decode order) differ by rounding alone. That floor sits under every measured mismatch, so it must
be far below the budgets (goal: k3 <= 1e-4 on pair1). The LM head accumulates in float32 in every case
(`Decoder.logits`), so the floor comes from the layers, not from rounding the logits. Each row also shows what
an int8 / fp8 weight recipe adds on top of it.
"""

from __future__ import annotations

import dataclasses

import jax
from flax import nnx

from opd_jax.experiments.files import write_json
from opd_jax.rollout.config import RolloutConfig
from opd_jax.screening.calibration import Calibration
from opd_jax.spec import RunSpec

COMPUTE_PAIRS = (("float32", "float32"), ("float32", "bfloat16"), ("bfloat16", "bfloat16"))  # (sampler, learner)


def _graphdef(spec: RunSpec, compute_dtype: str):
  from opd_jax.models import load_pretrained
  pair, m = spec.pair, spec.pair.model
  model = load_pretrained(pair.student, pair.student_param_dtype, compute_dtype=compute_dtype,
                          attention=m.attention, remat=m.remat, scan_layers=m.scan_layers)
  return nnx.split(model)[0]


def measure_floor(spec: RunSpec, num_prompts: int = 256, seed: int = 0, recipes=("none", "int8", "fp8")) -> list[dict]:
  """One row per (sampler compute, learner compute, weight recipe): k3, k1 and the vocabulary KL(mu || pi)."""
  cal = Calibration.from_spec(spec, num_prompts, seed)
  graphdefs = {dtype: _graphdef(spec, dtype) for dtype in ("float32", "bfloat16")}
  rows = []
  for sampler_dtype, learner_dtype in COMPUTE_PAIRS:
    pair_cal = dataclasses.replace(cal, graphdef=graphdefs[sampler_dtype], learner_graphdef=graphdefs[learner_dtype])
    for weights in recipes:
      rollout = RolloutConfig(weights=weights, temperature=spec.rollout.temperature,
                              max_new_tokens=spec.rollout.max_new_tokens)
      metrics = pair_cal.measure(rollout, jax.random.key(seed))
      rows.append({"sampler_compute": sampler_dtype, "learner_compute": learner_dtype, "weights": weights,
                   "k3": metrics["k3"], "k1": metrics["k1"],
                   "vocab_kl": metrics.get("vocab/kl_sampler_learner", float("nan"))})
  return rows


def write_floor(path: str, pair: str, num_prompts: int, rows: list[dict]) -> None:
  """The rows as one JSON file (pair, prompts, rows), written whole or not at all."""
  write_json(path, {"pair": pair, "prompts": num_prompts, "rows": rows})
