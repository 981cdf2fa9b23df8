"""Where a decode step's time goes on this machine: its weight matmuls alone against the whole step.

  python launch/bench/decode_profile.py --checkpoint=smollm2 [--batch=16] [--new_tokens=64]

Times, in one process and interleaved: the float32 sampler's decode (tokens/s -> seconds per step, one token per
row), every weight matmul of one decode step in isolation (the model's own shapes: per layer q/k/v/o and
gate/up/down with [batch, D] activations, then the LM head; XLA, float32, one jitted program) and the LM head
alone. What the matmuls do not explain is attention over the cache, norms, RoPE, sampling and the loop itself.
The matmuls are also put against this process's measured matmul ceiling and read bandwidth: at batch 16 a decode
matmul reads each weight once for 32 FLOPs per 4 bytes, so it is bound by memory, not by arithmetic.
"""

import os
import time

from absl import flags

from launch import _cli

import _machine  # launch/bench/_machine.py: this script's own directory is first on sys.path

_CHECKPOINT = flags.DEFINE_string("checkpoint", "smollm2", "An HF directory, or 'smollm2' (the prepared SmolLM2).")
_BATCH = flags.DEFINE_integer("batch", 16, "Rows decoded together.")
_NEW = flags.DEFINE_integer("new_tokens", 64, "Tokens per sampler call (EOS off).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed rounds (median).")


def _median(xs):
  xs = sorted(xs)
  return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def run():
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from opd_jax.errors import InputError
  from opd_jax.models import load_pretrained
  from opd_jax.rollout.config import RolloutConfig, build_sampler_state
  from opd_jax.rollout.sampler import Sampler

  path = _CHECKPOINT.value
  if path == "smollm2":
    root = os.environ.get("OPD_JAX_MODELS", os.path.join(os.path.expanduser("~"), ".cache", "opd_jax", "models"))
    path = os.path.join(root, "smollm2-135m-instruct")
  if not os.path.isfile(os.path.join(path, "config.json")):
    raise InputError(f"--checkpoint: {path} has no config.json (prepare SmolLM2 with launch/prepare_model.py)")
  B, N = _BATCH.value, _NEW.value
  model = load_pretrained(path)
  c = model.config
  graphdef, state = nnx.split(model)
  rollout = RolloutConfig(temperature=0.0, max_new_tokens=N)
  sampler = Sampler(graphdef, rollout.sampling(eos_ids=(), pad_id=0))
  sampler_state = build_sampler_state(state, rollout, np.int32(0))
  prompts = np.random.RandomState(0).randint(1, 500, (B, 16)).astype(np.int32)
  valid = np.ones_like(prompts, bool)

  D, F, L = c.hidden_size, c.intermediate_size, c.num_hidden_layers
  q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
  shapes = [(D, q), (D, kv), (D, kv), (q, D), (D, F), (D, F), (F, D)]
  rng = np.random.RandomState(1)
  weights = [[jnp.asarray(rng.randn(*s).astype(np.float32) * 0.02) for s in shapes] for _ in range(L)]
  head = jnp.asarray(rng.randn(D, c.vocab_size).astype(np.float32) * 0.02)

  @jax.jit
  def matmuls(x, weights, head):  # every weight matmul of one decode step; results summed so none is dropped
    total = jnp.zeros((), jnp.float32)
    for layer in weights:
      for w in layer:
        y = (x if w.shape[0] == D else jnp.ones((B, w.shape[0]), jnp.float32)) @ w
        total = total + y[0, 0]
    return total + (x @ head)[0, 0]

  head_only = jax.jit(lambda x, head: (x @ head)[0, 0])
  x = jnp.asarray(rng.randn(B, D).astype(np.float32))
  calls = {"sampler": lambda: jax.block_until_ready(sampler(sampler_state, prompts, valid, jax.random.key(0))),
           "matmuls": lambda: jax.block_until_ready(matmuls(x, weights, head)),
           "lm_head": lambda: jax.block_until_ready(head_only(x, head))}
  for fn in calls.values():
    fn()
  times = {k: [] for k in calls}
  for _ in range(_REPEATS.value):
    for k, fn in calls.items():
      start = time.perf_counter()
      fn()
      times[k].append(time.perf_counter() - start)
  gflops, gbs = _machine.machine_limits()
  step = _median(times["sampler"]) / N  # prefill included: an upper bound on one decode step
  mm, lm = _median(times["matmuls"]), _median(times["lm_head"])
  weight_bytes = 4 * (sum(a * b for a, b in shapes) * L + D * c.vocab_size)
  print(f"{path}: {L} layers, D={D}, F={F}, vocab {c.vocab_size}, batch {B}; measured here: matmul {gflops:.1f} "
        f"GFLOP/s, read {gbs:.1f} GB/s")
  print(f"  decode step (sampler call / {N} tokens)   {step * 1e3:8.1f} ms  100%")
  print(f"  its weight matmuls alone                {mm * 1e3:8.1f} ms  {mm / step:4.0%}   "
        f"({weight_bytes / 1e6:.0f} MB of weights: {weight_bytes / mm / 1e9:.1f} GB/s, "
        f"{2 * B * weight_bytes / 4 / mm / 1e9:.1f} GFLOP/s)")
  print(f"    of which the LM head                  {lm * 1e3:8.1f} ms  {lm / step:4.0%}")
  print(f"  everything else (attention, norms, RoPE, sampling, loop)  {(step - mm) * 1e3:.1f} ms  "
        f"{(step - mm) / step:.0%}")
  print(f"  weights read at the measured bandwidth would take {weight_bytes / gbs / 1e6:.1f} ms")


def main(argv):
  del argv
  _cli.log_devices()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
