"""Mismatch knobs: AQT weight recipes, quantized KV cache, weight noise, lagged snapshots, memory accounting."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from aqt.jax.v2.aqt_tensor import QTensor
from flax import nnx

from opd_jax.models import layer_stack, load_pretrained, shapes
from opd_jax.models.linear import DEQUANT_SCOPE
from opd_jax.rollout import kv_cache, memory, precision
from opd_jax.rollout.config import RolloutConfig, build_sampler_state
from opd_jax.rollout.noise import add_relative_noise
from opd_jax.rollout.sampler import Sampler, left_pad
from opd_jax.rollout.snapshots import SnapshotStore
from opd_jax.objectives.logprobs import response_logits, token_logprobs

EOS, PAD = 2, 0
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16], [20, 21, 22]]


def _mismatch(path, rollout: RolloutConfig, key=0):
  """Mean |sampler logp - learner logp| over sampled tokens, with the learner's fresh float32 weights."""
  model = load_pretrained(path)
  graphdef, state = nnx.split(model)
  sampler_state = build_sampler_state(state, rollout, jnp.int32(0))
  tokens, valid = left_pad(PROMPTS, PAD)
  sampler = Sampler(graphdef, rollout.sampling(eos_ids=(EOS,), pad_id=PAD))
  out = sampler(sampler_state, tokens, valid, jax.random.key(key))
  learner = token_logprobs(response_logits(model, tokens, valid, out.tokens_BxN, out.mask_BxN), out.tokens_BxN)
  return float(jnp.sum(jnp.abs(learner - out.logprobs_BxN) * out.mask_BxN) / jnp.sum(out.mask_BxN))


def test_no_knobs_is_zero_mismatch(tiny_checkpoints):
  assert RolloutConfig().is_exact
  assert _mismatch(tiny_checkpoints["qwen3"], RolloutConfig(max_new_tokens=12)) < 1e-5


# Each knob's bound on the mean |logp difference| is about 3x what it measured on the tiny llama (in brackets), so a
# scale or rounding bug that multiplies a knob's error fails here: bf16 weights (0.012) and KV (0.0047), int8 (0.026,
# KV 0.013), fp8 (0.15, per-tensor 0.12, KV 0.050), e5m2 with 2 mantissa bits the coarsest (0.22, KV 0.13).
KNOB_BOUNDS = {"weights=int8": 0.08, "kv_cache=int8": 0.04, "weights=fp8": 0.45, "weights=fp8_e5m2": 0.65,
               "weights=fp8_tensor": 0.35, "weights=bf16": 0.04, "kv_cache=fp8": 0.15, "kv_cache=bf16": 0.015,
               "kv_cache=fp8_e5m2": 0.4}


@pytest.mark.parametrize("knob", ["weights=int8", "kv_cache=int8"] + [  # the fast tier: these two
    pytest.param(knob, marks=pytest.mark.slow) for knob in (
        "weights=fp8", "weights=fp8_e5m2", "weights=fp8_tensor", "weights=bf16", "kv_cache=fp8", "kv_cache=bf16",
        "kv_cache=fp8_e5m2")])
def test_each_precision_knob_is_small_and_nonzero(tiny_checkpoints, knob):
  field, value = knob.split("=")
  error = _mismatch(tiny_checkpoints["llama"], RolloutConfig(max_new_tokens=12, **{field: value}))
  assert 1e-6 < error < KNOB_BOUNDS[knob], (knob, error)


