"""One decoder for the Qwen3 / Llama 3 / Qwen2 families (GQA, RoPE, RMSNorm, SwiGLU), in Flax NNX.

Legend: B batch, T time (queries), S key slots (T without a cache, the cache length with one),
D model width, N query heads, K kv heads, G = N / K query heads per kv head, H head dim,
F MLP width, V vocab.

Padding: `valid_BxT` marks real tokens. Positions default to the running count of real tokens, so
left-padded prompts get RoPE positions 0, 1, ... from their first real token, exactly as HF does with
`position_ids = attention_mask.cumsum(-1) - 1`. A query attends to keys that are real and not in its
future. Rows with no real key (pure padding) get uniform attention instead of NaN; their outputs are
meaningless and every caller masks them.

KV cache: any pytree object with `.valid_BxS`, `.layers` (one per layer, each with `write(k, v, index)`
-> new layer cache and `read(dtype)` -> (k_BxKxHxS, v_BxKxSxH)) and `replace(layers=..., valid_BxS=...)`.
`opd_jax.rollout.kv_cache` provides bf16 / int8 / fp8 caches; the model only calls these methods.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from opd_jax.models.config import ModelConfig, rope_inv_freq
from opd_jax.models.linear import Embed, Linear

_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)


class RMSNorm(nnx.Module):
  """x / rms(x) * weight, computed in float32 (as HF does), returned in the input dtype."""

  def __init__(self, features: int, eps: float, param_dtype):
    self.weight = nnx.Param(jnp.ones((features,), param_dtype))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    weight = self.weight.get_value().astype(x.dtype).reshape((1,) * (x.ndim - 1) + (-1,))
    return weight * x32.astype(x.dtype)


def apply_rope(x_BxTxNxH: jax.Array, cos_BxTxH: jax.Array, sin_BxTxH: jax.Array) -> jax.Array:
  """HF's rotate-half RoPE: x * cos + rotate_half(x) * sin."""
  half = x_BxTxNxH.shape[-1] // 2
  rotated = jnp.concatenate([-x_BxTxNxH[..., half:], x_BxTxNxH[..., :half]], axis=-1)
  cos, sin = cos_BxTxH[:, :, None, :], sin_BxTxH[:, :, None, :]
  return (x_BxTxNxH * cos + rotated * sin).astype(x_BxTxNxH.dtype)


def _attend(q_BxTxKxGxH, k, v, mask_BxTxS, specs: tuple[str, str], dtype) -> jax.Array:
  """softmax(q k^T / sqrt(H)) v over the unmasked keys; `specs` are the einsum layouts of k and v. A single
  query (T = 1, decode) drops its time axis from the matmuls: with it, XLA:CPU leaves the matmul library for
  a generic dot several times slower."""
  H = q_BxTxKxGxH.shape[-1]
  k_spec, v_spec = specs
  if q_BxTxKxGxH.shape[1] == 1:
    q, q_spec, s_spec, mask = q_BxTxKxGxH[:, 0], "bkgh", "bkgs", mask_BxTxS[:, None]
  else:
    q, q_spec, s_spec, mask = q_BxTxKxGxH, "btkgh", "bkgts", mask_BxTxS[:, None, None]
  scores = jnp.einsum(f"{q_spec},{k_spec}->{s_spec}", q, k.astype(dtype),
                      preferred_element_type=jnp.float32) * (H ** -0.5)
  probs = jax.nn.softmax(jnp.where(mask, scores, _MASKED), axis=-1).astype(dtype)
  out = jnp.einsum(f"{s_spec},{v_spec}->{q_spec}", probs, v.astype(dtype))
  return out[:, None] if q_BxTxKxGxH.shape[1] == 1 else out  # [B, T, K, G, H]


