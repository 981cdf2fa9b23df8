"""A plan checked against a real run: the train step's predicted peak against the peak RSS growth of running it
on real (zero) arrays on CPU, in a subprocess (launch/plan_memory.py --rss_check)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import jax
import jax.numpy as jnp

from opd_jax.planning.memory_plan import PACKAGE_PARENT, compile_memory, rss_bytes
from opd_jax.planning.plan_programs import build_programs, plan_mesh
from opd_jax.planning.plan_spec import PlanSpec


def _concrete(abstract):
  """Real arrays (zeros; ones for booleans such as prompt validity) with the abstract shapes and shardings."""
  return jax.tree.map(lambda a: jnp.ones(a.shape, a.dtype, device=a.sharding) if a.dtype == jnp.bool_
                      else jnp.zeros(a.shape, a.dtype, device=a.sharding), abstract)


def _rss_worker(plan_hex: str) -> None:
  """Subprocess body: compile the train step, then allocate real arguments and run it once; prints JSON."""
  plan = pickle.loads(bytes.fromhex(plan_hex))
  program = build_programs(plan, plan_mesh(plan), plan.micro_batch_size or plan.batch_size)[0]["train_step"]
  compiled = program.fn.lower(*program.args).compile()
  before, max_before = rss_bytes()
  jax.block_until_ready(compiled(*_concrete(program.args)))
  _, max_after = rss_bytes()
  print(json.dumps({"measured_bytes": max_after - before, "valid": max_after > max_before}))


def measure_train_step_rss(plan: PlanSpec) -> dict:
  """Predicted train-step peak vs the peak RSS growth of running it on real (zero) arrays in a subprocess.

  The subprocess compiles first, then records its RSS, allocates the arguments and runs the step once; the
  measurement is the peak RSS after the run minus the RSS before allocating. It is only valid when the run,
  not compilation, set the process's peak (`valid`); choose a plan whose step needs far more memory than
  compiling it (large vocab x response, few small layers). Untouched pages of allocated buffers do not count
  towards RSS, so the measurement can undershoot XLA's buffer sizes.
  """
  programs, _ = build_programs(plan, plan_mesh(plan), plan.micro_batch_size or plan.batch_size)
  predicted = compile_memory(programs["train_step"]).peak_bytes
  code = f"from opd_jax.planning.step_rss import _rss_worker; _rss_worker({pickle.dumps(plan).hex()!r})"
  env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={plan.devices}",
         "JAX_PLATFORMS": "cpu",
         "PYTHONPATH": os.pathsep.join(p for p in (PACKAGE_PARENT, os.environ.get("PYTHONPATH")) if p)}
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
  if result.returncode:
    raise RuntimeError(f"RSS measurement subprocess failed:\n{result.stderr[-3000:]}")
  measured = json.loads(result.stdout.strip().splitlines()[-1])
  return {"predicted_bytes": predicted, "measured_bytes": measured["measured_bytes"], "valid": measured["valid"],
          "relative_error": (predicted - measured["measured_bytes"]) / max(measured["measured_bytes"], 1)}