def test_precision_knobs_on_gemma3(tiny_checkpoints):
  """Gemma 3's sampler (sliding-window cache, scaled embedding, quantized too) under weight and KV recipes: small,
  nonzero, and int4 weights coarser than int8."""
  path = tiny_checkpoints["gemma3_text"]
  errors = {knob: _mismatch(path, RolloutConfig(max_new_tokens=12, **{field: dtype}))
            for knob, (field, dtype) in {"w8": ("weights", "int8"), "w4": ("weights", "int4"),
                                         "fp8": ("weights", "fp8"), "kv8": ("kv_cache", "fp8")}.items()}
  # about 3x what each measured (w8 0.0050, w4 0.14, fp8 0.022, kv8 0.012; int8 with the embedding 0.0067)
  bounds = {"w8": 0.015, "w4": 0.4, "fp8": 0.07, "kv8": 0.035}
  assert all(1e-6 < errors[k] < bounds[k] for k in errors), errors
  assert errors["w4"] > errors["w8"], errors
  embedding = _mismatch(path, RolloutConfig(max_new_tokens=12, weights="int8", quantize_embedding=True))
  assert 1e-6 < embedding < 0.02


@pytest.mark.slow
def test_int4_is_coarser_than_int8_for_weights_and_kv_and_int3_coarser_still(tiny_checkpoints):
  path = tiny_checkpoints["qwen2"]
  for field in ("weights", "kv_cache"):
    int8, int4 = (_mismatch(path, RolloutConfig(max_new_tokens=12, **{field: d})) for d in ("int8", "int4"))
    assert 0 < int8 < int4, (field, int8, int4)
  int3 = _mismatch(path, RolloutConfig(max_new_tokens=12, weights="int3"))
  assert int3 > int4, (int3, int4)


@pytest.mark.slow
def test_fp8_is_coarser_than_int8(tiny_checkpoints):
  path = tiny_checkpoints["qwen2"]
  assert _mismatch(path, RolloutConfig(max_new_tokens=12, weights="fp8")) > _mismatch(
      path, RolloutConfig(max_new_tokens=12, weights="int8"))


@pytest.mark.slow
def test_mismatch_grows_with_noise_sigma(tiny_checkpoints):
  errors = [_mismatch(tiny_checkpoints["qwen3"], RolloutConfig(max_new_tokens=12, noise_sigma=s))
            for s in (0.0, 0.01, 0.03, 0.1)]
  assert errors[0] < 1e-5 and errors == sorted(errors) and errors[1] > 1e-4, errors


@pytest.mark.slow
def test_noise_has_exact_relative_norm_and_is_reproducible(tiny_checkpoints):
  state = nnx.state(load_pretrained(tiny_checkpoints["qwen2"]))
  noisy = add_relative_noise(state, 0.05, jax.random.key(7))
  again = add_relative_noise(state, 0.05, jax.random.key(7))
  view = layer_stack.per_layer_flat  # one ratio per layer tensor, whatever the storage
  for (path, a), (_, b), (_, c) in zip(view(state), view(noisy), view(again)):
    ratio = float(jnp.linalg.norm(b - a) / jnp.linalg.norm(a))
    assert abs(ratio - 0.05) < 1e-4, path
    np.testing.assert_array_equal(b, c)


