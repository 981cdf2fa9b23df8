"""Compile time of a train-like step with the layer stack unrolled vs scanned, side by side.

  python launch/bench/compile.py [--layers=28] [--remat=none] [--attention=xla]

Lowers and compiles (persistent compilation cache off) a jitted value_and_grad of
loss = mean over tokens of logsumexp(logits) ("train"), and the loss alone ("forward", as in teacher
scoring), for a deep, narrow random Qwen3-style decoder (depth of Qwen3-1.7B, width tiny so compilation, not
compute, dominates), with scan_layers=False and True; prints lower / compile seconds (wall and process CPU),
one timed run each, and the unrolled / scanned ratio. About 1.5 minutes on 2 busy CPU cores.
"""

import os
import time

from absl import flags

from launch import _cli

_LAYERS = flags.DEFINE_integer("layers", 28, "Decoder layers (Qwen3-1.7B / -4B have 28 / 36).")
_HIDDEN = flags.DEFINE_integer("hidden", 64, "Model width D (4 query heads, 2 kv heads, head dim D / 4).")
_VOCAB = flags.DEFINE_integer("vocab", 512, "Vocabulary size V.")
_BATCH = flags.DEFINE_integer("batch", 2, "Sequences per step B.")
_SEQ = flags.DEFINE_integer("seq", 64, "Tokens per sequence T.")
_REMAT = flags.DEFINE_string("remat", "none", "Decoder remat option: none, full or dots_saveable.")
_ATTENTION = flags.DEFINE_string("attention", "xla", "Decoder attention option: reference, xla, cudnn, auto.")


def _timed(fn):
  """(result, wall seconds, process CPU seconds): CPU time is the steadier number on a shared machine."""
  wall, cpu = time.perf_counter(), time.process_time()
  result = fn()
  return result, time.perf_counter() - wall, time.process_time() - cpu


def run():
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from opd_jax.models import Decoder, ModelConfig

  D = _HIDDEN.value
  tokens_BxT = jnp.asarray(np.random.RandomState(0).randint(0, _VOCAB.value, (_BATCH.value, _SEQ.value)))

  def make_fn(kind, num_layers, scan_layers):
    """kind "train": jitted value_and_grad of loss = mean_t logsumexp(logits_t); "forward": the loss alone."""
    config = ModelConfig(model_type="qwen3", vocab_size=_VOCAB.value, hidden_size=D, intermediate_size=2 * D,
                         num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, head_dim=D // 4,
                         tie_word_embeddings=True, eos_token_id=(), pad_token_id=0)
    model = Decoder(config, rngs=nnx.Rngs(0), attention=_ATTENTION.value, remat=_REMAT.value,
                    scan_layers=scan_layers)
    graphdef, params = nnx.split(model)

    def loss_fn(params):
      logits_BxTxV = nnx.merge(graphdef, params)(tokens_BxT)
      return jnp.mean(jax.nn.logsumexp(logits_BxTxV, axis=-1))

    return jax.jit(jax.value_and_grad(loss_fn) if kind == "train" else loss_fn), params

  for scan_layers in (False, True):  # warm-up: one-time tracing and LLVM setup stay out of the numbers
    fn, params = make_fn("train", 2, scan_layers)
    fn.lower(params).compile()
  print(f"{_LAYERS.value} layers, D={D}, V={_VOCAB.value}, B x T = {_BATCH.value} x {_SEQ.value}, "
        f"remat={_REMAT.value}, attention={_ATTENTION.value}; wall seconds (process CPU seconds)")
  print(f"{'step':<8} {'scan_layers':<12} {'lower':>14} {'compile':>14} {'lower+compile':>16} {'run':>8}")
  cell = lambda wall, cpu: f"{wall:.2f} ({cpu:.2f})"
  for kind in ("train", "forward"):
    totals = {}
    for scan_layers in (False, True):
      fn, params = make_fn(kind, _LAYERS.value, scan_layers)
      lowered, lower_wall, lower_cpu = _timed(lambda: fn.lower(params))
      compiled, compile_wall, compile_cpu = _timed(lowered.compile)
      jax.block_until_ready(compiled(params))
      _, run_wall, _ = _timed(lambda: jax.block_until_ready(compiled(params)))
      totals[scan_layers] = (lower_wall + compile_wall, lower_cpu + compile_cpu)
      print(f"{kind:<8} {str(scan_layers):<12} {cell(lower_wall, lower_cpu):>14} "
            f"{cell(compile_wall, compile_cpu):>14} {cell(*totals[scan_layers]):>16} {run_wall:>8.4f}")
    (unrolled_wall, unrolled_cpu), (scanned_wall, scanned_cpu) = totals[False], totals[True]
    print(f"{kind:<8} unrolled / scanned lower+compile: {unrolled_wall / scanned_wall:.2f}x wall, "
          f"{unrolled_cpu / scanned_cpu:.2f}x CPU")


def main(argv):
  del argv
  os.environ[_cli.CACHE_ENV] = "off"  # a cache hit would time a disk read, not a compilation
  _cli.log_devices()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
