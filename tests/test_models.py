"""Decoder parity with transformers (one tiny random checkpoint per family), export, and bad inputs."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from opd_jax.models import CheckpointError, layer_stack, load_pretrained, read_hf_config, save_pretrained
from opd_jax.models.hf_io import hf_name
from tests import checkpoints

FAMILIES = checkpoints.FAMILIES
# The fast tier (pytest -m "not slow") checks parity on one family; the full suite on all.
FAMILIES_FAST_ONE = [pytest.param(f, marks=() if f == "qwen3" else pytest.mark.slow) for f in FAMILIES]


def _torch_logits(model, tokens, mask=None, positions=None):
  kwargs = {}
  if mask is not None:
    kwargs["attention_mask"] = torch.tensor(mask, dtype=torch.long)
  if positions is not None:
    kwargs["position_ids"] = torch.tensor(positions, dtype=torch.long)
  with torch.no_grad():
    return model(torch.tensor(tokens), **kwargs).logits.numpy()


@pytest.mark.parametrize("family", FAMILIES_FAST_ONE)
def test_logits_match_transformers(tiny_checkpoints, family):
  path = tiny_checkpoints[family]
  tokens = np.random.RandomState(1).randint(0, checkpoints.VOCAB, (3, 19))
  ours = np.asarray(load_pretrained(path)(jnp.asarray(tokens)))
  ref = _torch_logits(checkpoints.load_torch(path), tokens)
  assert ours.shape == ref.shape == (3, 19, checkpoints.VOCAB)
  assert np.abs(ours - ref).max() <= 1e-4


@pytest.mark.parametrize("family", FAMILIES_FAST_ONE)
def test_left_padded_logits_match_transformers(tiny_checkpoints, family):
  path = tiny_checkpoints[family]
  tokens = np.random.RandomState(2).randint(3, checkpoints.VOCAB, (2, 12))
  valid = np.ones((2, 12), bool)
  valid[0, :5] = False  # row 0 is left-padded by 5
  positions = np.maximum(np.cumsum(valid, 1) - 1, 0)
  ours = np.asarray(load_pretrained(path)(jnp.asarray(tokens), valid_BxT=jnp.asarray(valid)))
  ref = _torch_logits(checkpoints.load_torch(path), tokens, valid.astype(int), positions)
  assert np.abs(ours - ref)[valid].max() <= 1e-4
  # Padding must not leak: row 0's real tokens alone give the same logits.
  alone = np.asarray(load_pretrained(path)(jnp.asarray(tokens[:1, 5:])))
  np.testing.assert_allclose(ours[0, 5:], alone[0], atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES_FAST_ONE)
def test_export_round_trips_through_transformers(tiny_checkpoints, family, tmp_path):
  model = load_pretrained(tiny_checkpoints[family])
  save_pretrained(model, str(tmp_path / "out"))
  tokens = np.random.RandomState(3).randint(0, checkpoints.VOCAB, (2, 9))
  reloaded = checkpoints.load_torch(str(tmp_path / "out"))
  assert type(reloaded).__name__ == type(checkpoints.load_torch(tiny_checkpoints[family])).__name__
  np.testing.assert_allclose(_torch_logits(reloaded, tokens), np.asarray(model(jnp.asarray(tokens))), atol=1e-4)


def test_sharded_export_and_load(tiny_checkpoints, tmp_path):
  model = load_pretrained(tiny_checkpoints["llama"])
  out = str(tmp_path / "sharded")
  save_pretrained(model, out, max_shard_bytes=40_000)
  files = sorted(os.listdir(out))
  assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 2
  tokens = np.random.RandomState(4).randint(0, checkpoints.VOCAB, (2, 7))
  np.testing.assert_allclose(np.asarray(load_pretrained(out)(jnp.asarray(tokens))),
                             np.asarray(model(jnp.asarray(tokens))), atol=1e-6)
  np.testing.assert_allclose(_torch_logits(checkpoints.load_torch(out), tokens),
                             np.asarray(model(jnp.asarray(tokens))), atol=1e-4)


def test_bfloat16_parameters(tiny_checkpoints):
  path = tiny_checkpoints["qwen3"]
  model = load_pretrained(path, dtype=jnp.bfloat16)
  assert model.layers.self_attn.q_proj.kernel.get_value().dtype == jnp.bfloat16  # stacked [L, ...]
  tokens = jnp.asarray(np.random.RandomState(5).randint(0, checkpoints.VOCAB, (2, 8)))
  logits = model(tokens)
  assert logits.dtype == jnp.float32
  reference = load_pretrained(path)(tokens)
  assert 0 < float(jnp.abs(logits - reference).max()) < 0.5


def test_config_reads_both_rope_spellings():
  base = checkpoints.hf_config("qwen2").to_dict()
  legacy = {k: v for k, v in base.items() if k != "rope_parameters"}
  legacy["rope_theta"] = 12345.0
  from opd_jax.models import ModelConfig
  assert ModelConfig.from_hf_dict(legacy).rope_theta == 12345.0
  assert ModelConfig.from_hf_dict(base).rope_theta == 1000000.0
  llama = ModelConfig.from_hf_dict(checkpoints.hf_config("llama").to_dict())
  assert dict(llama.rope_scaling)["factor"] == 8.0 and llama.num_key_value_heads == 1


def test_param_names_map_to_hf():
  assert hf_name(("layers", 3, "self_attn", "q_proj", "kernel")) == ("model.layers.3.self_attn.q_proj.weight", True)
  assert hf_name(("embed_tokens", "embedding")) == ("model.embed_tokens.weight", False)
  assert hf_name(("lm_head", "kernel")) == ("lm_head.weight", True)
  assert hf_name(("layers", 0, "self_attn", "q_norm", "weight")) == ("model.layers.0.self_attn.q_norm.weight", False)


def test_gemma3_sliding_window_is_honoured(tiny_checkpoints, tmp_path):
  """Gemma 3's sliding layers see 4 positions back: widening the window leaves the first 4 positions' logits as
  they were and changes the later ones (so the parity tests above exercise the window, not a causal mask)."""
  path = tiny_checkpoints["gemma3_text"]
  tokens = jnp.asarray(np.random.RandomState(6).randint(3, checkpoints.VOCAB, (2, 12)))
  windowed = np.asarray(load_pretrained(path)(tokens))
  wide = _copy(path, tmp_path)
  _edit_config(wide, sliding_window=64)
  full = np.asarray(load_pretrained(wide)(tokens))
  np.testing.assert_allclose(windowed[:, :4], full[:, :4], atol=1e-6)
  assert np.abs(windowed[:, 4:] - full[:, 4:]).max() > 1e-2


def test_gemma3_linear_rope_scaling_matches_transformers(tmp_path):
  """Gemma 3 4B+ scale the full-attention layers' RoPE linearly (factor 8); the sliding layers keep theirs."""
  path = checkpoints.make_tiny_checkpoint(str(tmp_path / "g"), "gemma3_text", rope_parameters={
      "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
      "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
  assert dict(read_hf_config(path).rope_scaling) == {"factor": 8.0, "rope_type": "linear"}
  tokens = np.random.RandomState(7).randint(0, checkpoints.VOCAB, (2, 14))
  ours = np.asarray(load_pretrained(path)(jnp.asarray(tokens)))
  np.testing.assert_allclose(ours, _torch_logits(checkpoints.load_torch(path), tokens), atol=1e-4)


def test_gemma3_config_spellings_and_refusals():
  """transformers 4.x's flat spelling (rope_local_base_freq, sliding_window_pattern, no layer_types) reads as
  5.x's nested one; soft-capping and the multimodal config are refused by name."""
  from opd_jax.models import ModelConfig
  base = checkpoints.hf_config("gemma3_text", num_hidden_layers=7, layer_types=None).to_dict()
  config = ModelConfig.from_hf_dict(base)
  assert config.kinds_L == (1, 1, 1, 1, 1, 0, 1) and config.rope_theta == 1e6
  legacy = {k: v for k, v in base.items() if k not in ("rope_parameters", "layer_types")}
  legacy.update(rope_theta=1e6, rope_local_base_freq=5000.0, sliding_window_pattern=3)
  old = ModelConfig.from_hf_dict(legacy)
  assert old.kinds_L == (1, 1, 0, 1, 1, 0, 1) and old.rope_local_base_freq == 5000.0 and old.rope_theta == 1e6
  assert ModelConfig.from_hf_dict(config.to_hf_dict()) == config
  for change, fragment in (({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
                           ({"model_type": "gemma3"}, "gemma3_text"),
                           ({"hidden_activation": "relu"}, "hidden_activation")):
    with pytest.raises(CheckpointError, match=fragment):
      ModelConfig.from_hf_dict({**base, **change})


# ---------------------------------------------------------------------------------------------- bad inputs

def _copy(src, tmp_path):
  dst = str(tmp_path / "ckpt")
  shutil.copytree(src, dst)
  return dst


def _edit_config(path, **changes):
  with open(os.path.join(path, "config.json")) as f:
    config = json.load(f)
  config.update(changes)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)


def test_missing_directory(tmp_path):
  with pytest.raises(CheckpointError, match="does not exist"):
    load_pretrained(str(tmp_path / "nope"))


def test_missing_config(tiny_checkpoints, tmp_path):
  path = _copy(tiny_checkpoints["qwen3"], tmp_path)
  os.remove(os.path.join(path, "config.json"))
  with pytest.raises(CheckpointError, match="no config.json"):
    load_pretrained(path)


def test_unsupported_model_type(tiny_checkpoints, tmp_path):
  path = _copy(tiny_checkpoints["qwen3"], tmp_path)
  _edit_config(path, model_type="gpt2")
  with pytest.raises(CheckpointError, match="unsupported model_type 'gpt2'"):
    load_pretrained(path)


def test_missing_tensor_is_named(tiny_checkpoints, tmp_path):
  path = _copy(tiny_checkpoints["qwen2"], tmp_path)
  _edit_config(path, num_hidden_layers=3)  # config wants a layer the weights lack
  with pytest.raises(CheckpointError, match=r"tensor 'model\.layers\.2\..*' is missing"):
    load_pretrained(path)


def test_misshaped_tensor_is_named(tiny_checkpoints, tmp_path):
  path = _copy(tiny_checkpoints["llama"], tmp_path)
  _edit_config(path, intermediate_size=64)
  with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.(gate|up|down)_proj\.weight' has shape"):
    load_pretrained(path)


def test_unexpected_tensors_are_an_error(tiny_checkpoints, tmp_path):
  path = _copy(tiny_checkpoints["llama"], tmp_path)
  _edit_config(path, num_hidden_layers=1)
  with pytest.raises(CheckpointError, match=r"does not describe: model\.layers\.1\."):
    load_pretrained(path)


def test_unsupported_dtype(tiny_checkpoints):
  with pytest.raises(CheckpointError, match="dtype 'float16' is not supported"):
    load_pretrained(tiny_checkpoints["qwen3"], dtype=jnp.float16)


def test_float64_compute_is_a_reference_that_needs_x64(tiny_checkpoints):
  """float64 compute (the parity scripts' reference forward) is refused unless jax_enable_x64 is on, and with it
  on matches the float32 forward to float32 rounding."""
  with pytest.raises(CheckpointError, match="float64 needs jax_enable_x64"):
    load_pretrained(tiny_checkpoints["qwen3"], compute_dtype=jnp.float64)
  jax.config.update("jax_enable_x64", True)
  try:
    reference = load_pretrained(tiny_checkpoints["qwen3"], compute_dtype=jnp.float64)
    ids = jnp.asarray([[1, 5, 9, 3, 7]], jnp.int32)
    assert reference.embed_tokens.embedding.get_value().dtype == jnp.float32  # the stored weights stay float32
    np.testing.assert_allclose(np.asarray(reference(ids)), np.asarray(load_pretrained(tiny_checkpoints["qwen3"])(ids)),
                               atol=1e-4)
  finally:
    jax.config.update("jax_enable_x64", False)


def test_no_safetensors(tiny_checkpoints, tmp_path):
  path = _copy(tiny_checkpoints["qwen3"], tmp_path)
  os.remove(os.path.join(path, "model.safetensors"))
  with pytest.raises(CheckpointError, match="no \\*.safetensors"):
    load_pretrained(path)


def test_eos_from_generation_config(tiny_checkpoints, tmp_path):
  path = _copy(tiny_checkpoints["qwen3"], tmp_path)
  with open(os.path.join(path, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": [2, 7]}, f)
  assert read_hf_config(path).eos_token_id == (2, 7)


# ------------------------------------------------------------------------------- attention, scan and remat

def _padded_batch(seed=6):
  """3 rows of 13 tokens: row 0 left-padded by 5, row 1 by 12 (one real token), row 2 unpadded."""
  tokens = np.random.RandomState(seed).randint(3, checkpoints.VOCAB, (3, 13))
  valid = np.ones((3, 13), bool)
  valid[0, :5] = False
  valid[1, :12] = False
  return jnp.asarray(tokens), jnp.asarray(valid)


def _logits_and_grads(model, tokens, valid):
  """Jitted logits and d/dparams of a fixed random projection of the real positions' logits."""
  graphdef, state = nnx.split(model)
  weights = jnp.asarray(np.random.RandomState(7).randn(*tokens.shape, checkpoints.VOCAB), jnp.float32)

  def scalar(state):
    logits = nnx.merge(graphdef, state)(tokens, valid_BxT=valid)
    return jnp.sum(jnp.where(valid[..., None], logits * weights, 0.0)), logits

  (_, logits), grads = jax.jit(jax.value_and_grad(scalar, has_aux=True))(state)
  return np.asarray(logits), {layer_stack.dotted(p): np.asarray(v) for p, v in layer_stack.per_layer_flat(grads)}


def _assert_close(got, want, valid, logits_atol, grad_rtol):
  """Logits on real positions to `logits_atol`; each gradient tensor to `grad_rtol` times its largest entry."""
  (logits, grads), (want_logits, want_grads) = got, want
  valid = np.asarray(valid)
  assert np.isfinite(logits).all() and all(np.isfinite(g).all() for g in grads.values())
  np.testing.assert_allclose(logits[valid], want_logits[valid], atol=logits_atol, rtol=0)
  assert grads.keys() == want_grads.keys() and "layers.1.self_attn.q_proj.kernel" in grads
  for name, grad in grads.items():
    np.testing.assert_allclose(grad, want_grads[name], rtol=0, atol=grad_rtol * np.abs(want_grads[name]).max(),
                               err_msg=name)


# Float32 reassociation noise between two XLA programs (measured <= 3.2e-6 on logits of size ~5 and <= 1.7e-6
# of a gradient tensor's largest entry); a real bug (a wrong mask, head grouping or layer order) is >= 1e-2.
_FUSED_LOGITS_ATOL, _FUSED_GRAD_RTOL = 1e-5, 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES_FAST_ONE)
def test_fused_attention_matches_reference(tiny_checkpoints, family):
  """jax.nn.dot_product_attention (xla; auto, which is xla today, forward only) == the einsum reference on real
  positions, with GQA and left padding; no NaN in logits or gradients, though padding queries have no real key."""
  path = tiny_checkpoints[family]
  tokens, valid = _padded_batch()
  reference = _logits_and_grads(load_pretrained(path, attention="reference", scan_layers=False), tokens, valid)
  xla = _logits_and_grads(load_pretrained(path, attention="xla", scan_layers=False), tokens, valid)
  _assert_close(xla, reference, valid, _FUSED_LOGITS_ATOL, _FUSED_GRAD_RTOL)
  auto = np.asarray(load_pretrained(path, attention="auto", scan_layers=False)(tokens, valid_BxT=valid))
  np.testing.assert_allclose(auto[np.asarray(valid)], reference[0][np.asarray(valid)], atol=_FUSED_LOGITS_ATOL)


@pytest.mark.parametrize("remat", ["none", pytest.param("full", marks=pytest.mark.slow),
                                   pytest.param("dots_saveable", marks=pytest.mark.slow)])
def test_scanned_layers_match_unrolled(tiny_checkpoints, remat):
  """The scanned layer stack gives the unrolled loop's logits and per-layer parameter gradients, under each
  remat: exactly with the einsum attention (1e-6 is the bar). Between remat settings, and between the two
  stacks with the default xla attention, XLA fuses the programs differently: float32 noise only."""
  path = tiny_checkpoints["qwen3"]
  tokens, valid = _padded_batch()
  run = lambda **options: _logits_and_grads(load_pretrained(path, **options), tokens, valid)
  unrolled = run(attention="reference", scan_layers=False, remat=remat)
  _assert_close(run(attention="reference", scan_layers=True, remat=remat), unrolled, valid, 1e-6, 1e-6)
  if remat == "none":  # the default options against the unrolled loop
    _assert_close(run(scan_layers=True), run(scan_layers=False), valid, _FUSED_LOGITS_ATOL, _FUSED_GRAD_RTOL)
  else:  # rematerialization recomputes the same values
    no_remat = run(attention="reference", scan_layers=False)
    _assert_close(unrolled, no_remat, valid, _FUSED_LOGITS_ATOL, _FUSED_GRAD_RTOL)


def test_scan_only_when_layers_are_stacked(tiny_checkpoints):
  """A stacked state is scanned; per-layer values (here one bf16 kernel, as a per-layer precision recipe makes)
  run the layers one by one with the same numbers as per-layer storage."""
  model = load_pretrained(tiny_checkpoints["llama"])
  tokens, valid = _padded_batch()
  graphdef, state = nnx.split(model)
  jaxpr = lambda state: str(jax.make_jaxpr(lambda s: nnx.merge(graphdef, s)(tokens, valid_BxT=valid))(state))
  assert "scan" in jaxpr(state)
  split = layer_stack.unstack(state)
  kernel = split["layers"]["mlp"]["up_proj"]["kernel"]
  values = list(kernel.get_value())
  values[1] = values[1].astype(jnp.bfloat16)
  kernel.set_value(layer_stack.PerLayer(values))
  assert "scan" not in jaxpr(split)
  unrolled = load_pretrained(tiny_checkpoints["llama"], scan_layers=False)
  unrolled.layers[1].mlp.up_proj.kernel.set_value(values[1])
  np.testing.assert_array_equal(np.asarray(nnx.merge(graphdef, split)(tokens, valid_BxT=valid)),
                                np.asarray(unrolled(tokens, valid_BxT=valid)))


def test_execution_options_are_static_and_checked(tiny_checkpoints):
  model = load_pretrained(tiny_checkpoints["qwen2"], attention="auto", remat="full", scan_layers=False)
  assert (model.attention, model.remat, model.scan_layers) == ("auto", "full", False)
  top_level = {path[0] for path, _ in nnx.to_flat_state(nnx.state(model))}
  assert top_level == {"embed_tokens", "layers", "norm", "lm_head"}  # the options are no state leaves
  assert nnx.graphdef(model) != nnx.graphdef(load_pretrained(tiny_checkpoints["qwen2"]))
  with pytest.raises(ValueError, match="attention='flash' is not one of reference, xla, cudnn, auto"):
    load_pretrained(tiny_checkpoints["qwen2"], attention="flash")
  with pytest.raises(ValueError, match="remat='some' is not one of none, full, dots_saveable"):
    load_pretrained(tiny_checkpoints["qwen2"], remat="some")
  with pytest.raises(ValueError, match="attention='cudnn' needs a bfloat16 or float16 compute dtype"):
    load_pretrained(tiny_checkpoints["qwen2"], attention="cudnn")


@pytest.mark.parametrize("shape,bias", [((2, 5, 16, 24), True), ((8, 104, 576, 1536), False)],
                         ids=["tiny_with_bias", "smollm2"])
def test_mlp_on_flattened_tokens_matches_the_old_path(shape, bias):
  """The MLP runs its matmuls on flattened tokens [B*T, D] (a faster backward on XLA's CPU backend). The old path,
  einsums over [B, T, D], gives the same outputs and gradients up to float32 reassociation (1e-5 of each tensor's
  largest entry; a wrong reshape or token order is O(1)): two SwiGLU blocks under scan, at a tiny shape (with llama's
  MLP biases) and at the real pair's (batch 8 x 104 tokens, 576 -> 1536). How XLA fuses the programs decides whether
  they are bit-identical: in the real-pair and pair1 training runs they are (launch/bench/same_metrics.py compares
  every metric of their runs across revisions)."""
  import types
  from opd_jax.models.decoder import MLP
  B, T, D, F = shape
  config = types.SimpleNamespace(hidden_size=D, intermediate_size=F, mlp_bias=bias, hidden_act="silu")
  graphdef, params = nnx.split(layer_stack.stack_modules(
      [MLP(config, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(i)) for i in range(2)]))
  x_BxTxD = jax.random.normal(jax.random.PRNGKey(1), (B, T, D))

  def old_mlp(mlp, x_BxTxD):
    def mm(a_BxTxD, linear):
      y_BxTxF = jnp.einsum("btd,df->btf", a_BxTxD, linear.kernel.get_value())
      return y_BxTxF if linear.bias is None else y_BxTxF + linear.bias.get_value()[None, None, :]
    return mm(jax.nn.silu(mm(x_BxTxD, mlp.gate_proj)) * mm(x_BxTxD, mlp.up_proj), mlp.down_proj)

  def grads(apply):
    def loss(params, x_BxTxD):
      def body(x_BxTxD, layer_params):
        return x_BxTxD + 0.1 * apply(nnx.merge(graphdef, layer_params), x_BxTxD), None
      y_BxTxD = jax.lax.scan(body, x_BxTxD, params)[0]
      return jnp.sum(jnp.sin(y_BxTxD)), y_BxTxD
    return jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(params, x_BxTxD)
  (old_grads, old_out), (new_grads, new_out) = grads(old_mlp), grads(lambda mlp, x: mlp(x))
  np.testing.assert_allclose(new_out, old_out, rtol=0, atol=_FUSED_GRAD_RTOL * np.abs(old_out).max())
  for old, new in zip(jax.tree.leaves(old_grads), jax.tree.leaves(new_grads), strict=True):
    np.testing.assert_allclose(new, old, rtol=0, atol=_FUSED_GRAD_RTOL * np.abs(old).max())
