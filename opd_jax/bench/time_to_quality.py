"""Time to quality: wall-clock to a held-out accuracy target, a cheap-sync rollout engine vs the paper's.

Two runs of one pair from the same initialization and data:
  sync_bf16   sync rollouts, colocated, bfloat16 sampler weights and KV cache (the common baseline)
  async_fp8   fp8 weights + fp8 KV cache, async rollouts bounded by train.max_staleness, and the sampler on
              devices of its own (disaggregated: half the devices) when there are at least two
Each stops at the first evaluation whose greedy accuracy reaches the target (train.target_accuracy). Time to
target is `time/train_s` of that evaluation: wall-clock since the loop started, compilation included,
evaluations excluded (they are the measurement, not the method). Throughput is the mean of the run's
`perf/tokens_per_s` rows (response tokens the learner consumed per second).

Each run is a fresh process (spawned) with no persistent compilation cache, so both pay their own compilation:
in one process the second run would reuse the first's compiled teacher, train-step and evaluation programs
(seen on an H200: 1.23x "faster" to target at equal steady-state step time). The parent never starts a backend,
so on a GPU each child has the device's memory to itself.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os

from opd_jax.experiments.files import read_jsonl
from opd_jax.files import write_json
from opd_jax.errors import InputError

PHASES = ("sync_bf16", "async_fp8")


def phase_config(config, phase: str, target: float, eval_every: int, device_count: int):
  c = config.copy_and_resolve_references()
  c.train.target_accuracy = target
  c.train.eval_every = eval_every
  c.train.eval_sampled = False  # the target is greedy accuracy
  c.train.export_dtype = ""
  if phase == "sync_bf16":
    c.train.mode, c.rollout.weights, c.rollout.kv_cache = "sync", "bf16", "bf16"
  elif phase == "async_fp8":
    c.train.mode, c.rollout.weights, c.rollout.kv_cache = "async", "fp8", "fp8"
    if device_count >= 2:
      c.rollout.placement, c.rollout.devices = "disaggregated", device_count // 2
  else:
    raise InputError(f"unknown phase {phase!r}; phases are {PHASES}")
  return c


def summarize(workdir: str, target: float) -> dict:
  """The run's first evaluation at or above target (or its last), and its mean throughput."""
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  evals = [r for r in rows if "eval/accuracy" in r and "time/train_s" in r]
  if not evals:
    raise InputError(f"{workdir}/metrics.jsonl has no evaluation after step 0")
  hit = next((r for r in evals if r["eval/accuracy"] >= target), None)
  last = hit or evals[-1]
  speed = [r["perf/tokens_per_s"] for r in rows if "perf/tokens_per_s" in r]
  step_s = [r["perf/step_s"] for r in rows if "perf/step_s" in r]
  return {"reached": hit is not None, "step": last["step"], "accuracy": last["eval/accuracy"],
          "train_s": last["time/train_s"], "tokens_per_s": sum(speed) / max(len(speed), 1),
          "step_s": sum(step_s) / max(len(step_s), 1)}


def _train_phase(config, phase: str, target: float, eval_every: int, workdir: str) -> int:
  """One run, in a process of its own; returns the device count it ran on."""
  os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
  import jax

  from opd_jax.train.loop import train
  train(phase_config(config, phase, target, eval_every, jax.device_count()), workdir)
  return jax.device_count()


def run(config, target: float, root: str, eval_every: int) -> dict:
  """Runs both phases under `root` (which must not hold them yet), each in a fresh process; returns
  {phase: summary} + ratio."""
  if not 0 < target <= 1:
    raise InputError(f"--target must be in (0, 1], got {target}")
  for phase in PHASES:
    if os.path.exists(os.path.join(root, phase)):
      raise InputError(f"{os.path.join(root, phase)} exists; give a new --workdir (runs are not resumed here)")
  results, devices = {}, 0
  for phase in PHASES:
    workdir = os.path.join(root, phase)
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
      devices = child.submit(_train_phase, config, phase, target, eval_every, workdir).result()
    results[phase] = summarize(workdir, target)
  a, b = results["sync_bf16"], results["async_fp8"]
  results["speedup"] = a["train_s"] / b["train_s"] if a["reached"] and b["reached"] else None
  results["devices"] = devices
  results["target"] = target
  write_json(os.path.join(root, "time_to_quality.json"), results)
  return results
