"""Static sampler vs paged engine, side by side in one process (issue 37's benchmark).

  python launch/bench/engine.py --checkpoint=smollm2 --out=results/bench/engine.json   # the prepared SmolLM2
  python launch/bench/engine.py --checkpoint=DIR --requests=16 --new_tokens=32          # any HF directory

Workloads (both engines on the same weights and requests, every request under its own key, so both draw the same
tokens; compile excluded, medians over --repeats rounds run interleaved):
  equal     --requests rows of --prompt_tokens random ids, EOS off: every row generates --new_tokens.
  longtail  the first --requests held-out chat prompts (chat template), temperature --temperature, natural EOS,
            cap --new_tokens: the static sampler decodes them in batches of --rows (each batch runs until its
            longest row ends), the paged engine keeps --rows sequences running and admits the next as one ends.
            On the long tail a third engine runs: the paged engine in the static batches' KV memory (a pool of the
            bytes the static sampler reserves) with --memory_rows rows, since holding more sequences in the same
            memory is what paging is for.
Reported: useful (non-pad) tokens per second, decode steps of one row (rows x steps), compiles, peak KV bytes.
Capacity: in a fixed KV budget (--kv_budget_mib), how many long-tail sequences each engine holds at once, per KV
dtype (fp8_e4m3_bf16scale: fp8 values with bfloat16 scales, rollout.kv_cache): the static sampler reserves
prompt + cap slots per row; the paged engine (as many rows as the pool could hold, a pool of the budget's bytes,
--admit_headroom of it kept free at each admission) is measured by its mean live rows over the rounds in which
requests were waiting (the engine full), beside its peak, its preemptions and what
rollout.memory.concurrent_sequences predicts from the workload's mean sequence length. Its requests
(--capacity_requests) cycle through the long-tail prompts, each under its own key: enough that requests wait
through most rounds at the smallest KV dtype too (64 requests left int4's pool, which holds about 58 of them, never
full, and fp8's full in 7 rounds of 64).
"""

import os
import time

from absl import flags

import _inputs  # launch/bench/_inputs.py: this script's own directory is first on sys.path
from launch import _cli

_CHECKPOINT = flags.DEFINE_string("checkpoint", "smollm2", "An HF directory, or 'smollm2' for the prepared SmolLM2.")
_REQUESTS = flags.DEFINE_integer("requests", 64, "Requests per workload.")
_ROWS = flags.DEFINE_integer("rows", 16, "Rows decoded at once (the static batch; the paged engine's rows).")
_NEW = flags.DEFINE_integer("new_tokens", 256, "Cap on new tokens (every row's length with EOS off).")
_PROMPT = flags.DEFINE_integer("prompt_tokens", 32, "Prompt length of the equal-length workload.")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature of the long-tail workload.")
_PAGE = flags.DEFINE_integer("page_size", 16, "Paged engine: tokens per page.")
_STEPS = flags.DEFINE_integer("decode_steps", 8, "Paged engine: decode steps per host round trip.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed rounds.")
_KV_BUDGET = flags.DEFINE_float("kv_budget_mib", 64.0, "KV memory budget of the capacity measurement (MiB).")
_KV_DTYPES = flags.DEFINE_list("kv_dtypes", ["bf16", "fp8_e4m3", "fp8_e4m3_bf16scale", "int4"],
                               "KV dtypes of the capacity measurement.")
_MEMORY_ROWS = flags.DEFINE_integer("memory_rows", 0, "Long tail: rows of the paged engine in the static batches' "
                                    "KV memory; 0 = 2 x --rows.")
_CAPACITY_REQUESTS = flags.DEFINE_integer("capacity_requests", 256, "Capacity: requests (the long-tail prompts, "
                                          "cycled, each under its own key).")
_HEADROOM = flags.DEFINE_float("admit_headroom", 0.1, "Capacity: share of the pool kept free at each admission.")
_WORKLOADS = flags.DEFINE_list("workloads", ["equal", "longtail", "capacity"], "What to run.")
_OUT = flags.DEFINE_string("out", None, "Write the measurements to this JSON file.")


