"""The results report: PNG plots and one self-contained HTML page (images embedded).

Sections: quality vs mismatch with the budget, mismatch per source (quantization / staleness / noise),
per-pair quantization mismatch, per-layer sensitivity, prefix shift, KV-cache capacity, admission validation.
Each section is drawn from whichever inputs were given; missing inputs are listed, not faked.
"""

from __future__ import annotations

import base64
import html
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from opd_jax.experiments.files import read_budget, read_json, read_results  # noqa: E402
from opd_jax.experiments.sweep import check_one_objective, fill_deltas  # noqa: E402
from opd_jax.errors import InputError  # noqa: E402
from opd_jax.models import shapes  # noqa: E402
from opd_jax.rollout import memory, precision  # noqa: E402

SOURCES = ("baseline", "quantization", "staleness", "noise", "combined")
_COLORS = {"baseline": "#000000", "quantization": "#4477aa", "staleness": "#228833", "noise": "#cc3311",
           "combined": "#aa3377"}
_MARKERS = {"pair1": "o", "pair2": "s", "pair3": "^"}


def source_of(row: dict) -> str:
  r = row.get("rollout", {})
  parts = []
  if r.get("weights", "none") != "none" or r.get("weight_rules") or r.get("kv_cache", "native") != "native":
    parts.append("quantization")
  if r.get("staleness_steps", 0) or row.get("mode") == "async":
    parts.append("staleness")
  if r.get("noise_sigma", 0.0):
    parts.append("noise")
  return "baseline" if not parts else parts[0] if len(parts) == 1 else "combined"


def _save(fig, path: str) -> str:
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def plot_quality_vs_mismatch(rows: list[dict], budget: dict | None, path: str) -> str:
  fig, ax = plt.subplots(figsize=(7, 4.5))
  floor = 1e-7
  for row in rows:
    if "delta_final_accuracy" not in row:
      continue
    k3 = max(row["mismatch"].get("mismatch/k3", 0.0), floor)
    ax.scatter(k3, -100 * row["delta_final_accuracy"], color=_COLORS[source_of(row)],
               marker=_MARKERS.get(row["pair"], "o"), s=36)
  if budget is not None:
    b = budget["budgets"].get("pooled") or next(iter(budget["budgets"].values()))
    ax.axvline(b["budget"], color="#555555", ls="--", label=f"budget k3 = {b['budget']:.2g}")
    ax.axvspan(*b["interval"], color="#999999", alpha=0.2, label="90% interval")
    ax.axhline(100 * b["tolerance_abs"], color="#999999", lw=0.8, ls=":", label="tolerance")
  for source in SOURCES:
    ax.scatter([], [], color=_COLORS[source], label=source)
  for pair, marker in _MARKERS.items():
    ax.scatter([], [], color="#777777", marker=marker, label=pair)
  ax.set_xscale("log")
  ax.set_xlabel("run-averaged sampler-learner mismatch k3 (nats/token; 1e-7 = none)")
  ax.set_ylabel("quality loss vs baseline (accuracy points)")
  ax.set_title("OPD quality vs rollout mismatch")
  ax.legend(fontsize=7, ncol=2)
  return _save(fig, path)


def plot_sources(rows: list[dict], path: str) -> str:
  fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
  k3 = lambda r: r["mismatch"].get("mismatch/k3", 0.0)
  for pair, marker in zip(sorted({r["pair"] for r in rows}), "os^vD"):  # one curve per pair (sorted by knob)
    of_pair = [r for r in rows if r["pair"] == pair]
    noise = sorted((r for r in of_pair if source_of(r) == "noise"), key=lambda r: r["rollout"]["noise_sigma"])
    stale = sorted((r for r in of_pair if source_of(r) == "staleness"), key=lambda r: r["rollout"]["staleness_steps"])
    axes[0].plot([r["rollout"]["noise_sigma"] for r in noise], [k3(r) for r in noise], marker + "-",
                 color=_COLORS["noise"], label=pair)
    axes[1].plot([r["rollout"]["staleness_steps"] for r in stale], [k3(r) for r in stale], marker + "-",
                 color=_COLORS["staleness"], label=pair)
  quant = [r for r in rows if source_of(r) == "quantization" and r["pair"] == "pair1"]
  axes[0].set_xscale("log")
  axes[0].set_xlabel("weight noise sigma (relative)")
  axes[1].set_xlabel("staleness (learner updates)")
  axes[2].bar([r["point"] for r in quant], [k3(r) for r in quant], color=_COLORS["quantization"])
  axes[2].tick_params(axis="x", rotation=45)
  axes[2].set_xlabel("rollout precision (pair1)")
  for ax, title in zip(axes, ("noise", "staleness", "quantization")):
    ax.set_ylabel("mismatch k3 (nats/token)")
    ax.set_title(f"mismatch from {title}")
    ax.set_yscale("log")
  return _save(fig, path)


