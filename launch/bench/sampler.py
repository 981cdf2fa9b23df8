"""Sampler throughput vs transformers' generate (PyTorch, CPU), side by side.

  python launch/bench/sampler.py [--configs=tiny,191M] [--batch=16] [--new_tokens=128] [--repeats=3]

Decode tokens/s (batch * new tokens / seconds of one generate call, prefill included, compile excluded) for
both engines on the same random checkpoint, then this sampler per weight recipe and KV-cache dtype. Engines
run interleaved, one call each per round for --repeats rounds, so a drift in machine speed (shared hosts
vary by 30%) hits all of them alike; best and median over the rounds are printed. Goal: >= 3x transformers
on tiny, >= 1.2x on 191M.
"""

import functools
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from absl import flags  # noqa: E402

from launch import _cli  # noqa: E402

_CONFIGS = flags.DEFINE_list("configs", ["tiny", "191M"], "Benchmark model configs.")
_BATCH = flags.DEFINE_integer("batch", 16, "Sequences per batch.")
_NEW = flags.DEFINE_integer("new_tokens", 128, "Tokens generated per sequence (EOS disabled).")
_PROMPT = flags.DEFINE_integer("prompt_tokens", 16, "Prompt length.")
_REPEATS = flags.DEFINE_integer("repeats", 7, "Timed rounds (every engine runs once per round).")
_VARIANTS = flags.DEFINE_list("variants", ["none/native", "bf16/native", "int8/native", "fp8/native",
                                           "none/int8", "none/fp8", "fp8/fp8"], "weights/kv_cache pairs.")
_DIR = flags.DEFINE_string("dir", None, "Where benchmark checkpoints are written (default: a temp dir).")


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


def run():
  import jax
  import numpy as np
  import torch
  import transformers
  from flax import nnx

  from opd_jax.bench.models import bench_checkpoint
  from opd_jax.models import load_pretrained
  from opd_jax.rollout.config import RolloutConfig, build_sampler_state
  from opd_jax.rollout.sampler import Sampler

  root = _DIR.value or tempfile.mkdtemp(prefix="opd_bench_")
  batch, new, plen = _BATCH.value, _NEW.value, _PROMPT.value
  tokens = batch * new
  torch.set_num_threads(os.cpu_count())
  print(f"decode throughput, batch {batch}, prompt {plen}, {new} new tokens, {jax.device_count()} x "
        f"{jax.devices()[0].platform}, torch {torch.__version__} ({torch.get_num_threads()} threads)")
  for name in _CONFIGS.value:
    path = bench_checkpoint(name, root)
    prompts = np.random.RandomState(0).randint(1, 500, (batch, plen)).astype(np.int32)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    hf_input = torch.tensor(prompts, dtype=torch.long)

    def hf_generate():
      with torch.no_grad():
        hf.generate(hf_input, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)

    engines = {"transformers generate fp32": hf_generate}
    model = load_pretrained(path)
    graphdef, state = nnx.split(model)
    valid = np.ones_like(prompts, bool)
    for variant in _VARIANTS.value:
      weights, kv = variant.split("/")
      rollout = RolloutConfig(weights=weights, kv_cache=kv, temperature=0.0, max_new_tokens=new)
      sampler = Sampler(graphdef, rollout.sampling(eos_ids=(), pad_id=0))
      sampler_state = build_sampler_state(state, rollout, np.int32(0))
      engines[f"opd_jax w={weights} kv={kv}"] = functools.partial(
          lambda s, st: jax.block_until_ready(s(st, prompts, valid, jax.random.key(0))), sampler, sampler_state)
    times = _interleaved(engines, _REPEATS.value)
    hf_best, hf_median = times["transformers generate fp32"][0], _median(times["transformers generate fp32"])
    print(f"\n[{name}] {model.config.num_params() / 1e6:.1f}M params, {_REPEATS.value} interleaved rounds")
    print(f"  {'engine':<28} {'best tok/s':>10} {'vs transformers':>16} {'median tok/s':>13} {'vs transformers':>16}")
    for engine, t in times.items():
      print(f"  {engine:<28} {tokens / t[0]:>10.0f} {hf_best / t[0]:>15.2f}x {tokens / _median(t):>13.0f} "
            f"{hf_median / _median(t):>15.2f}x")
    del hf, engines


def _median(sorted_times):
  n = len(sorted_times)
  return (sorted_times[(n - 1) // 2] + sorted_times[n // 2]) / 2


def main(argv):
  del argv
  _cli.log_devices()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
