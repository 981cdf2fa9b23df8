"""One decoder for the Qwen3 / Llama 3 / Qwen2 / Gemma 3 families (GQA, RoPE, RMSNorm, SwiGLU / GeGLU), in Flax NNX.

Legend: B batch, T time (queries), S key slots (T without a cache, the cache length with one),
D model width, N query heads, K kv heads, G = N / K query heads per kv head, H head dim,
F MLP width, V vocab.

Padding: `valid_BxT` marks real tokens. Positions default to the running count of real tokens, so
left-padded prompts get RoPE positions 0, 1, ... from their first real token, exactly as HF does with
`position_ids = attention_mask.cumsum(-1) - 1`. A query attends to keys that are real and not in its
future (and, in Gemma 3's sliding layers, not `sliding_window` or more slots behind it: see
opd_jax.models.attention_kinds, which also gives each layer kind its RoPE base). A query with no real key (pure left padding) gets uniform attention (`_attend`) or attends to itself
(fused kernels) instead of NaN; its output is meaningless and every caller masks it.

Attention (`Decoder(attention=...)`, no-cache path only: training, teacher scoring, full-sequence forward):
  reference  `_attend`, einsum softmax(q k^T / sqrt(H)) v in float32 scores
  xla        jax.nn.dot_product_attention(implementation="xla"): the same math, jax's own kernel
  cudnn      implementation="cudnn": cuDNN flash attention (GPU only; compute dtype bf16 or fp16)
  auto       implementation=None: jax picks (XLA today)
All take the general boolean mask [B, T, S] (causal & real keys) and GQA (N = K * G query heads share kv
head n // G). The fused kernels get one extra mask bit: a query with no real key attends to itself, so no
kernel can produce NaN there (XLA's own masking already avoids it; cuDNN is not tested here). With a KV
cache (decode, T = 1, and the sampler's prefill) the model always uses `_attend`: it reads the cache
layouts k_BxKxHxS / v_BxKxSxH directly and has a CPU-tuned T = 1 path.

Layer storage (opd_jax.models.layer_stack): with `scan_layers` the L layers are stored stacked, one
DecoderLayer whose every parameter is [L, ...] (`layers.self_attn.q_proj.kernel`), and one layer body runs
under `jax.lax.scan` over the stack as stored (no copy of the weights per forward; gradients come back [L, ...]),
so the traced program does not grow with depth: full-sequence forwards, and decoding with a KV cache alike
(the cache rides in the scan's carry and each layer writes its new tokens in place). Without `scan_layers`
each layer is its own module (`layers.3.self_attn.q_proj.kernel`) and a Python loop runs them, as it does a
stacked state whose values are `PerLayer` (a precision recipe that treats layers differently). Compile times
of both, side by side: launch/bench/compile.py.
`remat` wraps the layer body in jax.checkpoint: "full" saves only the layer's inputs
(checkpoint_policies.nothing_saveable); "dots_saveable" also saves matmul outputs without batch dims
(checkpoint_policies.dots_with_no_batch_dims_saveable: the weight projections; the attention score and
value matmuls, which batch over B and heads, are recomputed).

KV cache: any pytree object with `begin(valid_BxT, index)` -> (cache, mask_BxTxS: which key slots each new token
attends to), `query_slots_BxT(T, index)` -> each new token's slot (what a sliding window counts back from; key
slot s is s), `write(layer, k, v, index)` -> new cache, `read(layer, dtype)` -> (k_BxKxHxS, v_BxKxSxH) (`layer`
an int or a traced index) and `end()` -> the cache after every layer has written. `opd_jax.rollout.kv_cache`
provides the contiguous caches (bf16 / int8 / fp8 / int4; `index` is the first slot the T new tokens take in every
row) and `opd_jax.rollout.paged_cache` the paged one (each row continues at its own length; `index` unused); the
model only calls these methods.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from opd_jax.errors import InputError
from opd_jax.models import attention_kinds, layer_stack
from opd_jax.models import sharding as shard_lib
from opd_jax.models.config import ModelConfig
from opd_jax.models.linear import Embed, Linear

_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)
ATTENTION_CHOICES = ("reference", "xla", "cudnn", "auto")
_DPA_IMPLEMENTATION = {"xla": "xla", "cudnn": "cudnn", "auto": None}  # jax.nn.dot_product_attention's names
REMAT_CHOICES = ("none", "full", "dots_saveable")
_REMAT_POLICY = {"full": jax.checkpoint_policies.nothing_saveable,
                 "dots_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


class RMSNorm(nnx.Module):
  """x / rms(x) * weight, computed in float32 (as HF does), returned in the input dtype. unit_offset (Gemma):
  x / rms(x) * (1 + weight), all in float32 before the cast back (HF's Gemma3RMSNorm); the weight starts at 0."""

  def __init__(self, features: int, eps: float, param_dtype, unit_offset: bool = False):
    self.weight = nnx.Param((jnp.zeros if unit_offset else jnp.ones)((features,), param_dtype))
    self.eps, self.unit_offset = eps, unit_offset

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    shape = (1,) * (x.ndim - 1) + (-1,)
    if self.unit_offset:
      return (x32 * (1.0 + self.weight.get_value().astype(jnp.float32).reshape(shape))).astype(x.dtype)
    weight = self.weight.get_value().astype(x.dtype).reshape(shape)
    return weight * x32.astype(x.dtype)


def apply_rope(x_BxTxNxH: jax.Array, cos_BxTxH: jax.Array, sin_BxTxH: jax.Array) -> jax.Array:
  """HF's rotate-half RoPE: x * cos + rotate_half(x) * sin."""
  half = x_BxTxNxH.shape[-1] // 2
  rotated = jnp.concatenate([-x_BxTxNxH[..., half:], x_BxTxNxH[..., :half]], axis=-1)
  cos, sin = cos_BxTxH[:, :, None, :], sin_BxTxH[:, :, None, :]
  return (x_BxTxNxH * cos + rotated * sin).astype(x_BxTxNxH.dtype)


def _attend(q_BxTxKxGxH, k, v, mask_BxTxS, specs: tuple[str, str], dtype, scale: float) -> jax.Array:
  """softmax(q k^T * scale) v over the unmasked keys (scale: 1 / sqrt(H), or Gemma's query_pre_attn_scalar ** -0.5);
  `specs` are the einsum layouts of k and v. A single
  query (T = 1, decode) drops its time axis from the matmuls: with it, XLA:CPU leaves the matmul library for
  a generic dot several times slower."""
  k_spec, v_spec = specs
  if q_BxTxKxGxH.shape[1] == 1:
    q, q_spec, s_spec, mask = q_BxTxKxGxH[:, 0], "bkgh", "bkgs", mask_BxTxS[:, None]
  else:
    q, q_spec, s_spec, mask = q_BxTxKxGxH, "btkgh", "bkgts", mask_BxTxS[:, None, None]
  scores = jnp.einsum(f"{q_spec},{k_spec}->{s_spec}", q, k.astype(dtype),
                      preferred_element_type=jnp.float32) * scale
  probs = jax.nn.softmax(jnp.where(mask, scores, _MASKED), axis=-1).astype(dtype)
  out = jnp.einsum(f"{s_spec},{v_spec}->{q_spec}", probs, v.astype(dtype))
  return out[:, None] if q_BxTxKxGxH.shape[1] == 1 else out  # [B, T, K, G, H]


def _attend_fused(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, mask_BxTxS, attention: str, scale: float) -> jax.Array:
  """softmax(q k^T * scale) v through jax.nn.dot_product_attention; query head n uses kv head n // G (GQA),
  the same grouping as `_attend`'s [K, G] split. Scores and softmax are float32 in every implementation."""
  return jax.nn.dot_product_attention(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, mask=mask_BxTxS[:, None], scale=scale,
                                      implementation=_DPA_IMPLEMENTATION[attention])  # [B, T, N, H]


class Attention(nnx.Module):

  def __init__(self, config: ModelConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    c, kw = config, dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.q_proj = Linear(c.hidden_size, c.num_attention_heads * c.head_dim, use_bias=c.qkv_bias, **kw)
    self.k_proj = Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, use_bias=c.qkv_bias, **kw)
    self.v_proj = Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, use_bias=c.qkv_bias, **kw)
    self.o_proj = Linear(c.num_attention_heads * c.head_dim, c.hidden_size, use_bias=c.o_bias, **kw)
    if c.qk_norm:
      self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, param_dtype, c.gemma)
      self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, param_dtype, c.gemma)
    else:
      self.q_norm = self.k_norm = None
    self.num_heads, self.num_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    self.dtype, self.scale = dtype, c.query_scale

  def __call__(self, x_BxTxD, cos_BxTxH, sin_BxTxH, mask_BxTxS, cache=None, layer_index=None, cache_index=None,
               attention: str = "reference"):
    """With a cache, writes this layer's (`layer_index`) keys and values at `cache_index` and attends over the
    cache; returns (out, cache). attention: see ATTENTION_CHOICES; used only without a cache (a cache always goes
    through `_attend`)."""
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
    if cache is not None:
      cache = cache.write(layer_index, k_BxTxKxH, v_BxTxKxH, cache_index)
      k_BxKxHxS, v_BxKxSxH = cache.read(layer_index, self.dtype)  # see rollout.kv_cache
      out = _attend(q_BxTxNxH.reshape(B, T, K, G, H), k_BxKxHxS, v_BxKxSxH, mask_BxTxS, ("bkhs", "bksh"),
                    self.dtype, self.scale)
    elif attention == "reference":  # keys and values as computed: [B, S=T, K, H]
      out = _attend(q_BxTxNxH.reshape(B, T, K, G, H), k_BxTxKxH, v_BxTxKxH, mask_BxTxS, ("bskh", "bskh"),
                    self.dtype, self.scale)
    else:
      out = _attend_fused(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, mask_BxTxS, attention, self.scale)
    return self.o_proj(out.reshape(B, T, K * G * H)), cache  # out: [B, T, K, G, H] or [B, T, N, H]


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x)); GeGLU (hidden_act gelu_tanh, Gemma): gelu_tanh in place of silu."""

  def __init__(self, config: ModelConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    c, kw = config, dict(use_bias=config.mlp_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.gate_proj = Linear(c.hidden_size, c.intermediate_size, **kw)
    self.up_proj = Linear(c.hidden_size, c.intermediate_size, **kw)
    self.down_proj = Linear(c.intermediate_size, c.hidden_size, **kw)
    self.gelu = c.hidden_act == "gelu_tanh"

  def __call__(self, x_BxTxD):
    # On flattened tokens: each weight gradient then contracts one token dimension, not two (b, t). With two, XLA's
    # CPU backend transposes the activation gradients inside the fusions that produce them, reading strided: the
    # real pair's layers forward + backward took 3.06 s, against 2.12 s now (docs/benchmarks.md), and every metric
    # of launch/bench/same_metrics.py's runs stayed the same (tests/test_models.py bounds the difference
    # elsewhere). The attention projections gain nothing from it and round differently, so they keep [B, T, D].
    x_NxD = x_BxTxD.reshape(-1, x_BxTxD.shape[-1])
    gate_NxF = self.gate_proj(x_NxD)
    act_NxF = jax.nn.gelu(gate_NxF, approximate=True) if self.gelu else jax.nn.silu(gate_NxF)
    return self.down_proj(act_NxF * self.up_proj(x_NxD)).reshape(x_BxTxD.shape)


class DecoderLayer(nnx.Module):

  def __init__(self, config: ModelConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
    kw, norm = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs), (config.rms_norm_eps, param_dtype, config.gemma)
    self.input_layernorm = RMSNorm(config.hidden_size, *norm)
    self.self_attn = Attention(config, **kw)
    self.post_attention_layernorm = RMSNorm(config.hidden_size, *norm)
    if config.gemma:  # post_attention_layernorm normalizes the attention output; two more norms around the MLP
      self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, *norm)
      self.post_feedforward_layernorm = RMSNorm(config.hidden_size, *norm)
    else:
      self.pre_feedforward_layernorm = self.post_feedforward_layernorm = None
    self.mlp = MLP(config, **kw)

  def __call__(self, x_BxTxD, cos_BxTxH, sin_BxTxH, mask_BxTxS, cache=None, layer_index=None, cache_index=None,
               attention: str = "reference"):
    attn_BxTxD, cache = self.self_attn(self.input_layernorm(x_BxTxD), cos_BxTxH, sin_BxTxH, mask_BxTxS, cache,
                                       layer_index, cache_index, attention)
    if self.pre_feedforward_layernorm is not None:  # Gemma: norms on both sides of attention and the MLP
      x_BxTxD = x_BxTxD + self.post_attention_layernorm(attn_BxTxD)
      return x_BxTxD + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x_BxTxD))), cache
    x_BxTxD = x_BxTxD + attn_BxTxD
    x_BxTxD = x_BxTxD + self.mlp(self.post_attention_layernorm(x_BxTxD))
    return x_BxTxD, cache


def _layer_step(graphdef, attention: str, remat: str, scanned: bool, x_BxTxD, layer_state, cos_BxTxH, sin_BxTxH,
                mask_BxTxS):
  """One decoder layer (no cache) as a pure function of its nnx state: what scan and jax.checkpoint need.
  Under scan, jax.checkpoint needs no CSE barrier (prevent_cse=False, as jax recommends there)."""
  def step(x_BxTxD, layer_state, cos_BxTxH, sin_BxTxH, mask_BxTxS):
    layer = nnx.merge(graphdef, layer_state)
    return layer(x_BxTxD, cos_BxTxH, sin_BxTxH, mask_BxTxS, attention=attention)[0]
  if remat != "none":
    step = jax.checkpoint(step, policy=_REMAT_POLICY[remat], prevent_cse=not scanned)
  return step(x_BxTxD, layer_state, cos_BxTxH, sin_BxTxH, mask_BxTxS)


@functools.lru_cache(maxsize=64)
def _scanned_layers(graphdef, attention: str, remat: str):
  """jit(scan one layer body over the stacked [L, ...] layer state, as stored). Cached per static layer
  description, so an eager call does not retrace the scan (inside an outer jit it is inlined)."""
  step = functools.partial(_layer_step, graphdef, attention, remat, True)

  def run(x_BxTxD, stacked_state, per_kind, kind_L, keep_L):
    """per_kind, kind_L: attention_kinds.layer_inputs (kind_L None: one kind); keep_L: None or bool [L]."""
    def body(x_BxTxD, xs):
      layer_state, kind, keep = xs
      y_BxTxD = step(x_BxTxD, layer_state, *attention_kinds.pick(per_kind, kind))
      return (y_BxTxD if keep is None else jnp.where(keep, y_BxTxD, x_BxTxD)), None
    return jax.lax.scan(body, x_BxTxD, (stacked_state, kind_L, keep_L))[0]

  return jax.jit(run)


class Decoder(nnx.Module):
  """Causal LM. `m(tokens_BxT)` -> float32 logits [B, T, V]; with a cache, -> (logits, new cache).

  attention: ATTENTION_CHOICES (module docstring); scan_layers: store the layers stacked and scan them (module
  docstring) instead of one module per layer in a loop;
  remat: REMAT_CHOICES, jax.checkpoint of each layer body. All three are static (part of the graphdef)
  and act only without a cache.
  """

  def __init__(self, config: ModelConfig, *, dtype=jnp.float32, param_dtype=jnp.float32,
               rngs: nnx.Rngs | None = None, attention: str = "xla", scan_layers: bool = True,
               remat: str = "none"):
    if attention not in ATTENTION_CHOICES:
      raise InputError(f"attention={attention!r} is not one of {', '.join(ATTENTION_CHOICES)} (reference: "
                       "einsum; xla / cudnn / auto: jax.nn.dot_product_attention implementations)")
    if attention == "cudnn" and jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
      raise InputError(f"attention='cudnn' needs a bfloat16 or float16 compute dtype, got "
                       f"{jnp.dtype(dtype).name}; use attention='xla' for float32")
    if remat not in REMAT_CHOICES:
      raise InputError(f"remat={remat!r} is not one of {', '.join(REMAT_CHOICES)}")
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.config = config
    self.dtype = dtype
    self.attention, self.scan_layers, self.remat = attention, bool(scan_layers), remat
    self.embed_tokens = Embed(config.vocab_size, config.hidden_size, scale=config.embed_scale, **kw)
    layers = [DecoderLayer(config, **kw) for _ in range(config.num_hidden_layers)]  # one init for either storage
    self.layers = layer_stack.stack_modules(layers) if self.scan_layers else nnx.List(layers)
    self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, param_dtype, config.gemma)
    self.lm_head = None if config.tie_word_embeddings else Linear(
        config.hidden_size, config.vocab_size, use_bias=False, **kw)

  def __call__(self, tokens_BxT, positions_BxT=None, valid_BxT=None, cache=None, cache_index=None,
               logits_span: tuple[int, int] | None = None):
    """logits_span=(start, stop): compute logits only for those positions (saves the [B, T, V] head when only
    a few positions are needed, e.g. the last prompt token in prefill)."""
    out = self.hidden_states(tokens_BxT, positions_BxT, valid_BxT, cache, cache_index, logits_span)
    if cache is None:
      return self.logits(out)
    hidden_BxTxD, cache = out
    return self.logits(hidden_BxTxD), cache

  def logits(self, hidden_BxTxD: jax.Array) -> jax.Array:
    """The LM head on final (normed) hidden states: float32 logits [B, T, V], accumulated in float32 whatever
    the compute dtype, so bf16 rounding of logits puts no floor under sampler-learner mismatch."""
    head = self.embed_tokens.attend if self.lm_head is None else self.lm_head
    return shard_lib.constrain_batch(head(shard_lib.constrain_batch(hidden_BxTxD), out_dtype=jnp.float32), "tensor")

  def hidden_states(self, tokens_BxT, positions_BxT=None, valid_BxT=None, cache=None, cache_index=None,
                    span: tuple[int, int] | None = None, layer_keep_L: jax.Array | None = None):
    """Final normed hidden states [B, T, D] in the compute dtype (only positions span=(start, stop) when
    given); with a cache, -> (hidden, new cache). Callers that need logits over many positions apply
    `logits` chunk by chunk (opd_jax.objectives.chunked) instead of materializing [B, T, V].

    layer_keep_L: optional bool [L] (no cache only); a layer marked False passes its input through unchanged,
    as if it were removed from the model (layer-pruning importance, one compiled program for every subset)."""
    B, T = tokens_BxT.shape
    valid_BxT = jnp.ones((B, T), bool) if valid_BxT is None else valid_BxT.astype(bool)
    if positions_BxT is None:
      if cache is not None:
        raise InputError("decoding with a cache needs explicit positions_BxT")
      positions_BxT = jnp.maximum(jnp.cumsum(valid_BxT, axis=1) - 1, 0)
    if cache is None:
      slots_T = jnp.arange(T)
      mask_BxTxS = (slots_T[None, :, None] >= slots_T[None, None, :]) & valid_BxT[:, None, :]
      query_BxT = lambda: jnp.broadcast_to(slots_T[None], (B, T))
    else:
      cache, mask_BxTxS = cache.begin(valid_BxT, cache_index)
      query_BxT = functools.partial(cache.query_slots_BxT, T, cache_index)
    per_kind, kind_L = attention_kinds.layer_inputs(self.config, positions_BxT, mask_BxTxS, query_BxT, self.dtype)

    x_BxTxD = self.embed_tokens(tokens_BxT)
    if cache is None:
      x_BxTxD = self._run_layers(x_BxTxD, per_kind, kind_L, layer_keep_L)
    else:
      if layer_keep_L is not None:
        raise InputError("layer_keep_L applies without a cache only")
      x_BxTxD, cache = self._run_layers_cached(x_BxTxD, per_kind, kind_L, cache, cache_index)
      cache = cache.end()
    if span is not None:
      x_BxTxD = x_BxTxD[:, span[0]:span[1]]
    x_BxTxD = self.norm(x_BxTxD)
    if cache is None:
      return x_BxTxD
    return x_BxTxD, cache

  def _layer_states(self):
    """("scan", graphdef of a layer, the stacked [L, ...] state) or ("loop", graphdefs, per-layer states)."""
    if isinstance(self.layers, nnx.List):
      graphdefs, states = zip(*(nnx.split(layer) for layer in self.layers))
      return "loop", list(graphdefs), list(states)
    graphdef, state = nnx.split(self.layers)
    how, states = layer_stack.layer_states(state)
    return how, (graphdef if how == "scan" else [graphdef] * len(states)), states

  def _run_layers(self, x_BxTxD, per_kind, kind_L, keep_L=None):
    """x <- layer_l(x) for l = 0 .. L-1 (where keep_L[l], when given) without a cache: one scanned body over the
    stacked state, or a loop over per-layer states. per_kind, kind_L: attention_kinds.layer_inputs."""
    if self.attention != "reference":  # a query with no real key (pure left padding) attends to itself
      def self_when_lonely(mask_BxTxS):
        lonely_BxT = ~jnp.any(mask_BxTxS, axis=-1)
        return mask_BxTxS | (lonely_BxT[:, :, None] & jnp.eye(mask_BxTxS.shape[1], dtype=bool)[None])
      per_kind = tuple((cos, sin, self_when_lonely(mask)) for cos, sin, mask in per_kind)
    how, graphdef, states = self._layer_states()
    if how == "scan":
      return _scanned_layers(graphdef, self.attention, self.remat)(x_BxTxD, states, per_kind, kind_L, keep_L)
    for index, (layer_graphdef, layer_state) in enumerate(zip(graphdef, states)):
      consts = attention_kinds.pick(per_kind, self.config.kinds_L[index])
      y_BxTxD = _layer_step(layer_graphdef, self.attention, self.remat, False, x_BxTxD, layer_state, *consts)
      x_BxTxD = y_BxTxD if keep_L is None else jnp.where(keep_L[index], y_BxTxD, x_BxTxD)
    return x_BxTxD

  def _run_layers_cached(self, x_BxTxD, per_kind, kind_L, cache, cache_index):
    """(x, cache) through every layer with a KV cache: scanned over the stacked state with the cache in the
    carry (each layer writes its slice in place), or a loop over per-layer states."""
    how, graphdef, states = self._layer_states()

    def step(x_BxTxD, cache, layer_graphdef, layer_state, layer, kind):
      cos_BxTxH, sin_BxTxH, mask_BxTxS = attention_kinds.pick(per_kind, kind)
      return nnx.merge(layer_graphdef, layer_state)(x_BxTxD, cos_BxTxH, sin_BxTxH, mask_BxTxS, cache, layer,
                                                    cache_index)
    if how == "scan":
      body = lambda carry, xs: (step(*carry, graphdef, *xs), None)
      layers_L = jnp.arange(self.config.num_hidden_layers, dtype=jnp.int32)
      return jax.lax.scan(body, (x_BxTxD, cache), (states, layers_L, kind_L))[0]
    for layer, (layer_graphdef, layer_state) in enumerate(zip(graphdef, states)):
      x_BxTxD, cache = step(x_BxTxD, cache, layer_graphdef, layer_state, layer, self.config.kinds_L[layer])
    return x_BxTxD, cache
