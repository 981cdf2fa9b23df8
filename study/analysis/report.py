"""The results report: PNG plots and one self-contained HTML page (images embedded).

Sections: quality vs mismatch with the budget, mismatch per source (quantization / staleness / noise),
per-pair quantization mismatch, per-layer sensitivity, prefix shift, KV-cache capacity, admission validation.
Each section is drawn from whichever inputs were given; missing inputs are listed, not faked; a section the given
results hold no runs for says so. The plots are study/analysis/plots.py's.
"""

from __future__ import annotations

import base64
import html
import os

from opd_jax.errors import InputError
from opd_jax.experiments.files import read_budget, read_json
from opd_jax.files import write_text
from opd_jax.models import shapes
from opd_jax.rollout import memory, precision
from study.analysis.plots import (load_rows, plot_per_pair_quantization, plot_quality_vs_mismatch, plot_sources,
                                   source_of)

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


def _run_sections(rows: list[dict], budget_data: dict | None, out: str) -> tuple[list, list[str]]:
  """The sweep results' sections (quality vs mismatch, per source, per pair, every run) and what has no data."""
  sections, no_data = [], []
  sections.append(("Quality vs mismatch", _img(plot_quality_vs_mismatch(rows, budget_data,
                                                                        os.path.join(out, "quality_vs_mismatch.png")))))
  present = {source_of(r) for r in rows}
  empty = [s for s in ("noise", "staleness", "quantization") if s not in present]
  note = (f"<p><i>No data for {html.escape(', '.join(empty))}: none of the given runs varies "
          f"{'it' if len(empty) == 1 else 'them'} alone.</i></p>" if empty else "")
  sources_png = plot_sources(rows, os.path.join(out, "mismatch_sources.png"))
  sections.append(("Mismatch per source", _img(sources_png) + note))
  if "quantization" in present:
    sections.append(("Quantization mismatch per pair",
                     _img(plot_per_pair_quantization(rows, os.path.join(out, "quantization_per_pair.png")))))
  else:
    no_data.append("quantization mismatch per pair (no run varies quantization alone)")
  table = sorted(rows, key=lambda r: (r["pair"], r["mismatch"].get("mismatch/k3", 0.0)))
  for r in table:
    r["k3"] = r["mismatch"].get("mismatch/k3", 0.0)
    r["source"] = source_of(r)
  sections.append(("All runs", _table(table, [
      ("pair", "pair", "{}"), ("point", "point", "{}"), ("source", "source", "{}"), ("seed", "seed", "{}"),
      ("steps", "steps", "{}"), ("learning_rate", "lr", "{:g}"), ("k3", "k3", "{:.3g}"),
      ("initial_accuracy", "acc before", "{:.3f}"), ("final_accuracy", "acc after", "{:.3f}"),
      ("delta_final_accuracy", "delta vs baseline", "{:+.3f}"), ("wall_seconds", "wall s", "{:.0f}")])))
  return sections, no_data


def _budget_section(budget_data: dict) -> tuple[str, str]:
  from opd_jax.experiments.calibrate_report import set_by_text
  budget_rows = [{"name": k, **v, "lo": v["interval"][0], "hi": v["interval"][1], "how": set_by_text(v)}
                 for k, v in budget_data["budgets"].items()]
  return ("Budget", _table(budget_rows, [("name", "pair", "{}"), ("budget", "budget k3", "{:.3g}"),
                                         ("lo", "90% low", "{:.3g}"), ("hi", "90% high", "{:.3g}"),
                                         ("how", "set by", "{}"), ("bounded", "loss observed", "{}")]))


def _sensitivity_section(path: str, data: dict, out: str) -> tuple[str, str]:
  png = path.replace(".json", ".png")
  if not os.path.isfile(png):  # the scan's own plot is not beside its JSON: draw it from the JSON
    from opd_jax.experiments.sensitivity_report import _plot as plot_sensitivity
    png = os.path.join(out, f"sensitivity_{data['pair']}_{data['precision']}.png")
    plot_sensitivity(data["groups"], data["precision"], data["pair"], data["whole_model"]["k3"], png)
  return (f"Per-layer sensitivity: {data['pair']} ({data['precision']})", _img(png))


