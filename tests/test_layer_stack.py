"""Stacked layer storage ([L, ...] per parameter) against per-layer storage: the same numbers at every edge.

Per-layer storage (scan_layers=False) is the reference: its loop and its paths are what stacked storage replaced
in the scanned models. The bar is 1e-6 (float32) wherever the two run different XLA programs (scan vs loop) and
exact equality wherever the same arithmetic runs on the same values (loading, recipes, noise, export, pruning).
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from aqt.jax.v2.aqt_tensor import QTensor
from flax import nnx

from opd_jax.models import layer_stack, load_pretrained, save_pretrained
from opd_jax.models import sharding as shard_lib
from opd_jax.prepare.prune import pruned_model
from opd_jax.rollout import precision
from opd_jax.rollout.config import RolloutConfig, build_sampler_state
from opd_jax.rollout.noise import add_relative_noise
from opd_jax.rollout.sampler import Sampler, SamplingConfig, left_pad
from opd_jax.train.export import export_student
from opd_jax.train.optimizer import make_optimizer, make_schedule
from tests import checkpoints

FAMILY = "llama"  # untied head, GQA 4:1, llama3 rope scaling


@pytest.fixture(scope="module")
def models(tiny_checkpoints):
  """(stacked, per-layer) Decoders of one checkpoint, with the einsum attention both ways."""
  path = tiny_checkpoints[FAMILY]
  return (load_pretrained(path, attention="reference", scan_layers=True),
          load_pretrained(path, attention="reference", scan_layers=False))


def _view(state) -> dict[str, np.ndarray]:
  """Per-layer dotted path -> dense value (quantized tensors dequantized)."""
  dense = lambda v: np.asarray(v.dequant() if hasattr(v, "dequant") else v)
  return {layer_stack.dotted(p): dense(v) for p, v in layer_stack.per_layer_flat(state)}


def _assert_views_equal(got, want, atol=0.0):
  got, want = _view(got), _view(want)
  assert list(got) == list(want)
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=0, atol=atol, err_msg=name)


def test_stacked_storage_holds_the_per_layer_values(models):
  stacked, per_layer = models
  L = stacked.config.num_hidden_layers
  state, reference = nnx.state(stacked), nnx.state(per_layer)
  kernel = state["layers"]["self_attn"]["q_proj"]["kernel"].get_value()
  c = stacked.config
  assert kernel.shape == (L, c.hidden_size, c.num_attention_heads * c.head_dim)
  assert "layers.self_attn.q_proj.kernel" in {layer_stack.dotted(p) for p, _ in nnx.to_flat_state(state)}
  # The per-layer view names and orders parameters exactly as per-layer storage stores them.
  assert layer_stack.paths(state) == [layer_stack.dotted(p) for p, _ in nnx.to_flat_state(reference)]
  _assert_views_equal(state, reference)
  assert layer_stack.get(state, "layers.1.mlp.up_proj.kernel").shape == (48, 80)


def test_logits_gradients_and_an_optimizer_step_match_per_layer_storage(models):
  """Scan over the stored stack vs the per-layer loop: logits, per-layer gradients and one AdamW step (global-norm
  clipping and weight decay on) to 1e-6."""
  tokens = jnp.asarray(np.random.RandomState(3).randint(3, checkpoints.VOCAB, (3, 11)))
  valid = jnp.asarray(np.arange(11)[None, :] >= np.array([[4], [0], [9]]))
  weights = jnp.asarray(np.random.RandomState(4).randn(3, 11, checkpoints.VOCAB), jnp.float32)
  optimizer = make_optimizer(make_schedule(learning_rate=1e-2, warmup_steps=0, total_steps=2),
                             weight_decay=0.1, grad_clip_norm=0.5)
  results = []
  for model in models:
    graphdef, state = nnx.split(model)

    def loss(state):
      logits = nnx.merge(graphdef, state)(tokens, valid_BxT=valid)
      return jnp.sum(jnp.where(valid[..., None], logits * weights, 0.0)), logits

    @jax.jit
    def step(state):
      (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(state)
      updates, _ = optimizer.update(grads, optimizer.init(state), state)
      return logits, grads, optax.apply_updates(state, updates)

    results.append(step(state))
  (logits, grads, updated), (want_logits, want_grads, want_updated) = results
  np.testing.assert_allclose(np.asarray(logits)[np.asarray(valid)], np.asarray(want_logits)[np.asarray(valid)],
                             atol=1e-6, rtol=0)
  assert grads["layers"]["mlp"]["up_proj"]["kernel"].get_value().shape[0] == 2  # gradients come back stacked
  # Gradients up to ~10 in float32, accumulated in another order through the scan: within 5e-5 (about 20 ulps of
  # the largest), and the Adam step's parameters within 1e-5; bit-equal at LLVM -O3, 1.8e-5 and 1.6e-6 apart at
  # the -O0 tests/conftest.py compiles with.
  _assert_views_equal(grads, want_grads, atol=5e-5)
  _assert_views_equal(updated, want_updated, atol=1e-5)


def test_noise_draws_what_per_layer_storage_draws(models):
  """Each layer tensor's key is its index in the per-layer view: the same draws, so the same noisy weights up to
  float32 rounding of the norms (a vmapped reduction sums in another order; measured <= 6e-8); another draw
  would differ by ~1e-2."""
  key = jax.random.key(11)
  noisy = jax.jit(add_relative_noise)(nnx.state(models[0]), 0.05, key)
  _assert_views_equal(noisy, jax.jit(add_relative_noise)(nnx.state(models[1]), 0.05, key), atol=1e-6)


@pytest.mark.parametrize("rules,mixed", [
    (precision.recipe_rules("fp8"), False), (precision.recipe_rules("int4", embedding=True), False),
    (precision.recipe_rules("fp8_tensor"), False),
    (precision.recipe_rules(rules=[(r"^layers\.0\.", "bf16"), ("proj", "fp8")]), True)],
    ids=["fp8", "int4+embedding", "fp8_tensor", "layer0_bf16"])
def test_recipes_quantize_each_layer_as_per_layer_storage_does(models, rules, mixed):
  stacked, reference = (jax.jit(precision.apply_recipe, static_argnums=1)(nnx.state(m), rules) for m in models)
  _assert_views_equal(stacked, reference)
  assert precision.state_bytes(stacked) == precision.state_bytes(reference)
  kernel = stacked["layers"]["mlp"]["up_proj"]["kernel"].get_value()
  if mixed:  # layers of two precisions: kept per layer
    assert layer_stack.is_per_layer(kernel) and kernel[0].dtype == jnp.bfloat16 and isinstance(kernel[1], QTensor)
  else:  # one precision: one stacked quantized tensor, scales per layer and channel
    assert isinstance(kernel, QTensor) and kernel.qvalue.shape == (2, 48, 80)
    assert kernel.scale[0].shape == ((2, 1, 1) if "tensor" in rules[0][1] else (2, 1, 80))


_SLOW = pytest.mark.slow  # the fast tier keeps the mixed recipe (PerLayer values, quantized cache) of these


@pytest.mark.parametrize("rollout", [
    pytest.param(RolloutConfig(), marks=_SLOW),
    pytest.param(RolloutConfig(weights="fp8", kv_cache="int8"), marks=_SLOW),
    pytest.param(RolloutConfig(noise_sigma=0.05), marks=_SLOW),
    RolloutConfig(weight_rules=((r"^layers\.1\.mlp", "bf16"), ("proj", "int8")), kv_cache="fp8")],
    ids=["exact", "fp8+kv_int8", "noise", "mixed_recipe+kv_fp8"])
def test_decoding_matches_per_layer_storage(models, rollout):
  """The sampler scans the stacked layers with the KV cache in the carry (or loops over PerLayer values): the
  same tokens, and log-probs to 1e-5, as the per-layer loop. Inside the decode loop XLA fuses the scanned and the
  unrolled bodies differently (float32 reassociation: <= 2.7e-6 measured on log-probs of magnitude ~6; the
  unrolled loop itself moved by 2.4e-6 from the per-layer cache it replaced); a wrong layer, cache slot or
  recipe moves them by >= 1e-2."""
  tokens, valid = left_pad([[5, 6, 7], [9], [3, 4, 5, 6, 7], [11, 12]], 0)
  config = rollout.sampling(eos_ids=(2,), pad_id=0, logits_top_k=4)
  outs = []
  for model in models:
    graphdef, state = nnx.split(model)
    sampler_state = build_sampler_state(state, rollout, jnp.int32(3))
    outs.append(Sampler(graphdef, config)(sampler_state, tokens, valid, jax.random.key(2)))
  got, want = outs
  np.testing.assert_array_equal(got.tokens_BxN, want.tokens_BxN)
  np.testing.assert_array_equal(got.mask_BxN, want.mask_BxN)
  np.testing.assert_allclose(got.logprobs_BxN, want.logprobs_BxN, atol=1e-5, rtol=0)
  np.testing.assert_allclose(got.top_logprobs_BxNxK, want.top_logprobs_BxNxK, atol=1e-5, rtol=0)


def test_decode_program_does_not_grow_with_depth(tmp_path):
  """Decoding runs one scanned layer body: the sampler's program is the same size at 2 and 6 layers, while the
  per-layer loop's grows with every layer."""
  sizes = {}
  for layers in (2, 6):
    path = checkpoints.make_tiny_checkpoint(str(tmp_path / f"L{layers}"), "qwen3", num_hidden_layers=layers)
    for scan in (True, False):
      graphdef, state = nnx.split(load_pretrained(path, scan_layers=scan))
      sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=4, decode_chunk=4))
      tokens, valid = left_pad([[5, 6, 7]], 0)
      text = sampler._fn.lower(state, tokens, valid, jax.random.key(0)).as_text()
      sizes[(layers, scan)] = text.count("\n")
  assert sizes[(6, True)] == sizes[(2, True)]
  assert sizes[(6, False)] > sizes[(2, False)] + 100


