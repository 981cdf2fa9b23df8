"""Screening many rollout configurations at once: one calibration batch, one verdict each, a ranked table.

A candidate is a set of `config.rollout` overrides, e.g. `weights=fp8,kv_cache=fp8,staleness_steps=2`. All
candidates share one calibration batch (one sampler-vs-learner comparison each, see screening.admission) and,
when some are stale, one short run of lagged learner versions up to the largest staleness asked for (a
candidate with staleness s reads versions 0 and s of it).

The ranking answers "which admitted recipe is cheapest": admitted candidates first, by the KV-cache tokens
their recipe leaves room for at a real model shape (weights + staleness snapshots at the recipe's precision
taken from the device, `opd_jax.rollout.memory`), then rejected ones by measured mismatch.

Inline syntax: candidates separated by `;`, overrides by `,`, e.g.
  "weights=fp8;weights=fp8,kv_cache=fp8;weights=int8,staleness=2;noise=0.1"
A file holds a JSON list of objects, or one JSON object per line, e.g. {"name": "fp8+kv", "weights": "fp8",
"kv_cache": "fp8"}. Short names: staleness -> staleness_steps, noise -> noise_sigma, kv -> kv_cache.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

from opd_jax.errors import InputError
from opd_jax.models.config import ModelConfig
from opd_jax.rollout import memory
from opd_jax.rollout.config import RolloutConfig
from opd_jax.screening import admission
from opd_jax.screening.calibration import Calibration
from opd_jax.spec import RunSpec

ALIASES = {"staleness": "staleness_steps", "noise": "noise_sigma", "kv": "kv_cache"}
GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Candidate:
  name: str
  overrides: dict


def _value(text: str):
  try:
    return json.loads(text)
  except json.JSONDecodeError:
    return text


def _candidate(overrides: dict, where: str) -> Candidate:
  if not isinstance(overrides, dict) or not overrides:
    raise InputError(f"{where}: a candidate must be a non-empty set of rollout overrides, got {overrides!r}")
  overrides = dict(overrides)
  name = overrides.pop("name", None)
  overrides = {ALIASES.get(k, k): v for k, v in overrides.items()}
  name = name or ",".join(f"{k}={v}" for k, v in overrides.items())
  return Candidate(str(name), overrides)


def parse(spec: str) -> list[Candidate]:
  """Candidates from a file (JSON list, or JSON lines) or an inline `a=1,b=2;c=3` list; errors name the part."""
  if not spec or not spec.strip():
    raise InputError("--candidates is empty; give a file or a list like 'weights=fp8;weights=int8,kv_cache=int8'")
  if os.path.isfile(spec):
    try:
      with open(spec, encoding="utf-8") as f:
        text = f.read()
    except UnicodeDecodeError:
      raise InputError(f"--candidates file {spec} is not UTF-8 text") from None
    try:
      items = json.loads(text)
      items = items if isinstance(items, list) else [items]
      return [_candidate(item, f"{spec}: item {i + 1}") for i, item in enumerate(items)]
    except json.JSONDecodeError:
      out = []
      for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
          try:
            out.append(_candidate(json.loads(line), f"{spec}:{number}"))
          except json.JSONDecodeError as e:
            raise InputError(f"{spec}:{number}: not valid JSON ({e.msg}); one candidate object per line") from None
      return out
  if spec.endswith((".json", ".jsonl")):
    raise InputError(f"--candidates file {spec} does not exist")
  out = []
  for i, part in enumerate(p for p in spec.split(";") if p.strip()):
    overrides = {}
    for item in part.split(","):
      key, sep, value = item.partition("=")
      if not sep or not key.strip():
        raise InputError(f"--candidates: {item.strip()!r} in candidate {i + 1} is not field=value")
      overrides[key.strip()] = _value(value.strip())
    out.append(_candidate(overrides, f"--candidates candidate {i + 1}"))
  return out


def rollout_for(base: RolloutConfig, candidate: Candidate) -> RolloutConfig:
  """The pair's rollout config with the candidate's overrides; an unknown or bad field names the candidate."""
  fields = {f.name for f in dataclasses.fields(RolloutConfig)}
  unknown = sorted(set(candidate.overrides) - fields)
  if unknown:
    raise InputError(f"candidate {candidate.name!r}: unknown rollout field(s) {unknown}; known: {sorted(fields)}")
  values = {f.name: getattr(base, f.name) for f in dataclasses.fields(RolloutConfig)}
  if "weights" in candidate.overrides and "weight_rules" not in candidate.overrides:
    values["weight_rules"] = ()  # the pair's expanded rules must not override the candidate's shorthand
  values.update(candidate.overrides)
  try:
    return RolloutConfig(**values)
  except ValueError as e:
    raise InputError(f"candidate {candidate.name!r}: {e}") from None


def rollouts_for(base: RolloutConfig, candidates: list[Candidate]) -> list[RolloutConfig]:
  """Every candidate's rollout config (the run's, overridden); checked before anything is measured."""
  return [rollout_for(base, c) for c in candidates]


def capacity(shape: ModelConfig, rollout: RolloutConfig, device_bytes: int, reserve_fraction: float = 0.1) -> dict:
  """Sampler weights (+ staleness snapshots at the same precision) and the KV tokens left at a real shape."""
  weights = memory.weight_bytes(shape, rollout.weight_rules)
  held = weights * (1 + rollout.staleness_steps)
  per_token = memory.kv_token_bytes(shape, rollout.kv_cache)
  free = device_bytes * (1 - reserve_fraction) - held
  return {"weight_bytes": weights, "held_weight_bytes": held, "kv_bytes_per_token": per_token,
          "kv_tokens": max(int(free // per_token), 0)}


def screen(cal: Calibration, spec: RunSpec, candidates: list[Candidate], budget_file: dict, *, shape: ModelConfig,
           device_bytes: int, seed: int = 0, steps: int | None = None) -> list[dict]:
  """Measures and judges every candidate (against the budget at the horizon nearest `steps`); returns rows ranked
  as the module docstring says."""
  rollouts = rollouts_for(spec.rollout, candidates)
  for rollout in rollouts:
    rollout.validate_for(cal.params)
  longest = max(r.staleness_steps for r in rollouts)
  lag_seconds, versions = 0.0, None
  if longest:
    start = time.perf_counter()
    versions = admission.lagged_versions(cal, spec, longest, seed, keep={0} | {r.staleness_steps for r in rollouts})
    lag_seconds = time.perf_counter() - start
  reference = capacity(shape, RolloutConfig(weights="bf16", kv_cache="bf16"), device_bytes)["kv_tokens"]
  rows = []
  for candidate, rollout in zip(candidates, rollouts):
    start = time.perf_counter()
    measured = admission.measure_candidate(cal, spec, rollout, seed, versions)
    verdict = admission.admit(measured, budget_file, spec.pair.name, steps)
    room = capacity(shape, rollout, device_bytes)
    rows.append({"candidate": candidate.name, "overrides": candidate.overrides, **verdict, **room,
                 "kv_tokens_vs_bf16": room["kv_tokens"] / max(reference, 1),
                 "seconds": time.perf_counter() - start})
  # Admitted: most KV tokens first, ties by smaller mismatch; rejected: smallest mismatch first.
  rows.sort(key=lambda r: (not r["admit"], -r["kv_tokens"] if r["admit"] else 0, r["measured"]))
  for rank, row in enumerate(rows, 1):
    row["rank"] = rank
  if longest:
    for row in rows:
      row["shared_lag_seconds"] = lag_seconds
  return rows


def format_table(rows: list[dict], shape_name: str, device_gb: float) -> str:
  lines = [f"{'#':>2}  {'candidate':<44} {'k3':>9} {'verdict':>7} {'margin':>7} {'weights GiB':>11} "
           f"{'KV tokens @ ' + shape_name:>22} {'vs bf16':>7} {'s':>5}"]
  for r in rows:
    lines.append(f"{r['rank']:>2}  {r['candidate'][:44]:<44} {r['measured']:>9.3g} "
                 f"{'ADMIT' if r['admit'] else 'REJECT':>7} {r['margin']:>+7.0%} {r['held_weight_bytes'] / GIB:>11.2f} "
                 f"{r['kv_tokens']:>22,} {r['kv_tokens_vs_bf16']:>6.2f}x {r['seconds']:>5.1f}")
  lines.append(f"(weights GiB include staleness snapshots at the recipe's precision; KV tokens on one "
               f"{device_gb:g} GiB device with a 10% reserve, vs bf16 weights + bf16 KV; s: measuring each"
               + (f", plus {rows[0]['shared_lag_seconds']:.1f} s once for the lagged learner versions)"
                  if "shared_lag_seconds" in rows[0] else ")"))
  return "\n".join(lines)
