"""Memory planner: does an OPD run fit the device? Answered without a GPU and without allocating weights.

The run is a PlanSpec (opd_jax/planning/plan_spec.py: the run's own RunSpec, the model shapes, the devices and
their memory). Every jitted program of the run (sampler, teacher scoring, train step, the evaluation samplers
(greedy, and temperature 1 with `train.eval_sampled`) and the evaluation reverse KL; opd_jax/planning/
plan_programs.py builds them with opd_jax/train/programs.py, as the training loop does) is compiled ahead of time with abstract, sharded arguments
(`jax.ShapeDtypeStruct` + `NamedSharding`) on a mesh of simulated CPU devices, and XLA's buffer assignment
gives per-device bytes (`compiled.memory_analysis()`):

  argument  the program's inputs (parameters, optimizer state, batch)
  output    its outputs
  temp      its intermediates (activations, logits, KV cache, gradients)
  alias     output bytes that reuse donated input buffers (the train step donates its state)
  peak      argument + output + temp - alias: what the program holds while it runs. (XLA's own
            `peak_memory_in_bytes` is not used: on XLA:CPU it leaves out the temp buffer.)

Resident bytes stay on the device between programs: teacher parameters, learner parameters, optimizer state,
the rollout batch, and on the sampler's side its weights at the rollout recipe's precision (what
rollout.weight_sync makes: `sampler_param_bytes` in the JSON), `staleness_steps` snapshots of them (none on
the device with `snapshots_on=host`), and with `split_mismatch` a dense learner copy per kept version. The
sampler is compiled on its own mesh and inference layout (rollout.placement): over the same devices when
colocated, over `rollout_devices` devices of its own when disaggregated, which are then a second pool with its
own residents. Colocated without staleness, the sampler's weights live only while the sampler runs (the loop
syncs them right before sampling). A program's total is its peak plus the resident entries of its pool that
are not among its own arguments, so nothing is counted twice. The run fits when the largest total fits the
device memory.

The largest micro-batch that fits: powers of two dividing the batch (and divisible by the mesh's batch
shards), searched by bisection (the train step's total grows with the micro-batch), compiling the train step
at each one tried.

Caveats: XLA:CPU fuses and assigns buffers differently from GPU / TPU (it may, for example, widen bfloat16
intermediates to float32), so the numbers are estimates of the right order, not guarantees; leave headroom.
`measure_train_step_rss` compares a prediction with the measured peak RSS of a real CPU run.

Legend: B batch, P prompt tokens, R response tokens, V vocab, K sampler top-k, M micro-batch.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable

import jax.numpy as jnp
from jax.sharding import Mesh

from opd_jax.models.sharding import per_device_bytes
from opd_jax.planning.plan_programs import Program, build_programs, plan_mesh, resident_pools
from opd_jax.planning.plan_spec import GIB, PlanSpec
from opd_jax.rollout.memory import concurrent_sequences, kv_token_bytes
from opd_jax.train.process_memory import rss_bytes  # noqa: F401  (re-exported: step_rss, host_memory)

# The folder that holds the opd_jax package (a checkout or site-packages): a subprocess imports it from there.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Planning compiles are never run: skip LLVM's optimizations (same buffer sizes, ~2x faster compiles on CPU).
PLANNING_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


@dataclasses.dataclass(frozen=True)
class ProgramMemory:
  argument_bytes: int
  output_bytes: int
  temp_bytes: int
  alias_bytes: int
  peak_bytes: int  # see the module docstring
  compile_seconds: float


def compile_memory(program: Program) -> ProgramMemory:
  """Lowers and compiles (never runs) the program. LLVM optimization is off: buffer assignment happens on
  the optimized HLO before LLVM, so the sizes are the same, and compiling takes about half the time."""
  start = time.perf_counter()
  compiled = program.fn.lower(*program.args).compile(compiler_options=PLANNING_COMPILER_OPTIONS)
  seconds = time.perf_counter() - start
  stats = compiled.memory_analysis()
  arg, out, temp, alias = (stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.temp_size_in_bytes,
                           stats.alias_size_in_bytes)
  return ProgramMemory(arg, out, temp, alias, arg + out + temp - alias, seconds)


@dataclasses.dataclass
class MemoryPlan:
  plan: PlanSpec
  programs: dict[str, ProgramMemory]  # compiled at micro_batch_used
  totals: dict[str, int]  # program peak + resident entries it does not take as arguments
  resident: dict[str, int]
  micro_batch_used: int
  micro_batch_size: int  # largest that fits (0: none does)
  micro_batch_totals: dict[int, int]  # train-step total at each micro-batch compiled
  pools: dict[str, str] = dataclasses.field(default_factory=dict)  # program -> learner | sampler (its devices)
  planner_peak_rss_bytes: int = 0  # the planning process's own peak RSS: the host memory its compiles needed
  paged: dict = dataclasses.field(default_factory=dict)  # rollout.engine=paged: `paged_capacity` (else empty)

  @property
  def peak_bytes_per_device(self) -> int:
    return max(self.totals.values())

  @property
  def fits(self) -> bool:
    return self.peak_bytes_per_device <= self.plan.device_memory_bytes

  def to_json(self) -> dict:
    return {
        "fits": self.fits, "peak_bytes_per_device": self.peak_bytes_per_device,
        "device_memory_bytes": self.plan.device_memory_bytes, "micro_batch_size": self.micro_batch_size,
        "micro_batch_used": self.micro_batch_used,
        "programs": {name: m.peak_bytes for name, m in self.programs.items()},
        "program_totals": dict(self.totals), "resident_bytes": dict(self.resident),
        "program_details": {name: dataclasses.asdict(m) for name, m in self.programs.items()},
        "micro_batch_totals": {str(k): v for k, v in sorted(self.micro_batch_totals.items())},
        "placement": self.plan.placement, "learner_devices": self.plan.learner_devices,
        "sampler_devices": self.plan.sampler_devices,
        "sampler_param_bytes": self.resident["sampler_weights"],  # per sampler device
        "host_snapshot_bytes": (self.resident["sampler_weights"] * self.plan.staleness_steps
                                if self.plan.snapshots_on == "host" else 0),  # per sampler device, host memory
        "planner_peak_rss_bytes": self.planner_peak_rss_bytes,
        **({"paged": self.paged} if self.paged else {}),
    }


def paged_capacity(plan: PlanSpec, decode: Program, decode_total: int) -> dict:
  """rollout.engine=paged: sequences of the run's full length (prompt + cap) that a KV pool holds in the memory its
  decode round leaves free on the sampler's device (everything but the pool: weights, residents, the round's
  temporaries), per KV dtype, the run's own first; static = rows reserving every slot, paged = whole pages of the
  full length (rollout.memory.concurrent_sequences; shorter responses fit more)."""
  pool = per_device_bytes(decode.args[1])
  free = max(plan.device_memory_bytes - (decode_total - pool), 0)
  P, R, Z = plan.prompt_tokens, plan.response_tokens, plan.run.rollout.page_size
  native = jnp.dtype(plan.model_options("student")["dtype"]).itemsize
  by_dtype = {}
  for kv in dict.fromkeys((plan.kv_cache, "bf16", "fp8_e4m3", "fp8_e4m3_bf16scale", "int4")):
    per_token = kv_token_bytes(plan.student, kv, native)
    sequences = concurrent_sequences(free // per_token, prompt_tokens=P, max_new_tokens=R, mean_tokens=P + R,
                                     page_size=Z)
    by_dtype[kv] = {"bytes_per_token": per_token, "kv_tokens": free // per_token, "sequences": sequences["paged"]}
  return {"pool_bytes": pool, "free_bytes": free, "sequence_tokens": P + R, "page_size": Z, "by_kv_dtype": by_dtype}


def _total(memory: ProgramMemory, program: Program, resident: dict[str, int], plan: PlanSpec) -> int:
  """The program's peak plus what stays resident on its devices and is not among its arguments. Colocated, the
  sampler's programs run on the learner's devices, beside everything the learner keeps there."""
  pools = resident_pools(plan)
  runs_on = program.pool if plan.disaggregated else "learner"
  return memory.peak_bytes + sum(b for name, b in resident.items()
                                 if name not in program.uses and pools[name] == runs_on)


def micro_batch_candidates(plan: PlanSpec) -> list[int]:
  """Powers of two that divide the batch and split evenly over the mesh's batch shards, ascending."""
  return [m for m in (2 ** i for i in range(plan.batch_size.bit_length()))
          if plan.batch_size % m == 0 and m % plan.batch_shards == 0]