def test_sharded_loading_reads_each_device_block(tiny_checkpoints):
  """A stacked parameter is assembled per device from the per-layer tensors (the layer axis whole, the rules'
  axes on the rest), equal to the unsharded load."""
  mesh = shard_lib.make_mesh(1, 4, 2)
  sharded = load_pretrained(tiny_checkpoints[FAMILY], sharding_for=shard_lib.loader_shardings(mesh))
  kernel = sharded.layers.mlp.up_proj.kernel.get_value()
  assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
  assert len({d for d in kernel.sharding.device_set}) == 8
  _assert_views_equal(nnx.state(sharded), nnx.state(load_pretrained(tiny_checkpoints[FAMILY])))
  shardings = shard_lib.state_shardings(nnx.state(sharded), mesh)  # the rule table agrees with the loader
  assert shardings["layers"]["mlp"]["up_proj"]["kernel"].get_value().spec == kernel.sharding.spec


def test_hf_save_and_export_write_what_per_layer_storage_writes(models, tiny_checkpoints, tmp_path):
  stacked, per_layer = models
  for name, model in (("stacked", stacked), ("per_layer", per_layer)):
    save_pretrained(model, str(tmp_path / f"save_{name}"))
    graphdef, params = nnx.split(model)
    export_student(graphdef, params, tiny_checkpoints[FAMILY], str(tmp_path / f"export_{name}"),
                   os.path.join(os.path.dirname(__file__), "..", "opd_jax", "assets", "pair1", "student"))
  for kind in ("save", "export"):
    a, b = (open(tmp_path / f"{kind}_{name}" / "model.safetensors", "rb").read() for name in ("stacked", "per_layer"))
    assert a == b, kind
  reloaded = load_pretrained(str(tmp_path / "export_stacked"), attention="reference", scan_layers=False)
  _assert_views_equal(nnx.state(reloaded), nnx.state(per_layer))


