"""Memory accounting for a rollout engine: weight bytes under a recipe, KV bytes per token, KV capacity.

Weight bytes are computed from parameter shapes alone (an abstract model, no allocation), with the same rules
`rollout.precision` applies: none -> the learner dtype's bytes, bf16 -> 2, int8/fp8 -> 1 and int4 / int3 / int2 ->
1/2 per element (the 4-bit container), plus a float32 scale per output channel (per row for the embedding; one for
per-tensor recipes). Tests check the arithmetic against the measured bytes of real quantized states. KV bytes per
token come from `rollout.kv_cache.kv_bytes_per_token`.
"""

from __future__ import annotations

import dataclasses
import functools

from flax import nnx

from opd_jax.models import layer_stack
from opd_jax.models.config import ModelConfig
from opd_jax.models.decoder import Decoder
from opd_jax.rollout import precision
from opd_jax.rollout.kv_cache import kv_bytes_per_token


def parameter_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
  """Dotted parameter path -> shape, without allocating the model (cached per config: tracing an 8B model's
  abstract init takes seconds, and capacity tables ask for each model once per recipe)."""
  return dict(_parameter_shapes(config))


@functools.lru_cache(maxsize=32)
def _parameter_shapes(config: ModelConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
  abstract = nnx.eval_shape(lambda: Decoder(config))
  return tuple((layer_stack.dotted(path), tuple(value.shape))  # per-layer paths, which recipe rules match
               for path, value in layer_stack.per_layer_flat(nnx.state(abstract, nnx.Param)))


def weight_bytes(config: ModelConfig, rules: precision.Rules, native_bytes: int = 2) -> int:
  """Bytes of the sampler's weights under `rules` when the learner stores `native_bytes` per element."""
  total = 0
  for path, shape in parameter_shapes(config).items():
    size = 1
    for dim in shape:
      size *= dim
    p = precision.precision_for(path, rules)
    if p in precision.QUANTIZED and len(shape) == 2:
      channels = 1 if p in precision.PER_TENSOR else shape[0] if path.endswith("embedding") else shape[1]
      total += (size + 1) // 2 if p in precision.NIBBLE else size
      total += 4 * channels
    elif p == "bf16":
      total += 2 * size
    else:
      total += native_bytes * size
  return total


def kv_token_bytes(config: ModelConfig, kv_dtype: str, native_bytes: int = 2) -> int:
  return kv_bytes_per_token(num_layers=config.num_hidden_layers, num_kv_heads=config.num_key_value_heads,
                            head_dim=config.head_dim, kv_dtype=kv_dtype, native_bytes=native_bytes)


@dataclasses.dataclass(frozen=True)
class Capacity:
  weight_bytes: int
  kv_bytes_per_token: int
  kv_tokens: int  # tokens of KV cache that fit after weights and the reserve


def kv_capacity(config: ModelConfig, rules: precision.Rules, kv_dtype: str, *, device_bytes: int,
                reserve_fraction: float = 0.1, native_bytes: int = 2) -> Capacity:
  """KV tokens that fit in `device_bytes` after the weights and a reserve of `reserve_fraction` of the
  device (activations, workspace, fragmentation)."""
  weights = weight_bytes(config, rules, native_bytes)
  per_token = kv_token_bytes(config, kv_dtype, native_bytes)
  free = device_bytes * (1 - reserve_fraction) - weights
  return Capacity(weights, per_token, max(int(free // per_token), 0))



def concurrent_sequences(kv_tokens: int, *, prompt_tokens: int, max_new_tokens: int, mean_tokens: float,
                         page_size: int = 16) -> dict[str, int]:
  """Sequences a KV budget of `kv_tokens` holds at once: the static engine reserves prompt + cap slots per row;
  the paged engine holds each sequence's tokens in whole pages, so it fits as many as pages of a mean-length
  sequence (`mean_tokens`: prompt + response, averaged over the workload) fit, the last page's waste included."""
  pages_per_sequence = -(-int(round(mean_tokens)) // page_size)
  return {"static": kv_tokens // (prompt_tokens + max_new_tokens),
          "paged": (kv_tokens // page_size) // max(pages_per_sequence, 1)}
