"""Batched autoregressive sampler: one jitted prefill + XLA while-loop decoding over a KV cache.

Legend: B batch, G distinct prompts (B / samples_per_prompt), P prompt length (left-padded), N max new
tokens, V vocab, K returned top logits.

Decoding runs as a few while-loops in one jitted program (see `SamplingConfig.decode_chunk`); the KV cache is
allocated once with room for every token, and before each loop the slots attention reads widen to exactly those
that loop fills, so attention never reads slots that are still empty.

Prompts are left-padded (`prompt_valid_BxP` marks real tokens; every row needs at least one), so every row's
last prompt token sits in column P-1 and decoding writes slot P + t for all rows at once. RoPE positions
continue from each row's own prompt length.

Returned log-probs are of the distribution each token was actually drawn from: log-softmax of
logits / temperature after top-k and top-p filtering (renormalized over the kept tokens). With temperature 0
(greedy) they are the plain log-softmax of the logits. The response mask is 1 for every generated token up
to and including the first EOS; later slots hold `pad_id`, log-prob 0 and mask 0.

Groups: with `samples_per_prompt = n`, rows come in consecutive groups of n that share one prompt (OPD with
several samples per prompt, GRPO's groups). Each distinct prompt is prefilled once and its KV cache and last
logits are repeated to the n rows, so the prefill costs G = B / n rows instead of B; decoding then runs over
all B rows. Under the same key the tokens equal those of prefilling every row, and the log-probs agree up to
float summation order (tests/test_sampler.py).

Shardings: given a mesh (the sampler's own, see rollout.placement), the program is jitted with explicit
shardings -- weights on the inference layout, prompts and outputs over batch rows -- and the KV cache is
pinned to rows x KV heads inside the decode loop. Without one, shardings follow the inputs.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from opd_jax.errors import InputError
from opd_jax.models import layer_stack
from opd_jax.rollout.kv_cache import KVCache, check_kv_dtype
from opd_jax.rollout.placement import constrain_cache as placement_constrain
from opd_jax.rollout.precision import dequantized


WEIGHT_LAYOUTS = ("stored", "dense_layers")


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  max_new_tokens: int
  temperature: float = 1.0  # 0 = greedy
  top_k: int = 0  # keep the k most likely tokens; 0 = off
  top_p: float = 1.0  # nucleus: keep the smallest set with probability >= top_p; 1 = off
  eos_ids: tuple[int, ...] = ()  # any of these ends a row
  pad_id: int = 0  # written after a row ends
  kv_dtype: str = "native"  # see rollout.kv_cache
  logits_top_k: int = 0  # also return the top-k log-probs (temperature 1, unfiltered) per position; 0 = none
  # Decode steps per compiled loop; each loop's attention reads only the KV slots it fills, since attention
  # reads every slot it is given (at 128 new tokens this is 10-15% faster on CPU). Every loop is
  # compiled separately. 0 = automatic: max(32, ceil(max_new_tokens / 4)), i.e. at most four loops.
  decode_chunk: int = 0
  samples_per_prompt: int = 1  # rows come in groups of this many sharing one prompt, prefilled once per group
  # How decoding reads the weights (WEIGHT_LAYOUTS): "stored" as they are stored (quantized, stacked layers
  # scanned; accelerators fuse dequantization into the matmul and hold no copy), or "dense_layers": once per
  # generate call the weights are dequantized and split into per-layer arrays, and every step runs unrolled
  # layers over them (XLA:CPU has no low-precision matmul, so "stored" converts every quantized weight on every
  # step, and a scan slices every stacked weight on every step: 0.5x and 0.8x of this on SmolLM2). The same
  # tokens and log-probs either way (tests); RolloutConfig.sampling picks by backend.
  weight_layout: str = "stored"

  def __post_init__(self):
    if self.max_new_tokens < 1:
      raise InputError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
    if self.temperature < 0:
      raise InputError(f"temperature must be >= 0, got {self.temperature}")
    if self.decode_chunk < 0:
      raise InputError(f"decode_chunk must be >= 0, got {self.decode_chunk}")
    if self.top_k < 0 or not 0 < self.top_p <= 1:
      raise InputError(f"need top_k >= 0 and 0 < top_p <= 1, got top_k={self.top_k}, top_p={self.top_p}")
    if self.samples_per_prompt < 1:
      raise InputError(f"samples_per_prompt must be >= 1, got {self.samples_per_prompt}")
    if self.weight_layout not in WEIGHT_LAYOUTS:
      raise InputError(f"weight_layout must be one of {WEIGHT_LAYOUTS}, got {self.weight_layout!r}")
    check_kv_dtype(self.kv_dtype)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SampleOutput:
  tokens_BxN: jax.Array  # int32 new tokens
  mask_BxN: jax.Array  # float32, 1 for response tokens (through the first EOS)
  logprobs_BxN: jax.Array  # float32, log-prob under the sampling distribution
  # log-softmax of the raw logits (temperature 1, before filtering) for the K most likely tokens; with
  # K = V this is the sampler's whole distribution (for exact vocabulary-level mismatch metrics).
  top_logprobs_BxNxK: jax.Array | None = None
  top_ids_BxNxK: jax.Array | None = None
  # int32 weight version that drew each token (-1 past the response); only from the paged engine, whose weights
  # may change between its rounds (in-flight updates)
  version_BxN: jax.Array | None = None


def _filter_logits(logits_BxV: jax.Array, config: SamplingConfig) -> jax.Array:
  """logits / temperature with tokens outside top-k / top-p set to -inf."""
  scaled_BxV = logits_BxV / config.temperature
  if config.top_k and config.top_k < scaled_BxV.shape[-1]:
    kth_Bx1 = jax.lax.top_k(scaled_BxV, config.top_k)[0][:, -1:]
    scaled_BxV = jnp.where(scaled_BxV < kth_Bx1, -jnp.inf, scaled_BxV)
  if config.top_p < 1.0:
    sorted_BxV = jnp.sort(scaled_BxV, axis=-1)[:, ::-1]
    probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
    mass_before_BxV = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV
    kept_BxV = mass_before_BxV < config.top_p  # the first token is always kept
    threshold_Bx1 = jnp.min(jnp.where(kept_BxV, sorted_BxV, jnp.inf), axis=-1, keepdims=True)
    scaled_BxV = jnp.where(scaled_BxV < threshold_Bx1, -jnp.inf, scaled_BxV)
  return scaled_BxV


def choose_tokens(logits_BxV: jax.Array, key: jax.Array, config: SamplingConfig):
  """(token_B, logprob_B) drawn from the configured distribution."""
  if config.temperature == 0:
    token_B = jnp.argmax(logits_BxV, axis=-1)
    logp_BxV = jax.nn.log_softmax(logits_BxV, axis=-1)
  else:
    filtered_BxV = _filter_logits(logits_BxV, config)
    token_B = jax.random.categorical(key, filtered_BxV, axis=-1)
    logp_BxV = jax.nn.log_softmax(filtered_BxV, axis=-1)
  logp_B = jnp.take_along_axis(logp_BxV, token_B[:, None], axis=-1)[:, 0]
  return token_B.astype(jnp.int32), logp_B


def choose_tokens_per_row(logits_BxV: jax.Array, keys_B: jax.Array, index, config: SamplingConfig):
  """(token_B, logp_B) with row b's token drawn under fold_in(keys_B[b], index): each row's draw depends on its own
  key and token index only, never on which other rows share the batch (rollout.engine draws the same way)."""
  def one(logits_V, key, index):
    token_1, logp_1 = choose_tokens(logits_V[None], jax.random.fold_in(key, index), config)
    return token_1[0], logp_1[0]
  index_B = jnp.broadcast_to(jnp.asarray(index, jnp.int32), logits_BxV.shape[:1])  # one index, or one per row
  return jax.vmap(one)(logits_BxV, keys_B, index_B)


def _prefill(model, config: SamplingConfig, prompt_BxP, prompt_valid_BxP, pin):
  """(last-position logits_Bx1xV, cache over the P prompt slots), prefilling each group's prompt once. The cache
  is allocated with room for every decoded token (P + N - 1 slots), once: decoding only widens what it reads."""
  mc = model.config
  B, P = prompt_BxP.shape
  n = config.samples_per_prompt
  if B % n:
    raise InputError(f"batch of {B} rows is not a whole number of groups of samples_per_prompt={n}")
  prompt_GxP, valid_GxP = prompt_BxP[::n], prompt_valid_BxP[::n]  # the first row of each group
  capacity = P + config.max_new_tokens - 1  # a group's prefill stays at P slots until its rows are repeated
  cache = pin(KVCache.init(batch=B // n, slots=P, num_layers=mc.num_hidden_layers,
                           num_kv_heads=mc.num_key_value_heads, head_dim=mc.head_dim,
                           compute_dtype=model.dtype, kv_dtype=config.kv_dtype, capacity=capacity if n == 1 else P))
  positions_GxP = jnp.maximum(jnp.cumsum(valid_GxP, axis=1) - 1, 0)
  logits_Gx1xV, cache = model(prompt_GxP, positions_GxP, valid_GxP, cache=cache, cache_index=0,
                              logits_span=(P - 1, P))
  if n == 1:
    return logits_Gx1xV, cache
  return jnp.repeat(logits_Gx1xV, n, axis=0), pin(cache.repeat_rows(n).reserve(capacity))


def _generate(graphdef, config: SamplingConfig, mesh: Mesh | None, state, prompt_BxP, prompt_valid_BxP,
              key) -> SampleOutput:
  if config.weight_layout == "dense_layers":  # one dense per-layer copy for the whole call, outside every loop
    state = layer_stack.unstack(dequantized(state))
  model = nnx.merge(graphdef, state)
  B, P = prompt_BxP.shape
  N = config.max_new_tokens
  prompt_valid_BxP = prompt_valid_BxP.astype(bool)
  pin = (lambda cache: cache) if mesh is None else (lambda cache: placement_constrain(cache, mesh))
  logits_Bx1xV, cache = _prefill(model, config, prompt_BxP, prompt_valid_BxP, pin)
  prompt_len_B = jnp.sum(prompt_valid_BxP, axis=1)
  eos_E = jnp.asarray(config.eos_ids or (-1,), jnp.int32)
  K = min(config.logits_top_k, logits_Bx1xV.shape[-1])

  row_keys = key.ndim == 1  # one key per row: token t of row b is drawn under fold_in(key[b], t)

  def emit(t, logits_BxV, key, buffers, done_B):
    tokens, logps, mask, top_vals, top_ids = buffers
    if row_keys:
      token_B, logp_B = choose_tokens_per_row(logits_BxV, key, t, config)
    else:
      token_B, logp_B = choose_tokens(logits_BxV, key, config)
    token_B = jnp.where(done_B, config.pad_id, token_B)
    tokens = tokens.at[:, t].set(token_B)
    logps = logps.at[:, t].set(jnp.where(done_B, 0.0, logp_B))
    mask = mask.at[:, t].set(jnp.where(done_B, 0.0, 1.0))
    if K:
      vals_BxK, ids_BxK = jax.lax.top_k(jax.nn.log_softmax(logits_BxV, axis=-1), K)
      top_vals, top_ids = top_vals.at[:, t].set(vals_BxK), top_ids.at[:, t].set(ids_BxK)
    done_B = done_B | jnp.isin(token_B, eos_E)
    return (tokens, logps, mask, top_vals, top_ids), done_B

  buffers = (jnp.full((B, N), config.pad_id, jnp.int32), jnp.zeros((B, N), jnp.float32),
             jnp.zeros((B, N), jnp.float32),
             jnp.zeros((B, N, K), jnp.float32) if K else None, jnp.zeros((B, N, K), jnp.int32) if K else None)
  key, first_key = (key, key) if row_keys else jax.random.split(key)
  buffers, done_B = emit(0, logits_Bx1xV[:, 0], first_key, buffers, jnp.zeros((B,), bool))

  def cond(stop, carry):
    t, _, _, _, done_B = carry
    return (t < stop) & ~jnp.all(done_B)

  def body(carry):
    t, cache, key, buffers, done_B = carry
    fed_B = buffers[0][:, t - 1]
    fed_valid_B = buffers[2][:, t - 1] > 0
    positions_Bx1 = (prompt_len_B + t - 1)[:, None]
    logits_Bx1xV, cache = model(fed_B[:, None], positions_Bx1, fed_valid_B[:, None], cache=cache,
                                cache_index=P + t - 1)
    cache = pin(cache)
    key, step_key = (key, key) if row_keys else jax.random.split(key)
    buffers, done_B = emit(t, logits_Bx1xV[:, 0], step_key, buffers, done_B)
    return t + 1, cache, key, buffers, done_B

  # Step t feeds token t - 1 into slot P + t - 1, so steps [start, stop) need P + stop - 1 slots.
  chunk = config.decode_chunk or max(32, -(-N // 4))
  carry = (jnp.int32(1), cache, key, buffers, done_B)
  for stop in [*range(1 + chunk, N, chunk), N]:
    t, cache, key, buffers, done_B = carry
    carry = jax.lax.while_loop(functools.partial(cond, stop), body,
                               (t, pin(cache.grow(P + stop - 1)), key, buffers, done_B))
  buffers = carry[3]
  tokens, logps, mask, top_vals, top_ids = buffers
  return SampleOutput(tokens, mask, logps, top_vals, top_ids)


class Sampler:
  """Jit-compiled generation for one model architecture; call with any parameter state of that graph.

  `Sampler(graphdef, config)(state, prompt_BxP, prompt_valid_BxP, key)` -> SampleOutput; `key` one key for the
  batch, or one per row (shape [B]: each row's tokens then depend on its own key only). The state may
  hold quantized weights (see rollout.precision). With `mesh` and `state_shardings` (the sampler's own mesh and
  its weights' inference layout, see rollout.placement / rollout.weight_sync) every input and output has an
  explicit sharding; without them shardings follow the inputs.
  """

  def __init__(self, graphdef, config: SamplingConfig, *, mesh: Mesh | None = None, state_shardings=None):
    self.graphdef, self.config, self.mesh = graphdef, config, mesh
    fn = functools.partial(_generate, graphdef, config, mesh)
    if mesh is None:
      self._fn = jax.jit(fn)
      return
    rows = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    top = rows if config.logits_top_k else None
    self.batch_sharding = rows
    self._fn = jax.jit(fn, in_shardings=(state_shardings, rows, rows, NamedSharding(mesh, PartitionSpec())),
                       out_shardings=SampleOutput(rows, rows, rows, top, top))

  def __call__(self, state, prompt_BxP, prompt_valid_BxP, key) -> SampleOutput:
    return self._fn(state, prompt_BxP, prompt_valid_BxP, key)


def left_pad(prompts: list[list[int]], pad_id: int, length: int | None = None):
  """Token-id lists -> (tokens_BxP int32, valid_BxP bool) numpy arrays, left-padded to `length`."""
  import numpy as np
  longest = max(len(p) for p in prompts)
  length = longest if length is None else length
  if longest > length or min(len(p) for p in prompts) == 0:
    raise InputError(f"prompts must have 1..{length} tokens; got lengths {min(map(len, prompts))}..{longest}")
  tokens = np.full((len(prompts), length), pad_id, np.int32)
  valid = np.zeros((len(prompts), length), bool)
  for i, p in enumerate(prompts):
    tokens[i, length - len(p):] = p
    valid[i, length - len(p):] = True
  return tokens, valid
