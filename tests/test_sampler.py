"""Sampler: greedy parity with transformers' generate, log-prob parity with the learner, filtering, sharding."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from opd_jax.models import load_pretrained
from opd_jax.objectives.logprobs import response_logits, token_logprobs
from opd_jax.rollout import placement
from opd_jax.rollout.config import RolloutConfig
from opd_jax.rollout.kv_cache import KVCache
from opd_jax.rollout.sampler import Sampler, SamplingConfig, choose_tokens, left_pad
from opd_jax.rollout.weight_sync import WeightSync
from tests import checkpoints

EOS, PAD = 2, 0
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]


def _sample(path, config, key=0, prompts=PROMPTS):
  model = load_pretrained(path)
  graphdef, state = nnx.split(model)
  tokens, valid = left_pad(prompts, PAD)
  return model, tokens, valid, Sampler(graphdef, config)(state, tokens, valid, jax.random.key(key))


@pytest.mark.parametrize("family", checkpoints.FAMILIES)
def test_greedy_matches_transformers_generate(tiny_checkpoints, family):
  path = tiny_checkpoints[family]
  # decode_chunk=5: four decode loops over a growing cache, so the chunk hand-offs are checked against HF too
  config = SamplingConfig(max_new_tokens=16, temperature=0.0, eos_ids=(EOS,), pad_id=PAD, decode_chunk=5)
  _, _, _, out = _sample(path, config)
  torch_model = checkpoints.load_torch(path)
  for row, prompt in enumerate(PROMPTS):
    with torch.no_grad():
      ref = torch_model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=EOS,
                                 pad_token_id=PAD)[0, len(prompt):].tolist()
    n = int(out.mask_BxN[row].sum())
    assert np.asarray(out.tokens_BxN[row, :n]).tolist() == ref


@pytest.mark.parametrize("family,temperature", [pytest.param(family, 1.0, marks=() if family == "llama" else
                                                             pytest.mark.slow) for family in checkpoints.FAMILIES]
                         + [pytest.param("qwen3", 0.7, marks=pytest.mark.slow)])  # every family once; temperature
                                                                                    # scaling once (fast tier: llama)
def test_sampler_logprobs_equal_learner_recomputation(tiny_checkpoints, family, temperature):
  config = SamplingConfig(max_new_tokens=12, temperature=temperature, eos_ids=(EOS,), pad_id=PAD,
                          decode_chunk=4)
  model, tokens, valid, out = _sample(tiny_checkpoints[family], config, key=3)
  logits = response_logits(model, tokens, valid, out.tokens_BxN, out.mask_BxN)
  learner = token_logprobs(logits, out.tokens_BxN, temperature)
  assert np.abs(np.asarray((learner - out.logprobs_BxN) * out.mask_BxN)).max() <= 1e-4
  assert float(out.mask_BxN.sum()) > 0


def test_sampling_is_deterministic_per_key(tiny_checkpoints):
  config = SamplingConfig(max_new_tokens=10, temperature=1.0, eos_ids=(EOS,), pad_id=PAD)
  a = _sample(tiny_checkpoints["qwen3"], config, key=1)[3]
  b = _sample(tiny_checkpoints["qwen3"], config, key=1)[3]
  c = _sample(tiny_checkpoints["qwen3"], config, key=2)[3]
  np.testing.assert_array_equal(a.tokens_BxN, b.tokens_BxN)
  assert not np.array_equal(a.tokens_BxN, c.tokens_BxN)


def test_eos_ends_rows_and_masks_the_rest():
  config = SamplingConfig(max_new_tokens=6, temperature=0.0, eos_ids=(EOS,), pad_id=PAD)
  logits = jnp.zeros((2, 8)).at[0, EOS].set(5.0).at[1, 4].set(5.0)
  token, logp = choose_tokens(logits, jax.random.key(0), config)
  assert token.tolist() == [EOS, 4]
  np.testing.assert_allclose(logp, jax.nn.log_softmax(logits)[jnp.arange(2), token], rtol=1e-6)


def test_top_k_top_p_logprobs_are_renormalized():
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
  keys = jax.random.split(jax.random.key(0), 400)
  for config, allowed, probs in [
      (SamplingConfig(max_new_tokens=1, top_k=2), {0, 1}, [0.5 / 0.8, 0.3 / 0.8]),
      (SamplingConfig(max_new_tokens=1, top_p=0.7), {0, 1}, [0.5 / 0.8, 0.3 / 0.8]),
      (SamplingConfig(max_new_tokens=1, top_p=0.9), {0, 1, 2}, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95]),
  ]:
    tokens, logps = jax.vmap(lambda k: choose_tokens(logits, k, config))(keys)
    assert set(np.asarray(tokens).ravel().tolist()) == allowed
    for t, p in enumerate(probs):
      np.testing.assert_allclose(np.exp(np.asarray(logps)[np.asarray(tokens) == t]), p, rtol=1e-5)


@pytest.mark.slow
def test_sampler_on_its_own_mesh_matches_one_device(tiny_checkpoints):
  """Explicit shardings on a (data x tensor) inference mesh: outputs over rows, the weights and the KV cache's
  2 heads split over tensor=2, the same tokens as one device. (Native KV: with a quantized cache the sharded
  reductions' other summation order can flip a value on a rounding edge, ~5e-4 in the log-probs; quantized
  caches on a mesh run in the 4 + 4 loop test.)"""
  tensor_parallel, kv_dtype = 2, "native"
  assert jax.device_count() == 8
  model = load_pretrained(tiny_checkpoints["qwen3"])
  graphdef, state = nnx.split(model)
  prompts = [[5 + i, 6, 7 + (i % 3)] for i in range(16)]
  tokens, valid = left_pad(prompts, PAD)
  config = SamplingConfig(max_new_tokens=8, temperature=1.0, eos_ids=(EOS,), pad_id=PAD, decode_chunk=3,
                          kv_dtype=kv_dtype)
  mesh = placement.sampler_mesh(jax.devices(), tensor_parallel)
  sync = WeightSync(RolloutConfig(), state, mesh, jnp.float32)
  sampler = Sampler(graphdef, config, mesh=mesh, state_shardings=sync.shardings)
  sampler_state = sync(state, 0)
  q_spec = sampler_state["layers"]["self_attn"]["q_proj"]["kernel"].get_value().sharding.spec
  assert tuple(q_spec) == (None, None, "tensor")  # [L, D, heads]: the layer axis whole
  put = lambda x: jax.device_put(x, sampler.batch_sharding)
  sharded = sampler(sampler_state, put(tokens), put(valid), jax.random.key(5))
  assert sharded.tokens_BxN.sharding.spec[0] == ("data", "fsdp")
  single = Sampler(graphdef, config)(state, tokens, valid, jax.random.key(5))
  np.testing.assert_array_equal(sharded.tokens_BxN, single.tokens_BxN)
  np.testing.assert_allclose(sharded.logprobs_BxN, single.logprobs_BxN, atol=1e-5)


def _prefill_rows(sampler, *args) -> set[int]:
  """Row counts of the [rows, P, ...] activations the compiled program's prefill computes (from its jaxpr). The
  attention's projections give them; the MLP's matmuls run on flattened [rows * P, D] tokens and are not counted."""
  P = args[1].shape[1]
  rows = set()

  def visit(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "dot_general":
        shape = eqn.outvars[0].aval.shape
        if len(shape) == 3 and shape[1] == P:
          rows.add(shape[0])
      for sub in jax.core.subjaxprs(eqn) if hasattr(jax.core, "subjaxprs") else ():
        visit(sub)
      for param in eqn.params.values():
        for inner in param if isinstance(param, (tuple, list)) else (param,):
          if hasattr(inner, "jaxpr"):
            visit(getattr(inner.jaxpr, "jaxpr", inner.jaxpr))

  visit(jax.make_jaxpr(sampler._fn)(*args).jaxpr)
  return rows


@pytest.mark.slow
def test_group_sampling_prefills_each_prompt_once_and_equals_repeated_prompts(tiny_checkpoints):
  kv_dtype = "int8"  # the repeated cache carries its scales too
  model = load_pretrained(tiny_checkpoints["qwen3"])
  graphdef, state = nnx.split(model)
  n = 4
  tokens, valid = left_pad([p for p in PROMPTS for _ in range(n)], PAD)  # 3 prompts x 4 samples
  outs, rows = [], []
  for samples_per_prompt in (1, n):
    config = SamplingConfig(max_new_tokens=10, temperature=1.0, eos_ids=(EOS,), pad_id=PAD, kv_dtype=kv_dtype,
                            samples_per_prompt=samples_per_prompt, decode_chunk=4)
    sampler = Sampler(graphdef, config)
    outs.append(sampler(state, tokens, valid, jax.random.key(9)))
    rows.append(_prefill_rows(sampler, state, tokens, valid, jax.random.key(9)))
  assert rows == [{12}, {3}]  # the prefill's matmuls run over 12 rows, then over the 3 distinct prompts
  np.testing.assert_array_equal(outs[0].tokens_BxN, outs[1].tokens_BxN)
  np.testing.assert_array_equal(outs[0].mask_BxN, outs[1].mask_BxN)
  # A 3-row prefill sums in another order than a 12-row one; an int8 KV value that sits on a rounding edge
  # can then round the other way (native KV: equal to 1e-5).
  np.testing.assert_allclose(outs[0].logprobs_BxN, outs[1].logprobs_BxN, atol=5e-3)
  assert len({tuple(r) for r in np.asarray(outs[1].tokens_BxN)[:n]}) > 1  # a group's samples differ
  with pytest.raises(ValueError, match="samples_per_prompt=5"):
    Sampler(graphdef, dataclasses.replace(config, samples_per_prompt=5))(state, tokens, valid, jax.random.key(9))


@pytest.mark.slow
@pytest.mark.parametrize("kv_dtype", ["native", "int8"])
def test_chunked_decode_equals_one_loop_over_the_full_cache(tiny_checkpoints, kv_dtype):
  outs = [_sample(tiny_checkpoints["qwen3"], SamplingConfig(max_new_tokens=10, temperature=1.0, eos_ids=(EOS,),
                                                            pad_id=PAD, kv_dtype=kv_dtype, decode_chunk=chunk),
                  key=4)[3] for chunk in (0, 3)]
  np.testing.assert_array_equal(outs[0].tokens_BxN, outs[1].tokens_BxN)
  np.testing.assert_array_equal(outs[0].mask_BxN, outs[1].mask_BxN)
  np.testing.assert_allclose(outs[0].logprobs_BxN, outs[1].logprobs_BxN, atol=1e-5)


def test_kv_cache_grows_with_empty_slots_and_refuses_to_shrink():
  """Attention reads the visible slots only; growing within the capacity widens them without a copy, beyond it
  pads the buffers."""
  cache = KVCache.init(batch=2, slots=3, num_layers=1, num_kv_heads=2, head_dim=4, compute_dtype=jnp.float32,
                       kv_dtype="int8", capacity=6)
  assert (cache.slots, cache.capacity) == (3, 6)
  cache = cache.write(0, jnp.ones((2, 3, 2, 4)), jnp.ones((2, 3, 2, 4)), 0)
  cache = cache.replace(valid_BxC=cache.valid_BxC.at[:, :3].set(True))
  assert cache.read(0, jnp.float32)[0].shape == (2, 2, 4, 3)
  grown = cache.grow(5)
  k, v = grown.read(0, jnp.float32)
  assert grown.slots == 5 and grown.capacity == 6 and k.shape == (2, 2, 4, 5) and v.shape == (2, 2, 5, 4)
  assert grown.k_LxBxKxHxC is cache.k_LxBxKxHxC  # the same buffer: nothing copied
  np.testing.assert_allclose(k[..., :3], 1.0, rtol=1e-2)
  np.testing.assert_array_equal(k[..., 3:], 0.0)
  np.testing.assert_array_equal(grown.valid_BxS, [[True] * 3 + [False] * 2] * 2)
  wider = grown.grow(8)  # beyond the capacity: padded with empty slots (values 0, scales 1)
  assert (wider.slots, wider.capacity) == (8, 8)
  np.testing.assert_array_equal(wider.read(0, jnp.float32)[1][:, :, 5:], 0.0)
  np.testing.assert_array_equal(wider.k_scale_LxBxKx1xC[..., 6:], 1.0)
  with pytest.raises(ValueError, match="cannot shrink"):
    grown.grow(4)


@pytest.mark.slow
def test_top_logprobs_are_returned(tiny_checkpoints):
  config = SamplingConfig(max_new_tokens=5, temperature=0.0, eos_ids=(), pad_id=PAD, logits_top_k=4)
  model, tokens, valid, out = _sample(tiny_checkpoints["qwen2"], config)
  assert out.top_logprobs_BxNxK.shape == (3, 5, 4)
  logits = response_logits(model, tokens, valid, out.tokens_BxN, out.mask_BxN)
  np.testing.assert_allclose(out.top_logprobs_BxNxK, jax.lax.top_k(jax.nn.log_softmax(logits), 4)[0], atol=1e-4)
  np.testing.assert_array_equal(out.top_ids_BxNxK[..., 0], out.tokens_BxN)  # greedy = top-1


def test_left_pad_rejects_empty_or_long_prompts():
  with pytest.raises(ValueError, match="1..3 tokens"):
    left_pad([[1, 2, 3, 4]], PAD, length=3)
  with pytest.raises(ValueError):
    left_pad([[]], PAD)