def test_recipe_stores_quantized_values_and_saves_bytes(tiny_checkpoints):
  model = load_pretrained(tiny_checkpoints["llama"])
  state = nnx.state(model)
  rules = precision.recipe_rules("int8")
  quantized = precision.apply_recipe(state, rules)
  kernel = layer_stack.get(quantized, "layers.0.mlp.up_proj.kernel")  # one layer of the stacked [L, ...] kernel
  assert isinstance(kernel, QTensor) and kernel.qvalue.dtype == jnp.int8 and kernel.scale[0].shape == (1, 80)
  assert not isinstance(quantized["embed_tokens"]["embedding"].get_value(), QTensor)  # shorthand skips it
  # The analytic accounting equals the bytes actually held (learner float32 -> native 4 bytes).
  assert precision.state_bytes(nnx.state(model, nnx.Param)) == memory.weight_bytes(model.config, (), 4)
  assert precision.state_bytes(quantized) == memory.weight_bytes(model.config, rules, 4)
  everything = (("embed_tokens", "fp8"), ("lm_head", "int8"), (".*", "bf16"))
  full = precision.apply_recipe(state, precision.recipe_rules(rules=everything))
  assert precision.state_bytes(full) == memory.weight_bytes(model.config, precision.recipe_rules(rules=everything), 4)
  assert precision.state_bytes(full) < precision.state_bytes(state) / 2  # float32 -> bf16 / 8-bit
  # int4 / int3 / int2 (stored jnp.int4, counted two per byte) and per-tensor fp8 (one scale per matrix), same
  # arithmetic; the integer grids hold only their levels.
  for name, levels in (("int4", 7), ("int3", 3), ("int2", 1), ("fp8_tensor", None)):
    recipe = precision.recipe_rules(name, embedding=True)
    out = precision.apply_recipe(state, recipe)
    kernel = layer_stack.get(out, "layers.0.mlp.up_proj.kernel")
    assert kernel.qvalue.dtype == (jnp.float8_e4m3fn if levels is None else jnp.int4)
    assert kernel.scale[0].shape == ((1, 1) if levels is None else (1, 80))
    assert precision.state_bytes(out) == memory.weight_bytes(model.config, recipe, 4)
    if levels is not None:
      used = set(np.unique(np.asarray(kernel.qvalue, np.int32)))
      assert used <= set(range(-levels, levels + 1)) and {-levels, levels} <= used, (name, used)

def test_per_layer_rules_first_match_wins(tiny_checkpoints):
  state = nnx.state(load_pretrained(tiny_checkpoints["qwen3"]))
  rules = precision.recipe_rules(rules=[(r"layers\.0\.", "bf16"), (r"mlp", "fp8")])
  out = precision.apply_recipe(state, rules)
  assert layer_stack.get(out, "layers.0.mlp.up_proj.kernel").dtype == jnp.bfloat16
  assert isinstance(layer_stack.get(out, "layers.1.mlp.up_proj.kernel"), QTensor)
  assert layer_stack.get(out, "layers.1.self_attn.q_proj.kernel").dtype == jnp.float32
  # Layers of two precisions cannot share one [L, ...] array: the stacked parameters are kept per layer.
  assert layer_stack.is_per_layer(out["layers"]["mlp"]["up_proj"]["kernel"].get_value())


@pytest.mark.slow
def test_quantized_embedding_lookup_matches_dense(tiny_checkpoints):
  model = load_pretrained(tiny_checkpoints["qwen3"])  # tied: the table is also the output head
  graphdef, state = nnx.split(model)
  rules = precision.recipe_rules(rules=[("embed_tokens", "int8")])
  quantized = precision.apply_recipe(state, rules)
  tokens = jnp.asarray([[1, 5, 9, 33]])
  a = nnx.merge(graphdef, quantized)(tokens)
  b = nnx.merge(graphdef, precision.dequantized(quantized))(tokens)
  np.testing.assert_allclose(a, b, atol=1e-5)
  assert float(jnp.abs(a - model(tokens)).max()) > 0


def test_kv_quantization_error_is_bounded():
  x = jax.random.normal(jax.random.key(0), (2, 5, 3, 16)) * 3
  for dtype, bound in (("int8", 0.5 / 127), ("int4", 0.5 / 7), ("fp8_e4m3", 0.07), ("fp8_e5m2", 0.13),
                       ("bf16", 2 ** -8)):
    err = jnp.abs(kv_cache.quantize_dequantize(x, dtype) - x) / jnp.max(jnp.abs(x), -1, keepdims=True)
    assert 0 < float(err.max()) <= bound, dtype
  np.testing.assert_array_equal(kv_cache.quantize_dequantize(x, "native"), x)
  with pytest.raises(ValueError, match="kv cache dtype 'int2'"):
    kv_cache.check_kv_dtype("int2")


