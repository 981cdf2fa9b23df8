"""Sampler throughput vs transformers' generate (PyTorch, CPU), side by side.

  python launch/bench_sampler.py [--configs=tiny,191M] [--batch=16] [--new_tokens=128] [--repeats=3]

Decode tokens/s (batch * new tokens / seconds, compile excluded, best of --repeats) for both engines on the
same random checkpoint, then this sampler per weight recipe and KV-cache dtype. Goal: >= 3x transformers on
tiny, >= 1.2x on 191M.
"""

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from launch import _cli  # noqa: E402

_CONFIGS = flags.DEFINE_list("configs", ["tiny", "191M"], "Benchmark model configs.")
_BATCH = flags.DEFINE_integer("batch", 16, "Sequences per batch.")
_NEW = flags.DEFINE_integer("new_tokens", 128, "Tokens generated per sequence (EOS disabled).")
_PROMPT = flags.DEFINE_integer("prompt_tokens", 16, "Prompt length.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats (best is reported).")
_VARIANTS = flags.DEFINE_list("variants", ["none/native", "bf16/native", "int8/native", "fp8/native",
                                           "none/int8", "none/fp8", "fp8/fp8"], "weights/kv_cache pairs.")
_DIR = flags.DEFINE_string("dir", None, "Where benchmark checkpoints are written (default: a temp dir).")


def _best(fn, repeats):
  fn()  # warm-up: compilation / first-call allocation
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return min(times)


def run():
  import jax
  import numpy as np
  import torch
  import transformers
  from flax import nnx

  from opd_jax.analysis.bench_models import bench_checkpoint
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
    with torch.no_grad():
      hf_input = torch.tensor(prompts, dtype=torch.long)
      hf_s = _best(lambda: hf.generate(hf_input, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                       pad_token_id=0), _REPEATS.value)
    del hf
    model = load_pretrained(path)
    graphdef, state = nnx.split(model)
    print(f"\n[{name}] {model.config.num_params() / 1e6:.1f}M params")
    print(f"  {'engine':<28} {'tokens/s':>10} {'vs transformers':>16}")
    print(f"  {'transformers generate fp32':<28} {tokens / hf_s:>10.0f} {1.0:>15.2f}x")
    valid = np.ones_like(prompts, bool)
    for variant in _VARIANTS.value:
      weights, kv = variant.split("/")
      rollout = RolloutConfig(weights=weights, kv_cache=kv, temperature=0.0, max_new_tokens=new)
      sampler = Sampler(graphdef, rollout.sampling(eos_ids=(), pad_id=0))
      sampler_state = build_sampler_state(state, rollout, np.int32(0))
      run_once = lambda: jax.block_until_ready(sampler(sampler_state, prompts, valid, jax.random.key(0)))
      s = _best(run_once, _REPEATS.value)
      print(f"  {'opd_jax w=' + weights + ' kv=' + kv:<28} {tokens / s:>10.0f} {hf_s / s:>15.2f}x")


def main(argv):
  del argv
  _cli.log_devices()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  app.run(main)