def _shift_section(shift: dict, out: str) -> tuple[str, str]:
  from study.analysis.prefix_shift import plot as plot_shift
  png = plot_shift(shift["rows"], shift["pair"], os.path.join(out, "prefix_shift.png"))
  return ("Prefix shift", _img(png) + _table(shift["rows"], [
      ("sigma", "sigma", "{:.3g}"), ("same_prefix_k3", "k3 same prefixes", "{:.3g}"),
      ("prefix_shift", "prefix shift (nats)", "{:+.4f}"), ("k1_naive_error", "per-token err", "{:+.4f}"),
      ("k1_tis_error", "after TIS", "{:+.4f}"), ("accuracy_clean", "acc clean", "{:.3f}"),
      ("accuracy_noisy", "acc noisy", "{:.3f}")]))


def _kv_section() -> tuple[str, str]:
  return ("KV-cache capacity on one 80 GiB device (10% reserve)", _table(kv_capacity_table(), [
      ("model", "model", "{}"), ("weights", "weights", "{}"), ("kv_cache", "KV cache", "{}"),
      ("weight_gib", "weights GiB", "{:.2f}"), ("kv_bytes_per_token", "KV bytes/token", "{:,}"),
      ("kv_tokens", "KV tokens", "{:,}"), ("vs_bf16", "vs bf16", "{:.2f}x")]))


def _validation_section(valid: dict) -> tuple[str, str]:
  interval = valid.get("agreement_interval")
  return (f"Admission validation: {valid['agreement']:.0%} agreement on {len(valid['rows'])} held-out "
          "configurations" + (f" (95% Wilson interval over configurations {interval[0]:.0%}-{interval[1]:.0%})"
                              if interval else ""),
          _table([{**r, "n_seeds": len(r.get("seeds", [0]))} for r in valid["rows"]],
                 [("pair", "pair", "{}"), ("point", "point", "{}"), ("n_seeds", "seeds", "{}"),
                  ("measured", "admission k3", "{:.3g}"), ("admit", "admission", "{}"),
                  ("quality_loss", "real quality loss", "{:+.3f}"), ("real_ok", "real run ok", "{}"),
                  ("agree", "agree", "{}"), ("wall_seconds", "admit s", "{:.1f}")]))


def _page(sections: list, missing: list[str], no_data: list[str]) -> str:
  body = "".join(f"<h2>{html.escape(title)}</h2>{content}" for title, content in sections)
  if no_data:
    body += f"<p><i>Not drawn (no data in the given results): {html.escape('; '.join(no_data))}.</i></p>"
  if missing:
    body += f"<p><i>Not included (inputs not given): {html.escape(', '.join(missing))}.</i></p>"
  return ("<!doctype html><html><head><meta charset='utf-8'><title>opd_jax report</title><style>"
          "body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;margin:1em 0}"
          "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:right}img{max-width:100%}"
          f"</style></head><body><h1>opd_jax: mismatch budget report</h1>{body}</body></html>")


def build(results: list[str], out: str, *, budget: str | None = None, sensitivity: list[str] = (),
          prefix_shift: str | None = None, validation: str | None = None) -> str:
  """Writes out/*.png and out/report.html, its sections in page order; returns the HTML path."""
  rows = load_rows(results)  # every input is read and checked before anything is written
  budget_data = read_budget(budget) if budget else None
  sensitivity_data = {path: _load(path, "sensitivity file", ("pair", "precision", "groups", "whole_model"))
                      for path in sensitivity}
  shift = _load(prefix_shift, "prefix-shift file", ("rows", "pair"))
  valid = _load(validation, "validation file", ("agreement", "rows"))
  if os.path.exists(out) and not os.path.isdir(out):
    raise InputError(f"--out {out!r} is a file; give a directory for the report")
  os.makedirs(out, exist_ok=True)
  sections, missing, no_data = [], [], []
  if rows:
    sections, no_data = _run_sections(rows, budget_data, out)
  else:
    missing.append("sweep results")
  if budget_data:
    sections.append(_budget_section(budget_data))
  else:
    missing.append("budget")
  sections += [_sensitivity_section(path, sensitivity_data[path], out) for path in sensitivity]
  if not sensitivity:
    missing.append("sensitivity scans")
  if shift:
    sections.append(_shift_section(shift, out))
  else:
    missing.append("prefix-shift analysis")
  sections.append(_kv_section())
  if valid:
    sections.append(_validation_section(valid))
  else:
    missing.append("admission validation")
  path = os.path.join(out, "report.html")
  write_text(path, _page(sections, missing, no_data))
  return path