def _old_quantize_dequantize(x, kv_dtype):
  """The float32-scale formula before bfloat16 scales existed (no clip before the cast), for equality."""
  qmax = kv_cache._QMAX[kv_dtype]
  scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / qmax
  scale = jnp.where(scale > 0, scale, 1.0)
  if kv_dtype.startswith("fp8"):
    return (x / scale).astype(kv_cache._FP8[kv_dtype]).astype(jnp.float32) * scale
  return jnp.clip(jnp.round(x / scale), -qmax, qmax) * scale


def test_kv_dtypes_with_bfloat16_scales_store_what_they_read_and_cost_two_scale_bytes():
  """`<dtype>_bf16scale`: the scale rounded to bfloat16 before quantizing, so the cache reads back exactly what
  quantize_dequantize gives, within the grid's error; float32-scale dtypes keep their old values bit for bit."""
  x = jax.random.normal(jax.random.key(2), (2, 5, 3, 16)) * 3
  for dtype in ("int8", "int4", "fp8_e4m3", "fp8_e5m2"):
    np.testing.assert_array_equal(kv_cache.quantize_dequantize(x, dtype), _old_quantize_dequantize(x, dtype))
  for dtype, bound in (("int8", 0.5 / 127), ("int4", 0.5 / 7), ("fp8_e4m3", 0.07), ("fp8_e5m2", 0.13)):
    got = kv_cache.quantize_dequantize(x, dtype + kv_cache.BF16_SCALE)
    err = jnp.abs(got - x) / jnp.max(jnp.abs(x), -1, keepdims=True)
    assert 0 < float(err.max()) <= bound * (1 + 2 ** -7), dtype  # the scale moves by at most a bfloat16 step
    assert float(jnp.abs(got - kv_cache.quantize_dequantize(x, dtype)).max()) > 0, dtype  # really another format
  assert kv_cache.check_kv_dtype("fp8_bf16scale") == "fp8_e4m3_bf16scale"
  with pytest.raises(ValueError, match="kv cache dtype 'native_bf16scale'"):
    kv_cache.check_kv_dtype("native_bf16scale")
  from opd_jax.rollout.paged_cache import PagedKVCache
  for dtype in ("fp8_e4m3_bf16scale", "int4_bf16scale"):
    cache = kv_cache.KVCache.init(batch=2, slots=5, num_layers=1, num_kv_heads=3, head_dim=16,
                                  compute_dtype=jnp.float32, kv_dtype=dtype)
    assert cache.k_scale_LxBxKx1xC.dtype == jnp.bfloat16
    k, _ = cache.write(0, x, x, 0).read(0, jnp.float32)
    np.testing.assert_array_equal(k, kv_cache.quantize_dequantize(x, dtype).transpose(0, 2, 3, 1))
    paged = PagedKVCache.init(num_pages=4, page_size=8, num_layers=1, num_kv_heads=3, head_dim=16,
                              compute_dtype=jnp.float32, kv_dtype=dtype).with_rows([[1], [2]], [0, 0])
    paged, _ = paged.begin(jnp.ones((2, 5), bool))
    k, _ = paged.write(0, x, x).end().read(0, jnp.float32)
    np.testing.assert_array_equal(k[..., :5], kv_cache.quantize_dequantize(x, dtype).transpose(0, 2, 3, 1))
  # SmolLM2-135M's shapes (30 layers, 3 kv heads, head_dim 64): fp8 holds 1.88x bf16's tokens, 1.94x with bf16 scales
  per_token = lambda kv: kv_cache.kv_bytes_per_token(num_layers=30, num_kv_heads=3, head_dim=64, kv_dtype=kv)
  assert per_token("fp8_e4m3") == 2 * 30 * 3 * (64 + 4) and per_token("fp8_e4m3_bf16scale") == 2 * 30 * 3 * (64 + 2)
  assert per_token("bf16") / per_token("fp8_e4m3_bf16scale") >= 1.9 > per_token("bf16") / per_token("fp8_e4m3")


