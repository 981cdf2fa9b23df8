"""Model configuration: one dataclass for the Qwen3 / Llama 3 / Qwen2 / Gemma 3 decoder families, read from HF
config.json.

Gemma 3 (`gemma3_text`, HF's Gemma3ForCausalLM) differs from the others in: layers of two attention kinds
(`layer_types`: "sliding_attention" sees the last `sliding_window` positions and rotates with its own RoPE base
`rope_local_base_freq`; "full_attention" sees everything and uses `rope_theta` and any scaling); RMSNorm that
scales by (1 + weight); four norms per block (after attention and around the MLP); the embedding scaled by
sqrt(hidden_size); GeGLU (tanh-approximate GELU); queries scaled by query_pre_attn_scalar ** -0.5.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

from opd_jax.errors import InputError

FAMILIES = ("qwen3", "llama", "qwen2", "gemma3_text")
_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "gemma3_text": "Gemma3ForCausalLM"}
LAYER_KINDS = ("full_attention", "sliding_attention")  # HF's layer_types values, in kind-index order
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


class CheckpointError(InputError):
  """A checkpoint directory or its contents cannot be used; the message names the file or tensor."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of one decoder. Field names follow HF config.json where one exists."""

  model_type: str  # "qwen3" (QK-norm), "llama" (rope_scaling llama3), "qwen2" (q/k/v bias), "gemma3_text"
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_hidden_layers: int
  num_attention_heads: int
  num_key_value_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  # None, or llama3 scaling as sorted (key, value) pairs (a tuple keeps the config hashable for jit).
  rope_scaling: tuple[tuple[str, Any], ...] | None = None
  tie_word_embeddings: bool = False
  attention_bias: bool = False  # llama / qwen3: bias on q, k, v and o projections (qwen2: see qkv_bias)
  mlp_bias: bool = False  # llama only
  max_position_embeddings: int = 32768
  bos_token_id: int | None = None
  eos_token_id: tuple[int, ...] = ()  # every id that ends a response
  pad_token_id: int | None = None
  hidden_act: str = "silu"  # "silu" (SwiGLU) or "gelu_tanh" (GeGLU, gemma3_text)
  # gemma3_text only: each layer's kind (LAYER_KINDS), the window of the sliding ones, their RoPE base, and
  # the query scaling's denominator (None: head_dim).
  layer_types: tuple[str, ...] | None = None
  sliding_window: int | None = None
  rope_local_base_freq: float = 10000.0
  query_pre_attn_scalar: float | None = None

  @property
  def gemma(self) -> bool:
    """(1 + weight) RMSNorm, four norms per block, sqrt(D)-scaled embedding."""
    return self.model_type == "gemma3_text"

  @property
  def kinds_L(self) -> tuple[int, ...]:
    """Each layer's attention kind as an index into LAYER_KINDS (all 0, full attention, outside gemma3_text)."""
    if self.layer_types is None:
      return (0,) * self.num_hidden_layers
    return tuple(LAYER_KINDS.index(t) for t in self.layer_types)

  @property
  def query_scale(self) -> float:
    return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

  @property
  def embed_scale(self) -> float | None:
    return self.hidden_size ** 0.5 if self.gemma else None

  @property
  def qkv_bias(self) -> bool:
    """Bias on q/k/v: always for qwen2, attention_bias for llama / qwen3."""
    return self.model_type == "qwen2" or self.attention_bias

  @property
  def o_bias(self) -> bool:
    return self.model_type != "qwen2" and self.attention_bias

  @property
  def qk_norm(self) -> bool:
    """qwen3, gemma3_text: RMSNorm over head_dim on queries and keys before RoPE."""
    return self.model_type in ("qwen3", "gemma3_text")

  def __post_init__(self):
    if self.model_type not in FAMILIES:
      raise CheckpointError(f"unsupported model_type {self.model_type!r}; supported: {', '.join(FAMILIES)}")
    if self.num_attention_heads % self.num_key_value_heads:
      raise CheckpointError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                            f"num_key_value_heads={self.num_key_value_heads}")
    if self.mlp_bias and self.model_type != "llama":
      raise CheckpointError(f"mlp_bias is a llama option, not {self.model_type}")
    if self.hidden_act not in ("silu", "gelu_tanh"):
      raise CheckpointError(f"hidden_act={self.hidden_act!r} is not supported (silu, gelu_tanh)")
    if self.layer_types is not None:
      if len(self.layer_types) != self.num_hidden_layers or any(t not in LAYER_KINDS for t in self.layer_types):
        raise CheckpointError(f"layer_types must list one of {', '.join(LAYER_KINDS)} per layer "
                              f"({self.num_hidden_layers}), got {self.layer_types!r}")
      if "sliding_attention" in self.layer_types and not (self.sliding_window or 0) > 0:
        raise CheckpointError(f"sliding_attention layers need a positive sliding_window, got {self.sliding_window!r}")

  def num_params(self) -> int:
    d, f, h = self.hidden_size, self.intermediate_size, self.head_dim
    q, kv = self.num_attention_heads * h, self.num_key_value_heads * h
    attn = d * q + 2 * d * kv + q * d + (q + 2 * kv if self.qkv_bias else 0) + (d if self.o_bias else 0)
    mlp = 3 * d * f + ((2 * f + d) if self.mlp_bias else 0)
    norms = (4 if self.gemma else 2) * d + (2 * h if self.qk_norm else 0)
    embed = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
    return self.num_hidden_layers * (attn + mlp + norms) + embed + d

  @classmethod
  def from_hf_dict(cls, hf: dict[str, Any], source: str = "config.json") -> "ModelConfig":
    """Validates an HF config dict and maps it onto ModelConfig; errors name `source` and the field."""
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
      raise CheckpointError(
          f"{source}: unsupported model_type {model_type!r}; supported: {', '.join(FAMILIES)} "
          "(Qwen3, Llama 3, Qwen2/2.5, Gemma 3 text checkpoints"
          + ("; for a multimodal Gemma 3, use its text model's config (model_type gemma3_text)"
             if model_type == "gemma3" else "") + ")")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
      if not isinstance(hf.get(key), int) or hf[key] <= 0:
        raise CheckpointError(f"{source}: field {key!r} must be a positive integer, got {hf.get(key)!r}")
    extra = _gemma_fields(hf, source) if model_type == "gemma3_text" else _one_kind_fields(hf, source)
    heads = hf["num_attention_heads"]
    kv_heads = hf.get("num_key_value_heads") or heads
    if heads % kv_heads:
      raise CheckpointError(f"{source}: num_attention_heads={heads} is not a multiple of "
                            f"num_key_value_heads={kv_heads}")
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    rope_theta, rope_scaling = _rope_fields(hf, source, model_type)
    attention_bias = bool(hf.get("attention_bias", False))
    eos = hf.get("eos_token_id")
    eos = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
    return cls(
        model_type=model_type,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", model_type == "gemma3_text")),
        attention_bias=attention_bias and model_type != "qwen2",
        mlp_bias=bool(hf.get("mlp_bias", False)) if model_type == "llama" else False,
        max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=eos,
        pad_token_id=hf.get("pad_token_id"),
        **extra,
    )

  def _gemma_hf_fields(self, full_rope: dict[str, Any]) -> dict[str, Any]:
    """gemma3_text's own config.json fields, in both transformers 5 (per-kind rope_parameters) and 4.x spellings."""
    return {
        "hidden_activation": "gelu_pytorch_tanh",
        "layer_types": list(self.layer_types or ("full_attention",) * self.num_hidden_layers),
        "sliding_window": self.sliding_window,
        "query_pre_attn_scalar": _int_if_whole(self.query_pre_attn_scalar or self.head_dim),  # HF wants an int
        "rope_parameters": {"full_attention": full_rope,
                            "sliding_attention": {"rope_theta": self.rope_local_base_freq, "rope_type": "default"}},
        "rope_local_base_freq": self.rope_local_base_freq,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "attention_bias": self.attention_bias,
    }

  def to_hf_dict(self, dtype: str = "float32") -> dict[str, Any]:
    """The config.json that transformers' AutoModelForCausalLM reads back into the same architecture."""
    rope = {"rope_theta": self.rope_theta, "rope_type": "default"}
    if self.rope_scaling:
      rope = {**dict(self.rope_scaling), "rope_theta": self.rope_theta}
    hf = {
        "architectures": [_ARCHITECTURES[self.model_type]],
        "model_type": self.model_type,
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_hidden_layers,
        "num_attention_heads": self.num_attention_heads,
        "num_key_value_heads": self.num_key_value_heads,
        "head_dim": self.head_dim,
        "hidden_act": "silu" if self.hidden_act == "silu" else "gelu_pytorch_tanh",
        "rms_norm_eps": self.rms_norm_eps,
        # Both spellings: transformers >= 5 reads rope_parameters, 4.x reads rope_theta / rope_scaling.
        "rope_parameters": rope,
        "rope_theta": self.rope_theta,
        "tie_word_embeddings": self.tie_word_embeddings,
        "max_position_embeddings": self.max_position_embeddings,
        "bos_token_id": self.bos_token_id,
        "eos_token_id": list(self.eos_token_id) if len(self.eos_token_id) != 1 else self.eos_token_id[0],
        "pad_token_id": self.pad_token_id,
        "torch_dtype": dtype,
        "use_cache": True,
    }
    if self.rope_scaling:
      hf["rope_scaling"] = dict(self.rope_scaling)
    if self.model_type in ("llama", "qwen3"):
      hf["attention_bias"] = self.attention_bias
    if self.model_type == "llama":
      hf["mlp_bias"] = self.mlp_bias
    if self.model_type in ("qwen2", "qwen3"):
      hf["use_sliding_window"] = False
    if self.gemma:
      hf.update(self._gemma_hf_fields(rope))
    if self.eos_token_id == ():
      hf["eos_token_id"] = None
    return hf


