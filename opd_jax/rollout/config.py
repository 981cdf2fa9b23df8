"""RolloutConfig: every mismatch knob of the rollout engine, composable, validated when read."""

from __future__ import annotations

import dataclasses
import functools

import jax
from flax import nnx

from opd_jax.errors import InputError
from opd_jax.rollout import kv_cache, noise, placement, precision, snapshots
from opd_jax.rollout.engine import ENGINES
from opd_jax.rollout.sampler import WEIGHT_LAYOUTS, SamplingConfig

NOISE_ORDERS = ("before_quant", "after_quant")
WEIGHT_LAYOUT_CHOICES = ("auto", *WEIGHT_LAYOUTS)


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  weights: str = "none"  # none | bf16 | int8 | int4 | int3 | int2 | fp8 | fp8_e5m2 | fp8_tensor (rollout.precision)
  weight_rules: precision.Rules = ()  # explicit ordered (regex, precision) rules; override `weights`
  quantize_embedding: bool = False  # int8/fp8 shorthands: the embedding table at that precision too
  kv_cache: str = "native"  # native | bf16 | int8 | int4 | fp8_e4m3 | fp8_e5m2, + _bf16scale (see rollout.kv_cache)
  staleness_steps: int = 0  # sampler uses learner version t - staleness_steps
  noise_sigma: float = 0.0  # relative Gaussian weight noise per tensor (see rollout.noise)
  noise_order: str = "before_quant"  # before_quant | after_quant
  noise_seed: int = 0
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  max_new_tokens: int = 64
  # Every student token whose text contains this ends a response, as its EOS does ("" = none): vLLM's stop strings
  # at token granularity (the stopping token's text is not part of the answer). "\n" ends answers at their first line.
  stop_text: str = ""
  # The rollout engine's layout and memory (rollout.placement, rollout.weight_sync); none changes a number.
  placement: str = "colocated"  # colocated | disaggregated
  devices: int = 0  # disaggregated: devices of the sampler's own mesh (the learner keeps the rest)
  tensor_parallel: int = 1  # sampler mesh tensor axis (heads / MLP / vocabulary); data = its devices / this
  snapshots_on: str = "device"  # staleness snapshots (at the recipe's precision) on: device | host
  samples_per_prompt: int = 1  # responses per distinct prompt; the prompt is prefilled once per group
  split_mismatch: bool = True  # keep a dense learner copy per lagged version to split precision vs staleness
  # The engine that decodes (rollout.engine): static (one padded batch, every row to the longest) or paged (a paged
  # KV cache and continuous batching; each row drawn under its own key). Paged only: tokens per KV page, rows
  # decoded at once per sampler device (0 = the batch's share), decode steps per host round trip, pages in the
  # pool (0 = room for every row at its longest).
  engine: str = "static"
  page_size: int = 16
  engine_rows: int = 0
  decode_steps: int = 8
  kv_pages: int = 0
  # Async mode with the paged engine: rows still running when the learner publishes a new version continue on it
  # from their next token (PipelineRL-style; each token's version is recorded and its lag logged on the one
  # scale), instead of finishing on the version they started with.
  inflight_updates: bool = False
  # How decoding reads the sampler's weights: stored (as stored), dense_layers (a dense per-layer copy made once
  # per generate call), auto (dense_layers on CPU, stored elsewhere). Speed and transient memory only
  # (SamplingConfig.weight_layout).
  weight_layout: str = "auto"

  def __post_init__(self):
    object.__setattr__(self, "weight_rules", precision.recipe_rules(self.weights, self.weight_rules,
                                                                    embedding=self.quantize_embedding))
    object.__setattr__(self, "kv_cache", kv_cache.check_kv_dtype(self.kv_cache))
    if self.engine not in ENGINES:
      raise InputError(f"rollout.engine={self.engine!r} does not exist; choose one of {', '.join(ENGINES)}")
    for name in ("page_size", "decode_steps"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        raise InputError(f"rollout.{name} must be an integer >= 1, got {getattr(self, name)!r}")
    for name in ("engine_rows", "kv_pages"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
        raise InputError(f"rollout.{name} must be an integer >= 0 (0 = automatic), got {getattr(self, name)!r}")
    if self.inflight_updates and self.engine != "paged":
      raise InputError("rollout.inflight_updates=True needs rollout.engine='paged' (the static engine decodes a "
                       "batch in one program and cannot take new weights mid-batch)")
    if not isinstance(self.staleness_steps, int) or self.staleness_steps < 0:
      raise InputError(f"rollout.staleness_steps must be an integer >= 0, got {self.staleness_steps!r}")
    if not self.noise_sigma >= 0:
      raise InputError(f"rollout.noise_sigma must be >= 0, got {self.noise_sigma!r}")
    if self.noise_order not in NOISE_ORDERS:
      raise InputError(f"rollout.noise_order must be one of {NOISE_ORDERS}, got {self.noise_order!r}")
    if self.placement not in placement.PLACEMENTS:
      raise InputError(f"rollout.placement must be one of {placement.PLACEMENTS}, got {self.placement!r}")
    if self.placement == "disaggregated" and (not isinstance(self.devices, int) or self.devices < 1):
      raise InputError(f"rollout.placement='disaggregated' needs rollout.devices >= 1 (the sampler's devices), "
                       f"got {self.devices!r}")
    if self.placement == "colocated" and self.devices:
      raise InputError(f"rollout.devices={self.devices} only applies to rollout.placement='disaggregated'; "
                       "set the placement or leave rollout.devices=0")
    if not isinstance(self.tensor_parallel, int) or self.tensor_parallel < 1:
      raise InputError(f"rollout.tensor_parallel must be an integer >= 1, got {self.tensor_parallel!r}")
    if self.snapshots_on not in snapshots.PLACES:
      raise InputError(f"rollout.snapshots_on must be one of {snapshots.PLACES}, got {self.snapshots_on!r}")
    if not isinstance(self.samples_per_prompt, int) or self.samples_per_prompt < 1:
      raise InputError(f"rollout.samples_per_prompt must be an integer >= 1, got {self.samples_per_prompt!r}")
    if not isinstance(self.stop_text, str):
      raise InputError(f"rollout.stop_text must be a string (\"\" = none), got {self.stop_text!r}")
    if self.weight_layout not in WEIGHT_LAYOUT_CHOICES:
      raise InputError(f"rollout.weight_layout must be one of {WEIGHT_LAYOUT_CHOICES}, got {self.weight_layout!r}")
    self.sampling(eos_ids=(), pad_id=0)  # validates temperature / top-k / top-p / max_new_tokens

  @classmethod
  def from_config(cls, rollout) -> "RolloutConfig":
    """From the `rollout` ConfigDict section (unknown fields are an error naming the field)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    values = dict(rollout)
    unknown = sorted(set(values) - fields)
    if unknown:
      raise InputError(f"config.rollout has unknown field(s) {unknown}; known: {sorted(fields)}")
    values["weight_rules"] = tuple(tuple(r) for r in values.get("weight_rules", ()))
    return cls(**values)

  @property
  def changes_weights(self) -> bool:
    """The sampler needs its own copy of the weights (a precision recipe or noise)."""
    return bool(self.weight_rules) or self.noise_sigma > 0

  def keeps_dense_copies(self, lagged: bool) -> bool:
    """Whether each kept learner version also keeps a dense copy, to split the mismatch into precision / noise
    and staleness factors: only with `split_mismatch` when lag (`lagged`: staleness or async) and a weight or
    KV knob coexist. Costs one dense copy per kept version (the loop and the memory planner both ask here)."""
    return self.split_mismatch and lagged and (self.changes_weights or self.kv_cache != "native")

  @property
  def is_exact(self) -> bool:
    """No knob changes the sampler's distribution (sampler == learner up to float reordering).

    top-k / top-p count as mismatch: the sampler renormalizes over the kept tokens while the learner scores
    the full distribution, so every sampled token has log pi - log mu = log(kept mass) < 0, and the metrics
    report that truncation as mismatch, as they should.
    """
    return (not self.changes_weights and self.kv_cache == "native" and self.staleness_steps == 0
            and self.top_k == 0 and self.top_p == 1.0)

  def sampling(self, *, eos_ids: tuple[int, ...], pad_id: int, logits_top_k: int = 0,
               samples_per_prompt: int | None = None, platform: str | None = None) -> SamplingConfig:
    """samples_per_prompt: the group size rows come in (default: this config's; GRPO passes its group_size).
    platform: the backend the sampler runs on, which `weight_layout="auto"` follows (default: jax's)."""
    return SamplingConfig(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_k=self.top_k,
                          top_p=self.top_p, eos_ids=tuple(eos_ids), pad_id=pad_id, kv_dtype=self.kv_cache,
                          logits_top_k=logits_top_k,
                          samples_per_prompt=samples_per_prompt or self.samples_per_prompt,
                          weight_layout=self.layout_on(platform))

  def layout_on(self, platform: str | None = None) -> str:
    """`weight_layout` resolved for a backend: auto is dense_layers on CPU (XLA:CPU converts quantized weights
    and slices stacked ones on every decode step otherwise: fp8 ran at 0.5x and float32 at 0.8x of this on
    SmolLM2), and stored on GPU / TPU, where dequantization fuses into the matmul and no copy is held."""
    if self.weight_layout != "auto":
      return self.weight_layout
    return "dense_layers" if (platform or jax.default_backend()) == "cpu" else "stored"

  def validate_for(self, state: nnx.State) -> None:
    """Checks the weight rules against a model's parameter paths (before any compilation)."""
    precision.validate_rules(self.weight_rules, state)


@functools.partial(jax.jit, static_argnums=(1,))
def build_sampler_state(learner_state: nnx.State, rollout: RolloutConfig, version: jax.Array) -> nnx.State:
  """The sampler's copy of a learner version: noise and precision recipe in the configured order.

  Noise for version v is drawn from fold_in(key(noise_seed), v), so it is fresh per version and reproducible.
  Without a recipe or noise the sampler shares the learner's state (no copy).
  """
  if not rollout.changes_weights:
    return learner_state
  key = jax.random.fold_in(jax.random.key(rollout.noise_seed), version)
  state = learner_state
  if rollout.noise_sigma > 0 and rollout.noise_order == "before_quant":
    state = noise.add_relative_noise(state, rollout.noise_sigma, key)
  state = precision.apply_recipe(state, rollout.weight_rules)
  if rollout.noise_sigma > 0 and rollout.noise_order == "after_quant":
    state = noise.add_relative_noise(state, rollout.noise_sigma, key)
  return state