@pytest.mark.slow  # the fast tier keeps the int8 KV cache (test_each_precision_knob_is_small_and_nonzero)
def test_int4_kv_cache_packs_two_values_per_byte_and_reads_back_what_was_written():
  x = jax.random.normal(jax.random.key(1), (2, 3, 2, 8))  # [B, T, K, H]
  cache = kv_cache.KVCache.init(batch=2, slots=5, num_layers=2, num_kv_heads=2, head_dim=8,
                                compute_dtype=jnp.float32, kv_dtype="int4")
  cache = cache.write(1, x, -x, 1)
  assert cache.k_LxBxKxHxC.shape == (2, 2, 2, 4, 5) and cache.k_LxBxKxHxC.dtype == jnp.uint8
  np.testing.assert_array_equal(cache.read(0, jnp.float32)[0], 0.0)  # the other layer is untouched
  k, v = cache.read(1, jnp.float32)
  want = kv_cache.quantize_dequantize(x, "int4")
  np.testing.assert_array_equal(k[..., 1:4], want.transpose(0, 2, 3, 1))
  np.testing.assert_array_equal(v[:, :, 1:4], kv_cache.quantize_dequantize(-x, "int4").transpose(0, 2, 1, 3))
  assert kv_cache.kv_bytes_per_token(num_layers=36, num_kv_heads=8, head_dim=128, kv_dtype="int4") == \
      2 * 36 * 8 * (64 + 4)  # half of int8's values, the same float32 scales
  with pytest.raises(ValueError, match="even head_dim"):
    kv_cache.KVCache.init(batch=1, slots=2, num_layers=1, num_kv_heads=1, head_dim=7, compute_dtype=jnp.float32,
                          kv_dtype="int4")


@pytest.mark.parametrize("on", ["device", "host"])
def test_snapshot_store_lags_and_clamps(on):
  store = SnapshotStore(capacity=3, on=on)
  for version in range(5):
    store.push(version, {"w": jnp.full((2,), float(version))})
  assert store.versions() == [2, 3, 4]
  assert store.get(0)[0] == 4 and store.get(1)[0] == 3 and store.get(7)[0] == 2
  assert float(store.get(1)[1]["w"][0]) == 3.0
  kept = "pinned_host" if on == "host" else "device"
  assert {v["w"].sharding.memory_kind for v in store.state_dict().values()} == {kept}
  assert store.get(1)[1]["w"].sharding.memory_kind == "device"  # what the sampler reads is back on the device
  with pytest.raises(ValueError, match="not newer"):
    store.push(4, {})
  restored = SnapshotStore(capacity=3, on=on)
  restored.load_state_dict(store.state_dict())
  assert restored.get(2)[0] == 2
  device_sharding = store.get(0)[1]["w"].sharding
  abstract = restored.abstract([3], lambda: {"w": jax.ShapeDtypeStruct((2,), jnp.float32, sharding=device_sharding)})
  assert abstract["3"]["w"].sharding.memory_kind == kept


