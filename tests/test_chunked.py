"""Chunked vocabulary work and micro-batching: the same numbers as the whole-tensor, whole-batch path.

The whole-tensor path (logits_chunk=0, micro_batch_size=0) is the reference: it is what the learner computed
before chunking existed, and test_train pins its numbers.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from opd_jax.models import sharding as shard_lib
from opd_jax.objectives import chunked
from opd_jax.objectives.logprobs import response_logits, score, token_logprobs
from opd_jax.objectives.losses import OBJECTIVES, WEIGHTED_OBJECTIVES, ObjectiveConfig
from opd_jax.train.evaluation import make_kl_fn
from tests.test_train import _batch, _step, _teacher


def test_token_map_pads_and_matches_whole_sequence():
  rng = np.random.RandomState(0)
  x = {"a": jnp.asarray(rng.randn(2, 7, 3), jnp.float32), "b": jnp.asarray(rng.randint(0, 3, (2, 7)))}
  fn = lambda c: {"y": jnp.sum(c["a"] ** 2, -1) + c["b"], "z": c["a"] * 2}
  whole = fn(x)
  for chunk in (2, 6, 8, 14, 0, 100):  # tokens per chunk over 2 rows: 1, 3, 4, 7 positions, whole, whole
    out = chunked.token_map(fn, x, chunk)
    for key in whole:
      np.testing.assert_allclose(np.asarray(out[key]), np.asarray(whole[key]), rtol=1e-6, atol=1e-6)


# One objective per code path: sampled-token (reverse_kl_pg, grpo), teacher hidden states + exact vocabulary
# (reverse_kl; forward_kl and jsd share it), teacher top-k (forward_kl_topk; jsd_topk / reverse_kl_topk share it).
# The per-token losses of all of them are checked against float64 numpy in tests/test_objectives.py.
CHUNKED_PATHS = ("reverse_kl_pg", "grpo", "reverse_kl", "forward_kl_topk")
assert set(CHUNKED_PATHS) <= set(OBJECTIVES)


@pytest.mark.slow  # the fast tier keeps token_map's equivalence and the chunked memory / fsdp sharding checks
@pytest.mark.parametrize("name", CHUNKED_PATHS)
def test_chunked_micro_batched_step_equals_whole(tiny_pair, name):
  """Every objective: loss, gradient (via the SGD update), and every metric, in 2 micro-batches of 4 rows and
  chunks of 12 tokens (3 positions: the 10-token response is padded), to 1e-6 in float32. The sampled-token
  objectives carry per-sequence importance weights from e^-1 to e, so their weight sums and ESS must add up
  over micro-batches too (a wider spread scales the gradient, and its float32 rounding, by the largest weight)."""
  graphdef, params, batch = _batch(tiny_pair)
  if name == "grpo":
    batch.reward_B = jnp.asarray([1, 0, 0, 1, 1, 1, 0, 1], jnp.float32)
  sampled = name in WEIGHTED_OBJECTIVES
  if sampled:
    _shift_sampler_logp(batch, nats=1.0)
  objective = ObjectiveConfig(name=name, group_size=4, top_k=5, importance="seq_tis" if sampled else "none",
                              is_cap=100.0)
  mesh = shard_lib.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  teacher, sgd = _teacher(tiny_pair), optax.sgd(1.0)
  whole_state, whole = _step(graphdef, params, batch, mesh, objective, sgd, teacher)
  chunk_state, chunk = _step(graphdef, params, batch, mesh, objective, sgd, teacher, logits_chunk=12,
                             micro_batch_size=4)
  assert set(whole) == set(chunk) and (not sampled or float(whole["opd/is_ess"]) < 0.95)
  for key in whole:
    np.testing.assert_allclose(float(chunk[key]), float(whole[key]), rtol=1e-6, atol=1e-6, err_msg=key)
  for a, b in zip(jax.tree.leaves(chunk_state.params), jax.tree.leaves(whole_state.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def _shift_sampler_logp(batch, nats: float = 3.0):
  """Sampler log-probs shifted per row by -nats..nats over the response, so per-sequence importance weights span
  e^(2 nats) (the learner's log-probs equal the sampler's before the shift: same model, float32)."""
  shift_B = jnp.linspace(-nats, nats, batch.mask_BxR.shape[0])
  batch.sampler_logp_BxR = batch.sampler_logp_BxR + shift_B[:, None] / jnp.maximum(batch.mask_BxR.sum(1), 1)[:, None]
  return shift_B


@pytest.mark.slow
def test_min_ess_skips_an_update_whose_sequence_weights_collapse(tiny_pair):
  """seq_tis weights spanning orders of magnitude: the logged ESS share is the numpy (sum w)^2 / (N sum w^2) over
  tokens, an update under min_ess is skipped (parameters unchanged) and one above it is applied. (That the ESS
  adds up over micro-batches is checked by test_chunked_micro_batched_step_equals_whole.)"""
  graphdef, params, batch = _batch(tiny_pair)
  shift_B = _shift_sampler_logp(batch)
  mask = np.asarray(batch.mask_BxR, np.float64)
  w = np.minimum(np.exp(-np.asarray(shift_B, np.float64)), 100.0)[:, None] * mask  # log rho = -shift per row
  ess = w.sum() ** 2 / (mask.sum() * (w ** 2).sum())
  assert 0.05 < ess < 0.5
  mesh = shard_lib.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  for min_ess, skipped in ((ess * 1.1, 1.0), (ess * 0.9, 0.0)):
    state, metrics = _step(graphdef, params, batch, mesh,
                           ObjectiveConfig(importance="seq_tis", is_cap=100.0, min_ess=min_ess), optax.sgd(1.0))
    np.testing.assert_allclose(float(metrics["opd/is_ess"]), ess, rtol=2e-3)
    assert float(metrics["skipped_low_ess"]) == skipped and int(state.step) == 1 - skipped
    assert float(metrics["skipped"]) == 0.0  # "skipped" counts non-finite updates only
    moved = any(not np.array_equal(np.asarray(a), np.asarray(b))
                for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)))
    assert moved == (skipped == 0.0)


def test_min_ess_needs_importance_weights():
  with pytest.raises(ValueError, match="min_ess=0.1 guards importance weights"):
    ObjectiveConfig(name="reverse_kl", min_ess=0.1)
  with pytest.raises(ValueError, match=r"min_ess must be in \[0, 1\)"):
    ObjectiveConfig(importance="tis", min_ess=1.0)


@pytest.mark.slow
def test_one_row_micro_batches_equal_full_batch(tiny_pair):
  """The extreme split, 8 micro-batches of one row (one of them with few tokens), feeds one update equal to the
  full-batch one. (Plain SGD, so parameters differ exactly by the gradient differences: Adam's first step,
  g / (|g| + eps), would amplify float32 rounding of near-zero gradient entries.)"""
  graphdef, params, batch = _batch(tiny_pair)
  mesh = shard_lib.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  full_state, full = _step(graphdef, params, batch, mesh, optimizer=optax.sgd(1.0))
  micro_state, micro = _step(graphdef, params, batch, mesh, optimizer=optax.sgd(1.0), micro_batch_size=1)
  np.testing.assert_allclose(float(micro["grad_norm"]), float(full["grad_norm"]), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(micro_state.params), jax.tree.leaves(full_state.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_micro_batch_must_divide_batch(tiny_pair):
  graphdef, params, batch = _batch(tiny_pair)
  with pytest.raises(ValueError, match="micro_batch_size=3 does not divide"):
    _step(graphdef, params, batch, shard_lib.make_mesh(1, 1, 1, devices=jax.devices()[:1]), micro_batch_size=3)


def test_chunked_scoring_equals_whole_logits(tiny_pair):
  graphdef, params, batch = _batch(tiny_pair)
  t_graphdef, t_state = _teacher(tiny_pair)
  args = (batch.prompt_BxP, batch.prompt_valid_BxP, batch.response_BxR, batch.mask_BxR)
  logits = response_logits(nnx.merge(t_graphdef, t_state), *args)
  want_logp = token_logprobs(logits, batch.response_BxR, 0.7) * batch.mask_BxR
  want_top, want_ids = jax.lax.top_k(jax.nn.log_softmax(logits / 1.3, -1), 4)
  got = score(t_graphdef, t_state, *args, temperature=0.7, logits_chunk=24, top_k=4, top_k_temperature=1.3)
  np.testing.assert_allclose(np.asarray(got.logp_BxR), np.asarray(want_logp), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(got.top_logp_BxRxK), np.asarray(want_top), rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(got.top_ids_BxRxK), np.asarray(want_ids))
  assert got.hidden_BxRxD is None


@pytest.mark.slow
def test_chunked_evaluation_kl_equals_whole(tiny_pair):
  graphdef, params, batch = _batch(tiny_pair)
  t_graphdef, t_state = _teacher(tiny_pair)
  args = (params, t_state, batch.prompt_BxP, batch.prompt_valid_BxP, batch.response_BxR, batch.mask_BxR)
  whole = make_kl_fn(graphdef, t_graphdef, 0)(*args)
  chunk = make_kl_fn(graphdef, t_graphdef, 32)(*args)
  np.testing.assert_allclose(np.asarray(chunk), np.asarray(whole), rtol=1e-6)
  # And both equal the KL computed from whole logits by hand, in either direction.
  s = jax.nn.log_softmax(response_logits(nnx.merge(graphdef, params), *args[2:]), -1)
  t = jax.nn.log_softmax(response_logits(nnx.merge(t_graphdef, t_state), *args[2:]), -1)
  by_hand = jnp.sum(jnp.sum(jnp.exp(s) * (s - t), -1) * batch.mask_BxR)
  np.testing.assert_allclose(float(whole[0]), float(by_hand), rtol=1e-5)
  forward = make_kl_fn(graphdef, t_graphdef, 32, "forward")(*args)
  by_hand = jnp.sum(jnp.sum(jnp.exp(t) * (t - s), -1) * batch.mask_BxR)
  np.testing.assert_allclose(float(forward[0]), float(by_hand), rtol=1e-5)


def test_chunked_backward_holds_no_whole_logits():
  """Compiled memory of a value_and_grad over chunked log-probs grows with the chunk, not the sequence: at
  R = 512 tokens and V = 8192 the whole-tensor path's temporaries hold [B, R, V] float32 several times over,
  the chunked path in proportion to the chunk (XLA:CPU: whole 168 MB; chunks of 512 / 256 / 128 / 64 tokens,
  i.e. 256 / 128 / 64 / 32 positions of the 2 rows: 67 / 34 / 17 / 8.7 MB)."""
  from opd_jax.models import Decoder, ModelConfig
  config = ModelConfig(model_type="qwen3", vocab_size=8192, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
  graphdef, params = nnx.split(nnx.eval_shape(lambda: Decoder(config)))
  B, R = 2, 512
  hidden = jax.ShapeDtypeStruct((B, R, 32), jnp.float32)
  tokens = jax.ShapeDtypeStruct((B, R), jnp.int32)

  def temp_bytes(chunk):
    def loss(p, h, t):
      model = nnx.merge(graphdef, p)
      return jnp.sum(chunked.score_tokens(model, h, t, temperature=1.0, chunk=chunk)["logp"])
    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(params, hidden, tokens).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  whole_logits = B * R * 8192 * 4  # 33.5 MB
  whole, chunk = temp_bytes(0), temp_bytes(128)
  assert whole >= 2 * whole_logits, whole
  assert chunk < whole / 4, (chunk, whole)  # R / C = 8 times fewer logits live at once


@pytest.mark.slow
def test_micro_batched_scoring_and_evaluation_kl_equal_whole_batch(tiny_pair):
  """Teacher scoring (log-probs, hidden states) and the evaluation KL, 2 rows at a time as a run with
  train.micro_batch_size=2 computes them, equal the whole batch: log-probs and KL to 1e-6, hidden states to
  1e-5 (the matmuls see 2 rows instead of 8, so XLA blocks them differently)."""
  from opd_jax.train import programs
  graphdef, params, batch = _batch(tiny_pair)
  t_graphdef, t_state = _teacher(tiny_pair)
  tokens = (batch.prompt_BxP, batch.prompt_valid_BxP, batch.response_BxR, batch.mask_BxR)
  objective = ObjectiveConfig(name="reverse_kl")  # the teacher hands over log-probs and hidden states
  whole = programs.teacher_score_program(t_graphdef, objective, 0.7, 12)(t_state, *tokens)
  micro = programs.teacher_score_program(t_graphdef, objective, 0.7, 12, micro_batch_size=2)(t_state, *tokens)
  np.testing.assert_allclose(np.asarray(micro.logp_BxR), np.asarray(whole.logp_BxR), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(micro.hidden_BxRxD), np.asarray(whole.hidden_BxRxD), rtol=1e-5, atol=1e-5)
  whole = make_kl_fn(graphdef, t_graphdef, 12)(params, t_state, *tokens)
  micro = make_kl_fn(graphdef, t_graphdef, 12, micro_batch_size=2)(params, t_state, *tokens)
  np.testing.assert_allclose(np.asarray(micro), np.asarray(whole), rtol=1e-6)


def test_fsdp_lm_head_keeps_logit_chunks_batch_sharded():
  """On 8 devices with fsdp 8, teacher scoring's logit chunks stay batch-sharded: each device holds its own rows'
  chunk [B/8, C, V], not the whole batch's [B, C, V] (the LM head's kernel is sharded over the hidden width on the
  devices that hold the batch; unconstrained, XLA gathers the batch instead of the kernel). The compiled
  program's buffers, with and without the learner's mesh given to the builder."""
  from opd_jax.models import Decoder, ModelConfig
  from opd_jax.train import programs
  config = ModelConfig(model_type="qwen3", vocab_size=8192, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                       tie_word_embeddings=False)
  graphdef, params = nnx.split(nnx.eval_shape(lambda: Decoder(config)))
  mesh = shard_lib.make_mesh(1, 8, 1, devices=jax.devices()[:8])
  params = programs.abstract_with(params, shard_lib.state_shardings(params, mesh))
  B, P, R = 16, 8, 64
  rows = shard_lib.batch_sharding(mesh)
  tokens = (jax.ShapeDtypeStruct((B, P), jnp.int32, sharding=rows), jax.ShapeDtypeStruct((B, P), bool, sharding=rows),
            jax.ShapeDtypeStruct((B, R), jnp.int32, sharding=rows), jax.ShapeDtypeStruct((B, R), bool, sharding=rows))
  objective = ObjectiveConfig(name="reverse_kl_pg")

  def compiled(on_mesh):
    program = programs.teacher_score_program(graphdef, objective, 1.0, 16 * 8, mesh=mesh if on_mesh else None)
    return program.lower(params, *tokens).compile()

  constrained, free = compiled(True), compiled(False)
  whole_chunk = "f32[16,8,8192]"  # the whole batch's chunk of 8 positions (16 * 8 * 8192 * 4 B = 4 MiB)
  assert whole_chunk in free.as_text()  # what XLA does unconstrained: the failure this test guards against
  assert whole_chunk not in constrained.as_text() and "f32[2,8,8192]" in constrained.as_text()
  used = lambda c: c.memory_analysis().temp_size_in_bytes
  assert used(constrained) < 0.6 * used(free), (used(constrained), used(free))  # 4.5 vs 8.4 MB here
