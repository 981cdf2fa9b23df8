"""Per-layer and per-module quantization sensitivity, and model-specific recipes built from it.

For each group of weights (one decoder layer's Linear kernels; one module type across layers: q, k, v, o,
gate, up, down; the embedding; the untied lm_head), quantize only that group and measure the mismatch it adds
against the unquantized learner on a calibration batch (`Calibration.measure`: k3 on the sampler's own tokens
plus exact vocabulary KL). All groups use the same sampling key (common random numbers).

`fit_recipe` then keeps the most sensitive decoder layers in bf16, one at a time in ranked order, until the
whole-model recipe's measured k3 is at or under a target; what remains is quantized.
"""

from __future__ import annotations

import dataclasses

import jax

from opd_jax.screening.calibration import Calibration
from opd_jax.rollout import precision as precision_lib
from opd_jax.rollout.config import RolloutConfig

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def layer_regex(layer: int) -> str:
  return rf"^layers\.{layer}\.(self_attn|mlp)\.\w+_proj\.kernel$"


def groups(num_layers: int, tied: bool) -> list[tuple[str, str, str]]:
  """(kind, name, regex) of every group the scan quantizes on its own."""
  out = [("layer", f"layer {i}", layer_regex(i)) for i in range(num_layers)]
  out += [("module", m, rf"^layers\.\d+\.(self_attn|mlp)\.{m}\.kernel$") for m in MODULES]
  out.append(("module", "embed", r"^embed_tokens\.embedding$"))
  if not tied:
    out.append(("module", "lm_head", r"^lm_head\.kernel$"))
  return out


def scan(cal: Calibration, precision: str, rollout: RolloutConfig, seed: int = 0) -> list[dict]:
  """One row per group: {kind, name, regex, k3, k1, vocab KL, ...}, sorted by k3 (largest first)."""
  precision = precision_lib.canonical_precision(precision)
  key = jax.random.key(seed)
  rows = []
  num_layers = sum(1 for p in precision_lib.param_paths(cal.params) if p.endswith("input_layernorm.weight"))
  tied = not any(p.startswith("lm_head") for p in precision_lib.param_paths(cal.params))
  for kind, name, regex in groups(num_layers, tied):
    candidate = dataclasses.replace(rollout, weights="none", weight_rules=((regex, precision),))
    metrics = cal.measure(candidate, key)
    rows.append({"kind": kind, "name": name, "regex": regex, "precision": precision, **metrics})
  return sorted(rows, key=lambda r: -r["k3"])


def fit_recipe(cal: Calibration, precision: str, rollout: RolloutConfig, layer_rows: list[dict], target_k3: float,
               seed: int = 0) -> dict:
  """Keeps ranked layers in bf16 until measured whole-model k3 <= target_k3.

  Returns {"rules", "k3", "kept_bf16", "trace"}; rules are ready for config.rollout.weight_rules.
  """
  key = jax.random.key(seed)
  quantize_all = precision_lib.recipe_rules(precision)
  ranked = [r for r in layer_rows if r["kind"] == "layer"]
  kept, trace = [], []
  while True:
    rules = tuple((r["regex"], "bf16") for r in kept) + quantize_all
    candidate = dataclasses.replace(rollout, weights="none", weight_rules=rules)
    k3 = cal.measure(candidate, key)["k3"]
    trace.append({"kept_bf16": [r["name"] for r in kept], "k3": k3})
    if k3 <= target_k3 or len(kept) == len(ranked):
      return {"rules": [list(r) for r in rules], "k3": k3, "kept_bf16": [r["name"] for r in kept],
              "target_k3": target_k3, "precision": precision, "trace": trace}
    kept.append(ranked[len(kept)])