def _static_runner(graphdef, state, sampling, prompts, keys, rows, token_bytes):
  """Decode the prompts in batches of `rows` with the static sampler; returns (call, stats of the last call).
  Its KV cache: every row reserves the longest prompt plus the cap, `token_bytes` per token."""
  import numpy as np

  from opd_jax.rollout.sampler import Sampler, left_pad
  sampler = Sampler(graphdef, sampling)
  width = max(map(len, prompts))
  batches = [(left_pad(prompts[i:i + rows], sampling.pad_id, width), keys[i:i + rows])
             for i in range(0, len(prompts), rows)]
  stats = {}

  def call():
    useful, row_steps, drawn = 0, 0, []
    for (tokens, valid), batch_keys in batches:
      out = sampler(state, tokens, valid, batch_keys)
      mask = np.asarray(out.mask_BxN)
      useful += int(mask.sum())
      row_steps += len(tokens) * int(mask.sum(axis=1).max())  # every row steps until the longest ends
      drawn.append(np.where(mask > 0, np.asarray(out.tokens_BxN), -1))
    stats.update(useful_tokens=useful, row_steps=row_steps, compiles=sampler._fn._cache_size(),
                 tokens=np.concatenate(drawn),
                 peak_kv_bytes=min(rows, len(prompts)) * (width + sampling.max_new_tokens) * token_bytes)
    return useful
  return call, stats


def _paged_runner(graphdef, state, sampling, prompts, keys, engine_config):
  from opd_jax.rollout.engine import PagedEngine
  engine = PagedEngine(graphdef, sampling, engine_config)
  engine.warmup(state)  # every program shape, so no mix of requests compiles inside a timed call
  stats = {}

  def call():
    import numpy as np
    out, s = engine.generate(state, prompts, keys)
    stats.update(s, row_steps=s["decode_row_steps"], compiles=sum(engine.traces.values()),
                 tokens=np.where(np.asarray(out.mask_BxN) > 0, np.asarray(out.tokens_BxN), -1))
    return s["useful_tokens"]
  return call, stats, engine_config