def largest_micro_batch(plan: PlanSpec, mesh: Mesh, resident: dict[str, int], totals: dict[int, int],
                        log: Callable[[str], None] = lambda s: None) -> int:
  """Bisection over micro_batch_candidates (upper middle first: the answer is usually near the top), starting
  from what `totals` (micro-batch -> train-step total) already knows; compiles fill `totals`."""
  candidates, best = micro_batch_candidates(plan), 0
  lo, hi = 0, len(candidates) - 1
  for m, total in totals.items():  # known results narrow the range
    if m in candidates and total <= plan.device_memory_bytes:
      best, lo = max(best, m), max(lo, candidates.index(m) + 1)
    elif m in candidates:
      hi = min(hi, candidates.index(m) - 1)
  while lo <= hi:
    mid = (lo + hi + 1) // 2
    m = candidates[mid]
    program = build_programs(plan, mesh, m)[0]["train_step"]
    memory = compile_memory(program)
    totals[m] = _total(memory, program, resident, plan)
    log(f"  train_step at micro-batch {m}: total {totals[m] / GIB:.2f} GiB ({memory.compile_seconds:.1f} s compile)")
    if totals[m] <= plan.device_memory_bytes:
      best, lo = m, mid + 1
    else:
      hi = mid - 1
  return best


def plan_memory(plan: PlanSpec, log: Callable[[str], None] = lambda s: None) -> MemoryPlan:
  """Compiles every program at the configured micro-batch, then searches the largest micro-batch that fits."""
  mesh = plan_mesh(plan)
  used = plan.micro_batch_size or plan.batch_size
  programs, resident_trees = build_programs(plan, mesh, used)
  resident = {name: per_device_bytes(tree) for name, tree in resident_trees.items()}
  memory = {}
  for name, program in programs.items():
    memory[name] = compile_memory(program)
    log(f"  compiled {name} in {memory[name].compile_seconds:.1f} s")
  totals = {name: _total(memory[name], program, resident, plan) for name, program in programs.items()}
  trials = {used: totals["train_step"]}
  best = largest_micro_batch(plan, mesh, resident, trials, log)
  pools = {name: program.pool for name, program in programs.items()}
  paged = paged_capacity(plan, programs["sampler_decode"], totals["sampler_decode"]) if (
      "sampler_decode" in programs) else {}
  return MemoryPlan(plan, memory, totals, resident, used, best, trials, pools, rss_bytes()[1], paged)