def plot_per_pair_quantization(rows: list[dict], path: str) -> str:
  quant = [r for r in rows if source_of(r) == "quantization"]
  points = sorted({r["point"] for r in quant})
  pairs = sorted({r["pair"] for r in quant})
  fig, ax = plt.subplots(figsize=(10, 4))
  width = 0.8 / max(len(pairs), 1)
  for i, pair in enumerate(pairs):
    values = {r["point"]: r["mismatch"].get("mismatch/k3", 0.0) for r in quant if r["pair"] == pair}
    ax.bar(np.arange(len(points)) + i * width, [values.get(p, 0.0) for p in points], width, label=pair)
  ax.set_xticks(np.arange(len(points)) + width * (len(pairs) - 1) / 2, points, rotation=30)
  ax.set_yscale("log")
  ax.set_ylabel("mismatch k3 (nats/token)")
  ax.set_xlabel("rollout precision")
  ax.set_title("quantization mismatch per pair")
  ax.legend()
  return _save(fig, path)


KV_TABLE_SHAPES = ("qwen3-8b", "llama-3.1-8b", "qwen3-1.7b")  # shipped real shapes (opd_jax.models.shapes)


def kv_capacity_table(device_gib: float = 80.0) -> list[dict]:
  """KV tokens that fit on one device for real shapes: bf16 vs int8 / fp8 recipes and KV dtypes."""
  out = []
  for name, config in ((shapes.display_name(n), shapes.load(n)) for n in KV_TABLE_SHAPES):
    base = memory.kv_capacity(config, (), "bf16", device_bytes=int(device_gib * 2 ** 30))
    # The last row is the shape of the model-specific recipes the sensitivity scan emits for every embedded
    # pair (the most sensitive decoder layer, layer 0, kept in bf16; every other decoder Linear in fp8).
    keep_layer0 = ((r"^layers\.0\.", "bf16"),) + precision.recipe_rules("fp8")
    for label, rules, kv in (("bf16", (), "bf16"), ("int8", precision.recipe_rules("int8"), "bf16"),
                             ("fp8", precision.recipe_rules("fp8"), "bf16"), ("bf16", (), "fp8_e4m3"),
                             ("int8", precision.recipe_rules("int8"), "int8"),
                             ("fp8", precision.recipe_rules("fp8"), "fp8_e4m3"),
                             ("fp8, layer 0 bf16", keep_layer0, "fp8_e4m3")):
      cap = memory.kv_capacity(config, rules, kv, device_bytes=int(device_gib * 2 ** 30))
      out.append({"model": name, "weights": label, "kv_cache": kv,
                  "weight_gib": cap.weight_bytes / 2 ** 30, "kv_bytes_per_token": cap.kv_bytes_per_token,
                  "kv_tokens": cap.kv_tokens, "vs_bf16": cap.kv_tokens / base.kv_tokens})
  return out


def _table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
  head = "".join(f"<th>{html.escape(title)}</th>" for _, title, _ in columns)
  body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt.format(r.get(key)) if r.get(key) is not None else '')}</td>"
                                  for key, _, fmt in columns) + "</tr>" for r in rows)
  return f"<table><tr>{head}</tr>{body}</table>"


def _img(path: str) -> str:
  with open(path, "rb") as f:
    data = base64.b64encode(f.read()).decode()
  return f'<img src="data:image/png;base64,{data}" alt="{html.escape(os.path.basename(path))}">'


def _load(path: str | None, what: str, fields: tuple[str, ...]) -> dict | None:
  """The JSON input file, checked for the fields the report reads; None when not given."""
  if not path:
    return None
  data = read_json(path, what)
  missing = [f for f in fields if f not in data]
  if missing:
    raise InputError(f"{what} {path!r} lacks {', '.join(map(repr, missing))}; pass the file its command wrote")
  return data


