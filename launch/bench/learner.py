"""Cost of the in-step mismatch metrics relative to the train step, side by side.

  python launch/bench/learner.py [--configs=embedded,191M] [--repeats=7]

Times the jitted OPD train step with and without the mismatch metric families (token + vocabulary level,
compile excluded, median of --repeats) on the embedded pair1 student and on the ~191M config. Goal: <= 3%.
"""

import functools
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from absl import flags  # noqa: E402

from launch import _cli  # noqa: E402

_CONFIGS = flags.DEFINE_list("configs", ["embedded", "191M"], "embedded (pair1 student) and/or 191M.")
_REPEATS = flags.DEFINE_integer("repeats", 7, "Timed steps per variant (median reported).")
_DIR = flags.DEFINE_string("dir", None, "Where benchmark checkpoints are written (default: a temp dir).")


def run():
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from opd_jax.bench.models import bench_checkpoint
  from opd_jax.models import load_pretrained
  from opd_jax.objectives.losses import ObjectiveConfig
  from opd_jax.train.optimizer import make_optimizer, make_schedule
  from opd_jax.train.pairs import ASSETS
  from opd_jax.train.step import RolloutBatch, TrainState, train_step

  root = _DIR.value or tempfile.mkdtemp(prefix="opd_bench_")
  shapes = {"embedded": (64, 20, 64), "191M": (8, 32, 128)}  # batch, prompt, response
  print(f"{'config':<10} {'batch x tokens':>15} {'step s (no metrics)':>20} {'step s (metrics)':>17} "
        f"{'metric cost':>12}")
  for name in _CONFIGS.value:
    path = os.path.join(ASSETS, "pair1", "student") if name == "embedded" else bench_checkpoint("191M", root)
    model = load_pretrained(path)
    graphdef, params = nnx.split(model)
    vocab = model.config.vocab_size
    B, P, R = shapes[name]
    rng = np.random.RandomState(0)
    logits = jnp.asarray(rng.randn(B, R, vocab).astype(np.float32))
    top_k = min(vocab, 64)
    top_logp, top_ids = jax.lax.top_k(jax.nn.log_softmax(logits), top_k)
    batch = RolloutBatch(jnp.asarray(rng.randint(2, vocab, (B, P)), jnp.int32), jnp.ones((B, P), bool),
                         jnp.asarray(rng.randint(2, vocab, (B, R)), jnp.int32), jnp.ones((B, R), jnp.float32),
                         jnp.asarray(-rng.rand(B, R).astype(np.float32)), jnp.asarray(-rng.rand(B, R).astype(np.float32)),
                         sampler_top_logprobs_BxRxK=top_logp, sampler_top_ids_BxRxK=top_ids)
    optimizer = make_optimizer(make_schedule(learning_rate=1e-4, warmup_steps=0, total_steps=100), weight_decay=0.0,
                               grad_clip_norm=1.0)
    times = {}
    for with_metrics in (False, True):
      fn = jax.jit(functools.partial(train_step, graphdef, optimizer, ObjectiveConfig(), 1.0, 2.0,
                                     mismatch_metrics=with_metrics))
      state = TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))
      jax.block_until_ready(fn(state, batch))
      samples = []
      for _ in range(_REPEATS.value):
        start = time.perf_counter()
        jax.block_until_ready(fn(state, batch))
        samples.append(time.perf_counter() - start)
      times[with_metrics] = float(np.median(samples))
    cost = times[True] / times[False] - 1
    print(f"{name:<10} {f'{B} x {P + R}':>15} {times[False]:>20.4f} {times[True]:>17.4f} {cost:>11.1%}")


def main(argv):
  del argv
  _cli.log_devices()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
