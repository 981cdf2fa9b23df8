"""Host memory of a run: the peak resident set size (RSS) `launch/train.py` reaches, predicted without running it.

The device plan (memory_plan) gives XLA's buffer sizes per device. A process needs more than its buffers; on the
CPU backend, where device buffers are host memory, the peak RSS of a run is the sum of

  runtime   the interpreter, jax/XLA, the run's package imports and its tokenizers (transformers alone is
            ~200 MB): measured in a child process that imports what the training loop imports and loads the
            run's tokenizers
  compile   what XLA's compiler holds while it builds the run's programs at the run's compiler settings (not the
            planner's cheaper ones): measured in the same child as its peak RSS after compiling every program
            of the plan, minus the runtime. glibc keeps freed memory in the process, so the compiler's peak stays
            in the RSS of a run
  device    on CPU only: per pool, the largest program total (peak + residents) x the pool's devices
  snapshots staleness snapshots kept in host memory (`rollout.snapshots_on=host`), any backend

No term is fitted: the first two are measured by compiling (never running) the run's programs, the last two
come from XLA's buffer assignment. Known bias: the run interleaves its compiles with executions whose buffers
keep part of the compiler's freed memory from being reused, while the child compiles back to back, so the
prediction runs low (pair1: 1.14-1.16 GB predicted, 1.32-1.38 GB measured without the compilation cache;
results/host_rss.jsonl has the shipped comparisons). It assumes the run compiles every program itself: a
warm persistent compilation cache lowers the compile term (the same pair1 run peaked at 1.13 GB with it). It
also assumes a bounded allocator retention, which `train.malloc_arena_max` (glibc's arena cap, applied at
the start of launch/train.py) helps: without the cache, 60-step pair1 runs peaked at 1.32-1.37 GB in four runs
capped at two arenas and at 1.35 and 1.46 GB in two with glibc's default (GB = 1e9 bytes). With one arena and
freed memory kept (`train.malloc_keep_freed`, today's defaults) the process keeps its high-water mark; pair1's
run peaked at 1.34 GB (results/host_rss.jsonl). Not counted yet: on CPU the
sampler decodes from a dense per-layer copy of its weights made once per call (rollout.weight_layout=auto ->
dense_layers), while the plan compiles the accelerator layout (stored), so a CPU run can peak one sampler-weight
copy (in the learner's dtype) above the prediction.

On an accelerator the device buffers are not host memory and the compiler is another one; this prediction is
for runs on the CPU backend (the laptop case), and the device plan is the one for accelerators.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys

from opd_jax.planning import memory_plan as mp
from opd_jax.planning.plan_programs import build_programs, plan_mesh
from opd_jax.planning.plan_spec import PlanSpec


# The step-0 evaluation compiles first, then the first rollout, its scoring and the train step.
RUN_ORDER = ("eval_sampler", "eval_sampler_sampled", "eval_reverse_kl", "sampler", "sampler_dense", "sampler_prefill",
             "sampler_decode", "teacher_score", "train_step")


@dataclasses.dataclass(frozen=True)
class HostPrediction:
  runtime_bytes: int  # imports + tokenizers
  compile_bytes: int  # the compiler's peak on top of the runtime, all programs at the run's settings
  device_bytes: int  # CPU backend: device buffers live in host memory
  snapshot_bytes: int  # host-side staleness snapshots

  @property
  def peak_bytes(self) -> int:
    return self.runtime_bytes + self.compile_bytes + self.device_bytes + self.snapshot_bytes

  def to_json(self) -> dict:
    return {**dataclasses.asdict(self), "peak_bytes": self.peak_bytes}


def _worker(plan_hex: str, tokenizer_dirs: list[str]) -> None:
  """Child process body: the run's imports and tokenizers, then every program compiled at the run's compiler
  settings (never run); prints JSON with the RSS after the imports and the peak after compiling."""
  import importlib
  importlib.import_module("opd_jax.train.loop")  # what launch/train.py imports
  from opd_jax.models import load_tokenizer
  for path in tokenizer_dirs:
    load_tokenizer(path)
  plan = pickle.loads(bytes.fromhex(plan_hex))
  runtime, _ = mp.rss_bytes()
  programs, _ = build_programs(plan, plan_mesh(plan), plan.micro_batch_size or plan.batch_size)
  order = lambda name: RUN_ORDER.index(name) if name in RUN_ORDER else len(RUN_ORDER)
  for name in sorted(programs, key=order):  # as the loop first calls them (later ones reuse freed memory)
    programs[name].fn.lower(*programs[name].args).compile()
  print(json.dumps({"runtime_bytes": runtime, "compiled_peak_bytes": mp.rss_bytes()[1]}))


def measure_runtime_and_compile(plan: PlanSpec, tokenizer_dirs: list[str]) -> tuple[int, int]:
  """(runtime bytes, compile bytes) from a child process on the CPU backend (see the module docstring)."""
  code = (f"from opd_jax.planning.host_memory import _worker; "
          f"_worker({pickle.dumps(plan).hex()!r}, {list(tokenizer_dirs)!r})")
  env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={plan.devices}",
         "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
         "PYTHONPATH": os.pathsep.join(p for p in (mp.PACKAGE_PARENT, os.environ.get("PYTHONPATH")) if p)}
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
  if result.returncode:
    raise RuntimeError(f"host-memory measurement subprocess failed:\n{result.stderr[-3000:]}")
  measured = json.loads(result.stdout.strip().splitlines()[-1])
  return measured["runtime_bytes"], measured["compiled_peak_bytes"] - measured["runtime_bytes"]


def device_bytes_on_host(result: mp.MemoryPlan) -> int:
  """CPU backend: the largest program total of each pool times the pool's devices (one pool when colocated)."""
  plan = result.plan
  if not plan.disaggregated:
    return plan.devices * max(result.totals.values())
  return sum(devices * max((total for name, total in result.totals.items() if result.pools[name] == pool),
                           default=0) for pool, devices in (("learner", plan.learner_devices),
                                                            ("sampler", plan.sampler_devices)))


def predict(result: mp.MemoryPlan, tokenizer_dirs: list[str]) -> HostPrediction:
  """Peak host RSS of the planned run on the CPU backend (see the module docstring)."""
  runtime, compile_bytes = measure_runtime_and_compile(result.plan, tokenizer_dirs)
  plan = result.plan
  snapshots = (result.resident["sampler_weights"] * plan.staleness_steps * plan.sampler_devices
               if plan.snapshots_on == "host" else 0)
  return HostPrediction(runtime, compile_bytes, device_bytes_on_host(result), snapshots)