def build(results: list[str], out: str, *, budget: str | None = None, sensitivity: list[str] = (),
          prefix_shift: str | None = None, validation: str | None = None) -> str:
  """Writes out/*.png and out/report.html; returns the HTML path."""
  rows = []  # every input is read and checked before anything is written
  for path in results:
    rows += [r for r in fill_deltas(read_results(path)) if r.get("status") == "ok"]
  check_one_objective(rows)
  budget_data = read_budget(budget) if budget else None
  sensitivity_data = {path: _load(path, "sensitivity file", ("pair", "precision")) for path in sensitivity}
  shift = _load(prefix_shift, "prefix-shift file", ("rows", "pair"))
  valid = _load(validation, "validation file", ("agreement", "rows"))
  if os.path.exists(out) and not os.path.isdir(out):
    raise InputError(f"--out {out!r} is a file; give a directory for the report")
  os.makedirs(out, exist_ok=True)
  sections, missing = [], []
  if rows:
    sections.append(("Quality vs mismatch", _img(plot_quality_vs_mismatch(rows, budget_data,
                                                                          os.path.join(out, "quality_vs_mismatch.png")))))
    sections.append(("Mismatch per source", _img(plot_sources(rows, os.path.join(out, "mismatch_sources.png")))))
    sections.append(("Quantization mismatch per pair",
                     _img(plot_per_pair_quantization(rows, os.path.join(out, "quantization_per_pair.png")))))
    table = sorted(rows, key=lambda r: (r["pair"], r["mismatch"].get("mismatch/k3", 0.0)))
    for r in table:
      r["k3"] = r["mismatch"].get("mismatch/k3", 0.0)
      r["source"] = source_of(r)
    sections.append(("All runs", _table(table, [
        ("pair", "pair", "{}"), ("point", "point", "{}"), ("source", "source", "{}"), ("k3", "k3", "{:.3g}"),
        ("initial_accuracy", "acc before", "{:.3f}"), ("final_accuracy", "acc after", "{:.3f}"),
        ("delta_final_accuracy", "delta vs baseline", "{:+.3f}"), ("wall_seconds", "wall s", "{:.0f}")])))
  else:
    missing.append("sweep results")
  if budget_data:
    budget_rows = [{"name": k, **v, "lo": v["interval"][0], "hi": v["interval"][1], "r2": v["fit"]["r2"]}
                   for k, v in budget_data["budgets"].items()]
    sections.append(("Budget", _table(budget_rows, [("name", "pair", "{}"), ("budget", "budget k3", "{:.3g}"),
                                                    ("lo", "90% low", "{:.3g}"), ("hi", "90% high", "{:.3g}"),
                                                    ("r2", "fit r2", "{:.2f}"), ("bounded", "loss observed", "{}")])))
  else:
    missing.append("budget")
  for path in sensitivity:
    data = sensitivity_data[path]
    png = path.replace(".json", ".png")
    if os.path.isfile(png):
      sections.append((f"Per-layer sensitivity: {data['pair']} ({data['precision']})", _img(png)))
  if not sensitivity:
    missing.append("sensitivity scans")
  if shift:
    from opd_jax.experiments.prefix_shift_report import plot as plot_shift
    png = plot_shift(shift["rows"], shift["pair"], os.path.join(out, "prefix_shift.png"))
    sections.append(("Prefix shift", _img(png) + _table(shift["rows"], [
        ("sigma", "sigma", "{:.3g}"), ("same_prefix_k3", "k3 same prefixes", "{:.3g}"),
        ("prefix_shift", "prefix shift (nats)", "{:+.4f}"), ("k1_naive_error", "per-token err", "{:+.4f}"),
        ("k1_tis_error", "after TIS", "{:+.4f}"), ("accuracy_clean", "acc clean", "{:.3f}"),
        ("accuracy_noisy", "acc noisy", "{:.3f}")])))
  else:
    missing.append("prefix-shift analysis")
  sections.append(("KV-cache capacity on one 80 GiB device (10% reserve)", _table(kv_capacity_table(), [
      ("model", "model", "{}"), ("weights", "weights", "{}"), ("kv_cache", "KV cache", "{}"),
      ("weight_gib", "weights GiB", "{:.2f}"), ("kv_bytes_per_token", "KV bytes/token", "{:,}"),
      ("kv_tokens", "KV tokens", "{:,}"), ("vs_bf16", "vs bf16", "{:.2f}x")])))
  if valid:
    interval = valid.get("agreement_interval")
    sections.append((f"Admission validation: {valid['agreement']:.0%} agreement on {len(valid['rows'])} held-out "
                     "configurations" + (f" (95% interval {interval[0]:.0%}-{interval[1]:.0%})" if interval else ""),
                     _table([{**r, "n_seeds": len(r.get("seeds", [0]))} for r in valid["rows"]],
                            [("pair", "pair", "{}"), ("point", "point", "{}"), ("n_seeds", "seeds", "{}"),
                             ("measured", "admission k3", "{:.3g}"), ("admit", "admission", "{}"),
                             ("quality_loss", "real quality loss", "{:+.3f}"), ("real_ok", "real run ok", "{}"),
                             ("agree", "agree", "{}"), ("wall_seconds", "admit s", "{:.1f}")])))
  else:
    missing.append("admission validation")
  body = "".join(f"<h2>{html.escape(title)}</h2>{content}" for title, content in sections)
  if missing:
    body += f"<p><i>Not included (inputs not given): {html.escape(', '.join(missing))}.</i></p>"
  page = ("<!doctype html><html><head><meta charset='utf-8'><title>opd_jax report</title><style>"
          "body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;margin:1em 0}"
          "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:right}img{max-width:100%}"
          f"</style></head><body><h1>opd_jax: mismatch budget report</h1>{body}</body></html>")
  path = os.path.join(out, "report.html")
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.write(page)
  os.replace(tmp, path)
  return path