def _int_if_whole(value: float) -> float | int:
  return int(value) if float(value).is_integer() else value


def _one_kind_fields(hf: dict[str, Any], source: str) -> dict[str, Any]:
  """Qwen3 / Llama / Qwen2: SwiGLU and full attention in every layer (sliding windows are refused)."""
  act = hf.get("hidden_act", "silu")
  if act not in ("silu", "swish"):
    raise CheckpointError(f"{source}: hidden_act {act!r} is not supported (only silu / SwiGLU)")
  layer_types = hf.get("layer_types") or []
  if hf.get("use_sliding_window") or any(t != "full_attention" for t in layer_types):
    raise CheckpointError(f"{source}: sliding-window attention layers are not supported; "
                          "set use_sliding_window=false")
  return {}


def _gemma_fields(hf: dict[str, Any], source: str) -> dict[str, Any]:
  """gemma3_text: the activation, the layer kinds (HF's default pattern: every 6th layer full), the window, the
  local RoPE base and the query scaling. Soft-capping and bidirectional attention (not Gemma 3's) are refused."""
  act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
  if _ACTIVATIONS.get(act) != "gelu_tanh":
    raise CheckpointError(f"{source}: hidden_activation {act!r} is not supported for gemma3_text "
                          "(gelu_pytorch_tanh)")
  for key in ("final_logit_softcapping", "attn_logit_softcapping", "use_bidirectional_attention"):
    if hf.get(key):
      raise CheckpointError(f"{source}: {key}={hf[key]!r} is not supported (Gemma 3 text models leave it unset)")
  layers = hf["num_hidden_layers"]
  pattern = int(hf.get("sliding_window_pattern") or 6)
  layer_types = hf.get("layer_types") or [
      "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
  rope = hf.get("rope_parameters") or {}
  local = (rope.get("sliding_attention") or {}) if isinstance(rope.get("sliding_attention"), dict) else {}
  if local.get("rope_type", "default") != "default":
    raise CheckpointError(f"{source}: sliding layers' rope type {local['rope_type']!r} is not supported (default)")
  scalar = hf.get("query_pre_attn_scalar")
  return dict(hidden_act="gelu_tanh", layer_types=tuple(layer_types), sliding_window=hf.get("sliding_window"),
              rope_local_base_freq=float(local.get("rope_theta", hf.get("rope_local_base_freq", 10000.0))),
              query_pre_attn_scalar=scalar)


def _rope_fields(hf: dict[str, Any], source: str, model_type: str) -> tuple[float, tuple | None]:
  """(rope_theta, rope_scaling) of the full-attention layers, from transformers 5's rope_parameters (per layer
  kind for gemma3_text) or 4.x's rope_theta / rope_scaling. Scaling: llama3 or linear."""
  rope = dict(hf.get("rope_parameters") or {})  # transformers >= 5
  if model_type == "gemma3_text" and isinstance(rope.get("full_attention"), dict):
    rope = dict(rope["full_attention"])
  legacy_scaling = hf.get("rope_scaling")  # transformers 4
  if legacy_scaling:
    rope.update(legacy_scaling)
  theta = float(rope.get("rope_theta", hf.get("rope_theta", 1e6 if model_type == "gemma3_text" else 10000.0)))
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  try:
    if rope_type == "llama3":
      return theta, tuple(sorted({
          "rope_type": "llama3",
          "factor": float(rope["factor"]),
          "low_freq_factor": float(rope["low_freq_factor"]),
          "high_freq_factor": float(rope["high_freq_factor"]),
          "original_max_position_embeddings": int(rope["original_max_position_embeddings"]),
      }.items()))
    if rope_type == "linear":
      return theta, (("factor", float(rope["factor"])), ("rope_type", "linear"))
  except KeyError as e:
    raise CheckpointError(f"{source}: {rope_type} rope scaling is missing field {e.args[0]!r}") from None
  if rope_type != "default":
    raise CheckpointError(f"{source}: rope type {rope_type!r} is not supported (default, llama3, linear)")
  return theta, None


def read_json_object(path: str) -> dict:
  """A JSON object from an HF checkpoint file; anything else is a CheckpointError naming the file."""
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise CheckpointError(f"{path} is not valid JSON ({getattr(e, 'msg', e.__class__.__name__)}); restore the "
                          "file from the original checkpoint") from None
  if not isinstance(value, dict):
    raise CheckpointError(f"{path} holds a JSON {type(value).__name__}, expected an object (an HF config)")
  return value


def read_hf_config(path: str) -> ModelConfig:
  """Reads DIR/config.json (plus generation_config.json's eos ids when present)."""
  if not os.path.isdir(path):
    raise CheckpointError(f"checkpoint dir {path!r} does not exist (expected an HF model directory)")
  config_file = os.path.join(path, "config.json")
  if not os.path.isfile(config_file):
    raise CheckpointError(f"checkpoint dir {path!r} has no config.json (expected an HF model directory)")
  config = ModelConfig.from_hf_dict(read_json_object(config_file), source=config_file)
  gen_file = os.path.join(path, "generation_config.json")
  if os.path.isfile(gen_file):
    eos = read_json_object(gen_file).get("eos_token_id")
    if eos is not None:
      ids = eos if isinstance(eos, list) else [eos]
      if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise CheckpointError(f"{gen_file}: eos_token_id must be a token id or a list of them, got {eos!r}")
      eos = tuple(ids)
      config = dataclasses.replace(config, eos_token_id=tuple(dict.fromkeys(config.eos_token_id + eos)))
  return config


def rope_inv_freq(config: ModelConfig, kind: int = 0) -> list[float]:
  """Inverse RoPE frequencies (head_dim / 2 of them) of layers of kind `kind` (LAYER_KINDS): full attention
  uses rope_theta with llama3 or linear frequency scaling when configured, sliding attention
  rope_local_base_freq without scaling."""
  dim = config.head_dim
  base = config.rope_local_base_freq if LAYER_KINDS[kind] == "sliding_attention" else config.rope_theta
  inv_freq = [1.0 / (base ** (i / dim)) for i in range(0, dim, 2)]
  if not config.rope_scaling or LAYER_KINDS[kind] == "sliding_attention":
    return inv_freq
  scaling = dict(config.rope_scaling)
  if scaling["rope_type"] == "linear":
    return [f / scaling["factor"] for f in inv_freq]
  factor, old_len = scaling["factor"], scaling["original_max_position_embeddings"]
  low_wavelen = old_len / scaling["low_freq_factor"]
  high_wavelen = old_len / scaling["high_freq_factor"]
  out = []
  for f in inv_freq:
    wavelen = 2 * math.pi / f
    if wavelen > low_wavelen:
      out.append(f / factor)
    elif wavelen < high_wavelen:
      out.append(f)
    else:
      smooth = (old_len / wavelen - scaling["low_freq_factor"]) / (
          scaling["high_freq_factor"] - scaling["low_freq_factor"])
      out.append((1 - smooth) * f / factor + smooth * f)
  return out
