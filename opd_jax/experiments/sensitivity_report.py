"""The sensitivity scan as a command: table, JSON, bar chart and recipe files."""

from __future__ import annotations

import dataclasses
import os

import jax

from opd_jax.experiments.files import write_json
from opd_jax.models import read_hf_config
from opd_jax.rollout import memory, precision
from opd_jax.screening.calibration import Calibration
from opd_jax.screening.sensitivity import fit_recipe, scan
from opd_jax.spec import RunSpec


def run(spec: RunSpec, weights: str, out: str, *, num_prompts: int, target_k3: float, seed: int) -> dict:
  weights = precision.canonical_precision(weights)
  rollout = spec.rollout
  cal = Calibration.from_spec(spec, num_prompts, seed)
  rows = scan(cal, weights, rollout, seed)
  whole = cal.measure(dataclasses.replace(rollout, weights=weights, weight_rules=()), jax.random.key(seed))
  target = target_k3 if target_k3 >= 0 else whole["k3"] / 2
  recipe = fit_recipe(cal, weights, rollout, rows, target, seed)
  model_config = read_hf_config(spec.pair.student)
  recipe["weight_bytes"] = memory.weight_bytes(model_config, tuple(tuple(r) for r in recipe["rules"]))
  recipe["weight_bytes_bf16"] = memory.weight_bytes(model_config, ())
  recipe["whole_model_k3"] = whole["k3"]
  recipe["pair"] = spec.pair.name

  print(f"{spec.pair.name}: {weights} sensitivity on {num_prompts} held-out prompts "
        f"(whole-model {weights} k3 = {whole['k3']:.3g})")
  print(f"{'rank':>4}  {'group':<12} {'k3':>10} {'k1':>10} {'vocab KL':>10}")
  for i, r in enumerate(rows):
    print(f"{i + 1:>4}  {r['name']:<12} {r['k3']:>10.3g} {r['k1']:>10.3g} {r['vocab/kl_sampler_learner']:>10.3g}")
  print(f"recipe: keep {recipe['kept_bf16'] or 'nothing'} in bf16 -> k3 {recipe['k3']:.3g} "
        f"(target {target:.3g}); weights {recipe['weight_bytes'] / recipe['weight_bytes_bf16']:.2f}x of bf16")

  os.makedirs(out, exist_ok=True)
  write_json(os.path.join(out, f"sensitivity_{weights}.json"),
             {"pair": spec.pair.name, "precision": weights, "prompts": num_prompts, "whole_model": whole, "groups": rows})
  write_json(os.path.join(out, f"recipe_{weights}.json"), recipe)
  _plot(rows, weights, spec.pair.name, whole["k3"], os.path.join(out, f"sensitivity_{weights}.png"))
  print(f"wrote {out}/sensitivity_{weights}.json, .png and recipe_{weights}.json; use it with "
        f"--config=configs/{spec.pair.name}.py:recipe={out}/recipe_{weights}.json")
  return {"groups": rows, "recipe": recipe}


def _plot(rows: list[dict], weights: str, pair: str, whole_k3: float, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1, 1.6]})
  for ax, kind, title in ((axes[0], "layer", "one decoder layer"), (axes[1], "module", "one module type")):
    subset = [r for r in rows if r["kind"] == kind]
    if kind == "layer":
      subset = sorted(subset, key=lambda r: int(r["name"].split()[1]))
    ax.bar([r["name"].replace("layer ", "L") for r in subset], [r["k3"] for r in subset], color="#4477aa")
    ax.set_title(f"{pair}: {weights} on {title}")
    ax.set_ylabel("added mismatch k3 (nats/token)")
    ax.set_xlabel("quantized group")
    ax.tick_params(axis="x", rotation=45)
    ax.axhline(whole_k3, color="#cc3311", lw=1, ls="--", label=f"whole model k3 = {whole_k3:.2g}")
    ax.legend(fontsize=8)
  fig.tight_layout()
  tmp = path + ".tmp.png"
  fig.savefig(tmp, dpi=110)
  plt.close(fig)
  os.replace(tmp, path)