def test_weight_sync_quantizes_on_the_learner_and_moves_only_the_recipe_to_the_sampler(tiny_checkpoints):
  """Learner on devices 4-7 (fsdp), sampler on 0-3 (tensor 2): the sampler's copy is the recipe's bytes (the
  planner's arithmetic, bf16 for untouched matrices), lives on the sampler's devices only, equals the recipe
  applied in place, and survives the learner deleting (donating) its own buffers."""
  from opd_jax.models import sharding as shard_lib
  from opd_jax.rollout import placement
  from opd_jax.rollout.weight_sync import WeightSync
  model = load_pretrained(tiny_checkpoints["llama"])
  _, state = nnx.split(model)
  learner_mesh = shard_lib.make_mesh(1, 4, 1, devices=jax.devices()[4:])
  learner = shard_lib.shard_model_state(state, learner_mesh)
  rollout = RolloutConfig(weights="fp8")
  sync = WeightSync(rollout, learner, placement.sampler_mesh(jax.devices()[:4], 2), jnp.bfloat16)
  sampler_state = sync(learner, 3)
  leaves = jax.tree.leaves(sampler_state)
  assert {d.id for leaf in leaves for d in leaf.devices()} == {0, 1, 2, 3}
  vectors = sum(leaf.size * 2 for leaf in leaves if leaf.ndim == 1)  # norm weights stay float32: +2 bytes each
  assert precision.state_bytes(sampler_state) == memory.weight_bytes(model.config, rollout.weight_rules) + vectors
  expected = build_sampler_state(state, rollout, jnp.int32(3))
  dense = lambda tree: jax.tree.leaves(precision.dequantized(tree))
  for got, want in zip(dense(sampler_state), dense(expected)):  # untouched matrices: the bf16 the learner uses
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want.astype(got.dtype), np.float32))
  for leaf in jax.tree.leaves(learner):
    leaf.delete()
  assert all(np.isfinite(np.asarray(x, np.float32)).all() for x in dense(sampler_state))