class Attention(nnx.Module):

  def __init__(self, config: ModelConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    c, kw = config, dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.q_proj = Linear(c.hidden_size, c.num_attention_heads * c.head_dim, use_bias=c.qkv_bias, **kw)
    self.k_proj = Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, use_bias=c.qkv_bias, **kw)
    self.v_proj = Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, use_bias=c.qkv_bias, **kw)
    self.o_proj = Linear(c.num_attention_heads * c.head_dim, c.hidden_size, use_bias=c.o_bias, **kw)
    if c.qk_norm:
      self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, param_dtype)
      self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, param_dtype)
    else:
      self.q_norm = self.k_norm = None
    self.num_heads, self.num_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    self.dtype = dtype

  def __call__(self, x_BxTxD, cos_BxTxH, sin_BxTxH, mask_BxTxS, layer_cache=None, cache_index=None):
    B, T, _ = x_BxTxD.shape
    K, H = self.num_kv_heads, self.head_dim
    G = self.num_heads // K
    q_BxTxNxH = self.q_proj(x_BxTxD).reshape(B, T, K * G, H)
    k_BxTxKxH = self.k_proj(x_BxTxD).reshape(B, T, K, H)
    v_BxTxKxH = self.v_proj(x_BxTxD).reshape(B, T, K, H)
    if self.q_norm is not None:
      q_BxTxNxH, k_BxTxKxH = self.q_norm(q_BxTxNxH), self.k_norm(k_BxTxKxH)
    q_BxTxNxH = apply_rope(q_BxTxNxH, cos_BxTxH, sin_BxTxH)
    k_BxTxKxH = apply_rope(k_BxTxKxH, cos_BxTxH, sin_BxTxH)
    q_BxTxKxGxH = q_BxTxNxH.reshape(B, T, K, G, H)
    if layer_cache is None:
      specs = ("bskh", "bskh")  # keys and values as computed: [B, S=T, K, H]
      k, v = k_BxTxKxH, v_BxTxKxH
    else:
      layer_cache = layer_cache.write(k_BxTxKxH, v_BxTxKxH, cache_index)
      specs = ("bkhs", "bksh")  # see rollout.kv_cache: k_BxKxHxS, v_BxKxSxH
      k, v = layer_cache.read(self.dtype)
    out_BxTxKxGxH = _attend(q_BxTxKxGxH, k, v, mask_BxTxS, specs, self.dtype)
    return self.o_proj(out_BxTxKxGxH.reshape(B, T, K * G * H)), layer_cache


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""

  def __init__(self, config: ModelConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    c, kw = config, dict(use_bias=config.mlp_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.gate_proj = Linear(c.hidden_size, c.intermediate_size, **kw)
    self.up_proj = Linear(c.hidden_size, c.intermediate_size, **kw)
    self.down_proj = Linear(c.intermediate_size, c.hidden_size, **kw)

  def __call__(self, x_BxTxD):
    return self.down_proj(jax.nn.silu(self.gate_proj(x_BxTxD)) * self.up_proj(x_BxTxD))


class DecoderLayer(nnx.Module):

  def __init__(self, config: ModelConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, param_dtype)
    self.self_attn = Attention(config, **kw)
    self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, param_dtype)
    self.mlp = MLP(config, **kw)

  def __call__(self, x_BxTxD, cos_BxTxH, sin_BxTxH, mask_BxTxS, layer_cache=None, cache_index=None):
    attn_BxTxD, layer_cache = self.self_attn(self.input_layernorm(x_BxTxD), cos_BxTxH, sin_BxTxH,
                                             mask_BxTxS, layer_cache, cache_index)
    x_BxTxD = x_BxTxD + attn_BxTxD
    x_BxTxD = x_BxTxD + self.mlp(self.post_attention_layernorm(x_BxTxD))
    return x_BxTxD, layer_cache


class Decoder(nnx.Module):
  """Causal LM. `m(tokens_BxT)` -> float32 logits [B, T, V]; with a cache, -> (logits, new cache)."""

  def __init__(self, config: ModelConfig, *, dtype=jnp.float32, param_dtype=jnp.float32,
               rngs: nnx.Rngs | None = None):
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.config = config
    self.dtype = dtype
    self.embed_tokens = Embed(config.vocab_size, config.hidden_size, **kw)
    self.layers = nnx.List([DecoderLayer(config, **kw) for _ in range(config.num_hidden_layers)])
    self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, param_dtype)
    self.lm_head = None if config.tie_word_embeddings else Linear(
        config.hidden_size, config.vocab_size, use_bias=False, **kw)

  def __call__(self, tokens_BxT, positions_BxT=None, valid_BxT=None, cache=None, cache_index=None,
               logits_span: tuple[int, int] | None = None):
    """logits_span=(start, stop): compute logits only for those positions (saves the [B, T, V] head when only
    a few positions are needed, e.g. the last prompt token in prefill or the response in scoring)."""
    B, T = tokens_BxT.shape
    valid_BxT = jnp.ones((B, T), bool) if valid_BxT is None else valid_BxT.astype(bool)
    if positions_BxT is None:
      if cache is not None:
        raise ValueError("decoding with a cache needs explicit positions_BxT")
      positions_BxT = jnp.maximum(jnp.cumsum(valid_BxT, axis=1) - 1, 0)
    if cache is None:
      slots_T = jnp.arange(T)
      mask_BxTxS = (slots_T[None, :, None] >= slots_T[None, None, :]) & valid_BxT[:, None, :]
    else:
      valid_BxS = jax.lax.dynamic_update_slice(cache.valid_BxS, valid_BxT, (0, cache_index))
      query_slots_T = cache_index + jnp.arange(T)
      key_slots_S = jnp.arange(valid_BxS.shape[1])
      mask_BxTxS = (query_slots_T[None, :, None] >= key_slots_S[None, None, :]) & valid_BxS[:, None, :]
    freqs_BxTxH2 = positions_BxT[..., None].astype(jnp.float32) * jnp.asarray(
        rope_inv_freq(self.config), jnp.float32)[None, None, :]
    emb_BxTxH = jnp.concatenate([freqs_BxTxH2, freqs_BxTxH2], axis=-1)
    cos_BxTxH, sin_BxTxH = jnp.cos(emb_BxTxH).astype(self.dtype), jnp.sin(emb_BxTxH).astype(self.dtype)

    x_BxTxD = self.embed_tokens(tokens_BxT)
    new_layers = []
    for i, layer in enumerate(self.layers):
      layer_cache = None if cache is None else cache.layers[i]
      x_BxTxD, layer_cache = layer(x_BxTxD, cos_BxTxH, sin_BxTxH, mask_BxTxS, layer_cache, cache_index)
      new_layers.append(layer_cache)
    if logits_span is not None:
      x_BxTxD = x_BxTxD[:, logits_span[0]:logits_span[1]]
    x_BxTxD = self.norm(x_BxTxD)
    head = self.embed_tokens.attend if self.lm_head is None else self.lm_head
    logits_BxTxV = head(x_BxTxD).astype(jnp.float32)
    if cache is None:
      return logits_BxTxV
    return logits_BxTxV, cache.replace(layers=new_layers, valid_BxS=valid_BxS)
