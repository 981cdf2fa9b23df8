"""Model configuration: one dataclass for the Qwen3 / Llama 3 / Qwen2 decoder families, read from HF config.json."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

from opd_jax.errors import InputError

FAMILIES = ("qwen3", "llama", "qwen2")
_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


class CheckpointError(InputError):
  """A checkpoint directory or its contents cannot be used; the message names the file or tensor."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of one decoder. Field names follow HF config.json where one exists."""

  model_type: str  # "qwen3" (QK-norm), "llama" (rope_scaling llama3), "qwen2" (q/k/v bias)
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

  @property
  def qkv_bias(self) -> bool:
    """Bias on q/k/v: always for qwen2, attention_bias for llama / qwen3."""
    return self.model_type == "qwen2" or self.attention_bias

  @property
  def o_bias(self) -> bool:
    return self.model_type != "qwen2" and self.attention_bias

  @property
  def qk_norm(self) -> bool:
    """qwen3: RMSNorm over head_dim on queries and keys before RoPE."""
    return self.model_type == "qwen3"

  def __post_init__(self):
    if self.model_type not in FAMILIES:
      raise CheckpointError(f"unsupported model_type {self.model_type!r}; supported: {', '.join(FAMILIES)}")
    if self.num_attention_heads % self.num_key_value_heads:
      raise CheckpointError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                            f"num_key_value_heads={self.num_key_value_heads}")
    if self.mlp_bias and self.model_type != "llama":
      raise CheckpointError(f"mlp_bias is a llama option, not {self.model_type}")

  def num_params(self) -> int:
    d, f, h = self.hidden_size, self.intermediate_size, self.head_dim
    q, kv = self.num_attention_heads * h, self.num_key_value_heads * h
    attn = d * q + 2 * d * kv + q * d + (q + 2 * kv if self.qkv_bias else 0) + (d if self.o_bias else 0)
    mlp = 3 * d * f + ((2 * f + d) if self.mlp_bias else 0)
    norms = 2 * d + (2 * h if self.qk_norm else 0)
    embed = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
    return self.num_hidden_layers * (attn + mlp + norms) + embed + d

  @classmethod
  def from_hf_dict(cls, hf: dict[str, Any], source: str = "config.json") -> "ModelConfig":
    """Validates an HF config dict and maps it onto ModelConfig; errors name `source` and the field."""
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
      raise CheckpointError(
          f"{source}: unsupported model_type {model_type!r}; supported: {', '.join(FAMILIES)} "
          "(Qwen3, Llama 3, Qwen2/2.5 checkpoints)")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
      if not isinstance(hf.get(key), int) or hf[key] <= 0:
        raise CheckpointError(f"{source}: field {key!r} must be a positive integer, got {hf.get(key)!r}")
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
      raise CheckpointError(f"{source}: hidden_act {act!r} is not supported (only silu / SwiGLU)")
    layer_types = hf.get("layer_types") or []
    if hf.get("use_sliding_window") or any(t != "full_attention" for t in layer_types):
      raise CheckpointError(f"{source}: sliding-window attention layers are not supported; "
                            "set use_sliding_window=false")
    heads = hf["num_attention_heads"]
    kv_heads = hf.get("num_key_value_heads") or heads
    if heads % kv_heads:
      raise CheckpointError(f"{source}: num_attention_heads={heads} is not a multiple of "
                            f"num_key_value_heads={kv_heads}")
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    rope = dict(hf.get("rope_parameters") or {})  # transformers >= 5
    legacy_scaling = hf.get("rope_scaling")  # transformers 4
    if legacy_scaling:
      rope.update(legacy_scaling)
    rope_theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    rope_scaling = None
    if rope_type == "llama3":
      try:
        rope_scaling = tuple(sorted({
            "rope_type": "llama3",
            "factor": float(rope["factor"]),
            "low_freq_factor": float(rope["low_freq_factor"]),
            "high_freq_factor": float(rope["high_freq_factor"]),
            "original_max_position_embeddings": int(rope["original_max_position_embeddings"]),
        }.items()))
      except KeyError as e:
        raise CheckpointError(f"{source}: llama3 rope scaling is missing field {e.args[0]!r}") from None
    elif rope_type != "default":
      raise CheckpointError(f"{source}: rope type {rope_type!r} is not supported (default, llama3)")
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
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=attention_bias and model_type != "qwen2",
        mlp_bias=bool(hf.get("mlp_bias", False)) if model_type == "llama" else False,
        max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=eos,
        pad_token_id=hf.get("pad_token_id"),
    )

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
        "hidden_act": "silu",
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
    if self.eos_token_id == ():
      hf["eos_token_id"] = None
    return hf


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


def rope_inv_freq(config: ModelConfig) -> list[float]:
  """Inverse RoPE frequencies (head_dim / 2 of them), with llama3 frequency scaling when configured."""
  dim = config.head_dim
  inv_freq = [1.0 / (config.rope_theta ** (i / dim)) for i in range(0, dim, 2)]
  if not config.rope_scaling:
    return inv_freq
  scaling = dict(config.rope_scaling)
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
