"""The memory plan as a table: per-device sizes per program, residents, verdict and the largest micro-batch
(launch/plan_memory.py prints it; --json gives the same numbers)."""

from __future__ import annotations

from opd_jax.models.sharding import mesh_shape
from opd_jax.planning.memory_plan import MemoryPlan
from opd_jax.planning.plan_spec import GIB


def format_plan(result: MemoryPlan) -> str:
  """The human-readable table: per-device sizes per program (GiB, or MiB below 1 GiB of device memory),
  residents, verdict, largest micro-batch."""
  p, G = result.plan, result.plan.device_memory_bytes
  unit, name = (GIB, "GiB") if G >= GIB else (2 ** 20, "MiB")
  size = lambda n: f"{n / unit:.2f}"
  data, fsdp, tensor = mesh_shape(-1, p.mesh_fsdp, p.mesh_tensor, p.learner_devices)
  s_data = p.sampler_devices // p.rollout_tensor
  lines = [f"B={p.batch_size} P={p.prompt_tokens} R={p.response_tokens}; weights={p.weights}"
           f"{'+embedding' if p.quantize_embedding else ''} kv_cache={p.kv_cache} staleness={p.staleness_steps} "
           f"(snapshots on {p.snapshots_on}); learner mesh data={data} fsdp={fsdp} tensor={tensor}; sampler "
           f"{p.placement} on {p.sampler_devices} device(s), data={s_data} tensor={p.rollout_tensor}; device memory "
           f"{size(G)} {name}; programs compiled with micro-batch {result.micro_batch_used}",
           f"{f'program ({name}/device)':<22}{'argument':>10}{'output':>10}{'temp':>10}{'alias':>10}{'peak':>10}"
           f"{'+resident':>11}{'total':>10}  fits  compile_s"]
  for program, m in result.programs.items():
    total = result.totals[program]
    lines.append(f"{program:<22}{size(m.argument_bytes):>10}{size(m.output_bytes):>10}{size(m.temp_bytes):>10}"
                 f"{size(m.alias_bytes):>10}{size(m.peak_bytes):>10}{size(total - m.peak_bytes):>11}"
                 f"{size(total):>10}  {'yes ' if total <= G else 'NO  '}  {m.compile_seconds:9.1f}")
  lines.append(f"resident between programs ({name}/device of its pool): "
               + ", ".join(f"{k} {size(v)}" for k, v in result.resident.items()))
  lines.append(f"sampler weights: {size(result.resident['sampler_weights'])} {name} per sampler device")
  if result.paged:  # rollout.engine=paged: what its KV pool could hold on the sampler's device
    paged = result.paged
    lines.append(f"paged engine: KV pool {size(paged['pool_bytes'])} {name} as configured; sequences of "
                 f"{paged['sequence_tokens']} tokens ({paged['page_size']}-token pages) that fit beside the decode "
                 f"round's other memory: " + ", ".join(f"{kv} {v['sequences']:,}"
                                                      for kv, v in paged["by_kv_dtype"].items()))
  over = [n for n, t in result.totals.items() if t > G]
  lines.append(f"verdict: {'FITS' if result.fits else 'DOES NOT FIT'}: max total {size(result.peak_bytes_per_device)}"
               f" vs {size(G)} {name}" + (f" (over: {', '.join(over)})" if over else ""))
  tried = ", ".join(f"{m}: {size(t)}" for m, t in sorted(result.micro_batch_totals.items()))
  lines.append(f"largest micro-batch that fits: {result.micro_batch_size or 'none'} "
               f"(train-step total {name} by micro-batch: {tried})")
  return "\n".join(lines)