@pytest.mark.slow
def test_staleness_changes_sampler_exactly_when_params_differ(tiny_checkpoints):
  model = load_pretrained(tiny_checkpoints["qwen3"])
  graphdef, state = nnx.split(model)
  store = SnapshotStore(capacity=2)
  store.push(0, state)
  store.push(1, state)  # an update that did not change the parameters
  rollout = RolloutConfig(max_new_tokens=8, staleness_steps=1)
  tokens, valid = left_pad(PROMPTS, PAD)
  sampler = Sampler(graphdef, rollout.sampling(eos_ids=(EOS,), pad_id=PAD))
  run = lambda s: sampler(build_sampler_state(s, rollout, jnp.int32(0)), tokens, valid, jax.random.key(1))
  np.testing.assert_array_equal(run(store.get(1)[1]).logprobs_BxN, run(store.get(0)[1]).logprobs_BxN)
  changed = jax.tree.map(lambda x: x * 1.01 if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
  store.push(2, changed)
  assert not np.array_equal(run(store.get(0)[1]).logprobs_BxN, run(store.get(1)[1]).logprobs_BxN)


@pytest.mark.parametrize("bad,match", [
    (dict(weights="int1"), "weight precision 'int1'"),
    (dict(kv_cache="fp16"), "kv cache dtype 'fp16'"),
    (dict(staleness_steps=-1), "staleness_steps"),
    (dict(noise_sigma=-0.1), "noise_sigma"),
    (dict(noise_order="during"), "noise_order"),
    (dict(weight_rules=(("[", "int8"),)), "regex"),
    (dict(temperature=-1.0), "temperature"),
])
def test_invalid_knobs_fail_when_read(bad, match):
  with pytest.raises(ValueError, match=match):
    RolloutConfig(**bad)


def test_rule_matching_nothing_is_an_error(tiny_checkpoints):
  state = nnx.state(load_pretrained(tiny_checkpoints["qwen3"]))
  with pytest.raises(ValueError, match=r"matches no parameter.*paths look like"):
    RolloutConfig(weight_rules=((r"layers\.7\.", "int8"),)).validate_for(state)
  RolloutConfig(weight_rules=((r"layers\.1\.", "int8"),)).validate_for(state)


def test_unknown_rollout_field_is_named():
  import ml_collections
  with pytest.raises(ValueError, match="unknown field.*'stalenes'"):
    RolloutConfig.from_config(ml_collections.ConfigDict({"stalenes": 2}))


def test_fp8_recipe_capacity_for_real_shapes():
  qwen = shapes.load("qwen3-8b")
  assert shapes.display_name("qwen3-8b") == "Qwen3-8B"
  assert abs(qwen.num_params() - 8.19e9) < 0.01e9
  assert sum(np.prod(s) for s in memory.parameter_shapes(qwen).values()) == qwen.num_params()
  base = memory.kv_capacity(qwen, (), "bf16", device_bytes=80 * 10 ** 9)
  fp8 = memory.kv_capacity(qwen, precision.recipe_rules("fp8"), "fp8_e4m3", device_bytes=80 * 10 ** 9)
  assert base.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2
  assert fp8.kv_tokens / base.kv_tokens >= 1.93


def _loop_computations(hlo: str) -> str:
  """The text of every computation a compiled module runs inside a while loop (bodies and what they call)."""
  comps, current = {}, None
  for line in hlo.split("\n"):
    head = re.match(r"^(?:ENTRY )?%([\w.\-]+) ", line)
    if head and line.rstrip().endswith("{"):
      current = head.group(1)
      comps[current] = []
    elif current:
      comps[current].append(line)
  called = lambda name: {c for line in comps.get(name, ()) for c in re.findall(
      r"(?:calls|body|condition|to_apply|branch_computations)=\{?%([\w.\-]+)", line)}
  pending = [c for lines in comps.values() for line in lines for c in re.findall(r"body=%([\w.\-]+)", line)]
  seen = set()
  while pending:
    name = pending.pop()
    if name not in seen:
      seen.add(name)
      pending.extend(called(name))
  return "\n".join(line for name in seen for line in comps.get(name, ()))


@pytest.mark.parametrize("knobs", [
    dict(weights="fp8", kv_cache="fp8"),
    pytest.param(dict(weight_rules=((r"layers\.0\.", "int4"), (r"layers\.", "fp8_e4m3"))), marks=pytest.mark.slow),
    pytest.param(dict(weights="int8", quantize_embedding=True), marks=pytest.mark.slow)])
def test_dense_layers_per_call_sample_exactly_what_the_stored_weights_do(tiny_checkpoints, knobs):
  """The CPU default (dense_layers) takes quantized and stacked weights out of the decode loops, where XLA:CPU
  converted and sliced every weight on every step (fp8 ran at 0.5x of float32 on SmolLM2); the tokens and
  log-probs must not change."""
  graphdef, state = nnx.split(load_pretrained(tiny_checkpoints["llama"]))
  rollout = RolloutConfig(max_new_tokens=10, temperature=1.0, **knobs)
  assert rollout.layout_on("cpu") == "dense_layers" and rollout.layout_on("gpu") == "stored"
  sampler_state = build_sampler_state(state, rollout, jnp.int32(0))
  tokens, valid = left_pad(PROMPTS, PAD)
  outs, loop_text = {}, {}
  for how in ("stored", "dense_layers"):
    sampler = Sampler(graphdef, dataclasses.replace(rollout.sampling(eos_ids=(EOS,), pad_id=PAD),
                                                    weight_layout=how))
    outs[how] = sampler(sampler_state, tokens, valid, jax.random.key(3))
    loop_text[how] = _loop_computations(
        sampler._fn.lower(sampler_state, tokens, valid, jax.random.key(3)).compile().as_text())
  np.testing.assert_array_equal(outs["stored"].tokens_BxN, outs["dense_layers"].tokens_BxN)
  np.testing.assert_allclose(outs["stored"].logprobs_BxN, outs["dense_layers"].logprobs_BxN, atol=1e-5)
  # Where weights become dense: inside the decode loops as stored (stacked layers: XLA keeps the conversion
  # there); nowhere inside them with dense layers, whose loops scan no layer stack. (A per-layer mixed recipe
  # runs unrolled layers either way, whose conversions XLA already hoists out of the loops.)
  mixed = "weight_rules" in knobs
  assert (DEQUANT_SCOPE in loop_text["stored"]) != mixed
  assert DEQUANT_SCOPE not in loop_text["dense_layers"] and "while/body" in loop_text["dense_layers"]
  scans = lambda text: "/scan/" in text or "while/body/while" in text  # a layer scan nested in the decode loop
  assert scans(loop_text["stored"]) != mixed and not scans(loop_text["dense_layers"])