def _timed(runners: dict, repeats: int) -> dict:
  for call, *_ in runners.values():  # compile and warm up
    call()
  times = {name: [] for name in runners}
  for _ in range(repeats):
    for name, (call, *_) in runners.items():
      start = time.perf_counter()
      call()
      times[name].append(time.perf_counter() - start)
  return {name: sorted(t)[(len(t) - 1) // 2] for name, t in times.items()}


def _compare(name, graphdef, state, sampling, prompts, keys, engine_config, token_bytes, same_memory=False) -> dict:
  """Static vs paged (same rows), and with `same_memory` the paged engine with --memory_rows rows in a pool of the
  static batches' KV bytes."""
  import dataclasses
  runners = {"static": _static_runner(graphdef, state, sampling, prompts, keys, _ROWS.value, token_bytes),
             "paged": _paged_runner(graphdef, state, sampling, prompts, keys, engine_config)}
  if same_memory:
    static_tokens = min(_ROWS.value, len(prompts)) * (max(map(len, prompts)) + sampling.max_new_tokens)
    memory_config = dataclasses.replace(engine_config, max_rows=_MEMORY_ROWS.value or 2 * _ROWS.value,
                                        num_pages=1 + static_tokens // engine_config.page_size)
    runners["paged_same_memory"] = _paged_runner(graphdef, state, sampling, prompts, keys, memory_config)
  seconds = _timed(runners, _REPEATS.value)
  row = {"workload": name, "requests": len(prompts), "rows": _ROWS.value, "new_tokens": sampling.max_new_tokens}
  for engine, (_, stats, *_) in runners.items():
    row[engine] = {"seconds": seconds[engine], "useful_tokens": stats["useful_tokens"],
                   "tokens_per_s": stats["useful_tokens"] / seconds[engine], "row_steps": stats["row_steps"],
                   "compiles": stats["compiles"], **({"peak_kv_bytes": stats["peak_kv_bytes"]}
                                                      if "peak_kv_bytes" in stats else {})}
    if engine != "static":  # the share of requests whose tokens equal the static sampler's (same per-request keys)
      same = [(a == b).all() for a, b in zip(stats["tokens"], runners["static"][1]["tokens"])]
      row[engine].update(rows=runners[engine][2].max_rows, pool_pages=stats["pool_pages"],
                         preempted=stats.get("preempted", 0), same_tokens=float(sum(same) / len(same)))
      row[f"{engine}_vs_static"] = row[engine]["tokens_per_s"] / row["static"]["tokens_per_s"]
  for engine in runners:
    if engine != "static":
      print(f"{name:<9} static {row['static']['tokens_per_s']:8.1f} tok/s  {engine} {row[engine]['tokens_per_s']:8.1f} "
            f"tok/s  ({row[f'{engine}_vs_static']:.2f}x)  row steps {row['static']['row_steps']} vs "
            f"{row[engine]['row_steps']}, same tokens {row[engine]['same_tokens']:.0%}", flush=True)
  return row


def _capacity(graphdef, state, sampling, prompts, keys, mc) -> list[dict]:
  """Sequences held at once in a fixed KV budget, per KV dtype: static reserves prompt + cap slots per row; the
  paged engine's mean live rows while requests wait, in a pool of the budget's bytes (decoding the long-tail
  requests)."""
  import dataclasses

  import numpy as np

  from opd_jax.rollout.engine import EngineConfig, PagedEngine
  from opd_jax.rollout.kv_cache import kv_bytes_per_token
  from opd_jax.rollout.memory import concurrent_sequences
  budget = int(_KV_BUDGET.value * 2 ** 20)
  out = []
  for kv in _KV_DTYPES.value:
    per_token = kv_bytes_per_token(num_layers=mc.num_hidden_layers, num_kv_heads=mc.num_key_value_heads,
                                   head_dim=mc.head_dim, kv_dtype=kv, native_bytes=4)
    static_rows = budget // (per_token * (max(map(len, prompts)) + sampling.max_new_tokens))
    pages = budget // (per_token * _PAGE.value)
    # Rows: as many as the pool could ever hold (each holds its prompt's pages), so pages alone limit the rows held,
    # and decode rounds (at least a quarter of the rows) do not compute 64 of 256 rows while 20 are live.
    rows = min(len(prompts), pages // -(-min(map(len, prompts)) // _PAGE.value))
    config = EngineConfig(page_size=_PAGE.value, num_pages=pages + 1, max_rows=rows,
                          decode_steps=_STEPS.value, prefill_chunk=_PAGE.value * max(1, 64 // _PAGE.value),
                          max_prompt_tokens=max(map(len, prompts)), admit_headroom=_HEADROOM.value)
    sample, stats = PagedEngine(graphdef, dataclasses.replace(sampling, kv_dtype=kv), config).generate(
        state, prompts, keys)
    mean = float(np.mean([len(p) for p in prompts]) + np.asarray(sample.mask_BxN).sum(axis=1).mean())
    predicted = concurrent_sequences(budget // per_token, prompt_tokens=max(map(len, prompts)),
                                     max_new_tokens=sampling.max_new_tokens, mean_tokens=mean, page_size=_PAGE.value)
    out.append({"kv_dtype": kv, "requests": len(prompts), "budget_bytes": budget, "bytes_per_token": per_token, "static_rows": int(static_rows),
                "paged_mean_rows": stats.get("mean_rows_saturated", 0.0), "paged_peak_rows": stats["peak_rows"],
                "saturated_rounds": stats.get("saturated_rounds", 0), "rounds": stats["rounds"],
                "paged_rows_predicted": predicted["paged"], "mean_sequence_tokens": mean, "paged_pages": pages,
                "admit_headroom": _HEADROOM.value, "preempted": stats.get("preempted", 0),
                "discarded_tokens": stats.get("discarded_tokens", 0)})
    print(f"capacity  {kv:<9} static {static_rows:4d} rows  paged {out[-1]['paged_mean_rows']:6.1f} rows held when "
          f"full (peak {stats['peak_rows']}, {out[-1]['preempted']} preempted; {pages} pages of {_PAGE.value})",
          flush=True)
  base = next((r for r in out if r["kv_dtype"] == "bf16"), out[0])
  for r in out:
    r["paged_rows_vs_bf16"] = r["paged_mean_rows"] / base["paged_mean_rows"] if base["paged_mean_rows"] else 0.0
    r["bytes_vs_bf16"] = base["bytes_per_token"] / r["bytes_per_token"]
  return out


def run():
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from opd_jax.models import load_pretrained
  from opd_jax.rollout.engine import EngineConfig
  from opd_jax.rollout.kv_cache import kv_bytes_per_token
  from opd_jax.rollout.sampler import SamplingConfig
  from opd_jax.errors import InputError
  from opd_jax.files import check_output_file
  if _OUT.value:
    check_output_file(_OUT.value, "--out")
  path = _inputs.checkpoint(_CHECKPOINT.value)[1]
  model = load_pretrained(path)
  graphdef, state = nnx.split(model)
  mc = model.config
  eos = tuple(mc.eos_token_id) if mc.eos_token_id else ()
  keys = jax.vmap(lambda q: jax.random.fold_in(jax.random.key(0), q))(jnp.arange(_REQUESTS.value))
  import sys
  result = {"checkpoint": path, "checkpoint_name": os.path.basename(os.path.normpath(path)),
            "backend": jax.default_backend(), "devices": jax.device_count(), "args": sys.argv[1:],
            "cpu_count": os.cpu_count()}
  token_bytes = kv_bytes_per_token(num_layers=mc.num_hidden_layers, num_kv_heads=mc.num_key_value_heads,
                                   head_dim=mc.head_dim, kv_dtype="native", native_bytes=4)  # float32 model
  chat = _inputs.chat_prompts(path, _REQUESTS.value) if {"longtail", "capacity"} & set(_WORKLOADS.value) else None
  engine_for = lambda prompts: EngineConfig(page_size=_PAGE.value, max_rows=_ROWS.value, decode_steps=_STEPS.value,
                                            prefill_chunk=_PAGE.value * max(1, 64 // _PAGE.value),
                                            max_prompt_tokens=max(map(len, prompts)))
  if "equal" in _WORKLOADS.value:
    prompts = np.random.RandomState(0).randint(3, mc.vocab_size, (_REQUESTS.value, _PROMPT.value)).tolist()
    sampling = SamplingConfig(max_new_tokens=_NEW.value, temperature=0.0, eos_ids=(), pad_id=0)
    result["equal"] = _compare("equal", graphdef, state, sampling, prompts, keys, engine_for(prompts), token_bytes)
  if "longtail" in _WORKLOADS.value:
    sampling = SamplingConfig(max_new_tokens=_NEW.value, temperature=_TEMPERATURE.value, eos_ids=eos, pad_id=0)
    result["longtail"] = _compare("longtail", graphdef, state, sampling, chat, keys, engine_for(chat), token_bytes,
                                  same_memory=True)
  if "capacity" in _WORKLOADS.value:
    if _CAPACITY_REQUESTS.value < 1:
      raise InputError(f"--capacity_requests={_CAPACITY_REQUESTS.value} must be >= 1")
    sampling = SamplingConfig(max_new_tokens=_NEW.value, temperature=_TEMPERATURE.value, eos_ids=eos, pad_id=0)
    many = [chat[q % len(chat)] for q in range(_CAPACITY_REQUESTS.value)]
    many_keys = jax.vmap(lambda q: jax.random.fold_in(jax.random.key(1), q))(jnp.arange(len(many)))
    result["capacity"] = _capacity(graphdef, state, sampling, many, many_keys, mc)
  if _OUT.value:
    from opd_jax.experiments.files import write_json
    write_json(_OUT.value, result)
    print(f"wrote {_OUT.value}")


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