def test_pruning_keeps_the_same_layers(models):
  kept = [1]
  pruned = [pruned_model(model, kept) for model in models]
  assert pruned[0].layers.mlp.up_proj.kernel.get_value().shape[0] == 1
  _assert_views_equal(nnx.state(pruned[0]), nnx.state(pruned[1]))


def test_a_checkpoint_of_the_other_storage_is_a_clear_mismatch(models, tmp_path):
  from opd_jax.train.checkpoint.manager import Checkpointer, CheckpointMismatch
  stacked, per_layer = (nnx.state(m) for m in models)
  checkpointer = Checkpointer(str(tmp_path / "checkpoints"), keep=1)
  checkpointer.save(1, {"train": per_layer}, {"step": 1})
  checkpointer.wait()
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), stacked)
  with pytest.raises(CheckpointMismatch, match=r"store the decoder layers differently .*model\.scan_layers"):
    checkpointer.restore_latest_intact(lambda meta: {"train": abstract})
  checkpointer.close()
  assert json.loads((tmp_path / "checkpoints" / "1" / "checksums.json").read_text())  # the step was left as it is


@pytest.mark.slow
def test_a_mixed_recipe_syncs_onto_the_sampler_mesh_and_checkpoints(models, tmp_path):
  """PerLayer values (layers at two precisions) through the weight sync onto a 4-device tensor-parallel sampler
  mesh: each layer's kernel on the inference layout, the same samples as per-layer storage's sync, and a
  snapshot checkpoint that restores them as they were."""
  from opd_jax.rollout import placement
  from opd_jax.rollout.weight_sync import WeightSync
  from opd_jax.train.checkpoint.manager import Checkpointer
  rollout = RolloutConfig(weight_rules=((r"^layers\.0\.", "bf16"), ("proj", "fp8")))
  mesh = placement.sampler_mesh(jax.devices()[:4], 2)
  tokens, valid = left_pad([[5, 6, 7], [9], [3, 4, 5, 6, 7], [11, 12]], 0)
  outs = []
  for model in models:
    graphdef, state = nnx.split(model)
    sync = WeightSync(rollout, state, mesh, jnp.float32)
    synced = sync(state, 1)
    sampler = Sampler(graphdef, rollout.sampling(eos_ids=(2,), pad_id=0), mesh=mesh, state_shardings=sync.shardings)
    put = lambda x: jax.device_put(x, sampler.batch_sharding)
    outs.append(sampler(synced, put(tokens), put(valid), jax.random.key(2)))
  np.testing.assert_array_equal(outs[0].tokens_BxN, outs[1].tokens_BxN)
  np.testing.assert_allclose(outs[0].logprobs_BxN, outs[1].logprobs_BxN, atol=1e-5, rtol=0)
  graphdef, state = nnx.split(models[0])
  sync = WeightSync(rollout, state, mesh, jnp.float32)
  synced_stacked = sync(state, 1)
  kernel = synced_stacked["layers"]["mlp"]["up_proj"]["kernel"].get_value()
  assert layer_stack.is_per_layer(kernel) and tuple(kernel[1].qvalue.sharding.spec) == (None, "tensor")
  checkpointer = Checkpointer(str(tmp_path / "checkpoints"), keep=1)
  checkpointer.save(1, {"snapshot": synced_stacked}, {"step": 1})
  checkpointer.wait()
  restored = checkpointer.restore_latest_intact(lambda meta: {"snapshot": sync.abstract}).arrays["snapshot"]
  checkpointer.close()
  _assert_views_equal(restored, synced_stacked)
  assert restored["layers"]["mlp"]["up_proj"]["kernel"].get_value()[1].qvalue.sharding == kernel[1].qvalue.sharding
