"""The study's plots of sweep results: quality vs mismatch with the budget, mismatch per source (quantization /
staleness / noise) and per pair. A panel the given results hold no runs for says so instead of drawing empty
axes, legends list only series that have points, and runs of one configuration over several seeds are drawn as
their seed mean with a 95% t-interval of that mean as error bars (a one-seed point has none). Pairs prepared
from a real model (REAL_PAIR_QUALITY) measure quality on their own task, so their quality losses get a panel of
their own. The report (study/analysis/report.py) and the docs figures (study/analysis/figures.py) draw with these.
"""

from __future__ import annotations

import collections
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from opd_jax.experiments.files import read_results  # noqa: E402
from opd_jax.experiments.intervals import T_INTERVAL, t_interval  # noqa: E402
from opd_jax.experiments.sweep import check_one_objective, fill_deltas  # noqa: E402

SOURCES = ("baseline", "quantization", "staleness", "noise", "combined")
_COLORS = {"baseline": "#000000", "quantization": "#4477aa", "staleness": "#228833", "noise": "#cc3311",
           "combined": "#aa3377"}
_MARKERS = {"pair1": "o", "pair2": "s", "pair3": "^"}
_EXTRA_MARKERS = "DvP*Xph<>"  # pairs beyond the embedded three, in sorted order
_PAIR_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
_FILLS = ("full", "none", "left", "bottom", "right", "top")  # run settings (steps, learning rate): most common first
_FLOOR = 1e-7  # k3 below this is no mismatch (rounding); drawn at the floor on log axes
_SPREAD = f"points: seed mean; bars: {T_INTERVAL}"
# Pairs prepared from a real model (configs/sweeps/common.py REAL_PAIRS) -> what their accuracy measures.
REAL_PAIR_QUALITY = {"smollm2": "capitals accuracy"}
EMBEDDED_QUALITY = "arithmetic accuracy"  # what every embedded pair's accuracy measures
_KNOBS = {"noise": ("noise_sigma", "weight noise sigma (relative)"),
          "staleness": ("staleness_steps", "staleness (learner updates)")}


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
  fig.savefig(path, format="png", dpi=110, bbox_inches="tight")  # keeps legends placed beside the axes
  plt.close(fig)
  return path


def _legend(ax, handles=None, **kwargs) -> None:
  """A legend only where there is something labelled to put in it."""
  if handles is None:
    handles, _ = ax.get_legend_handles_labels()
  if handles:
    ax.legend(handles=handles, **kwargs)


def _no_data(ax, message: str) -> None:
  ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, fontsize=9, color="#555555",
          wrap=True)
  ax.set_xticks([])
  ax.set_yticks([])


def _config_key(row: dict) -> tuple:
  """What makes two runs the same configuration, whatever their seed."""
  return (row["pair"], row["point"], row.get("steps"), row.get("learning_rate"), row.get("mode"), row.get("objective"),
          json.dumps(row.get("rollout", {}), sort_keys=True), json.dumps(row.get("overrides", {}), sort_keys=True))


def _unique_runs(rows: list[dict]) -> list[dict]:
  """One row per configuration and seed (the last given): sweeps that share a baseline run ship it in each file."""
  latest = {}
  for row in rows:
    latest[_config_key(row) + (row.get("seed", 0),)] = row
  return list(latest.values())


def _setting(row: dict) -> tuple:
  return row.get("steps"), row.get("learning_rate")


def _settings(rows: list[dict]) -> dict:
  """Run settings (steps, learning rate) -> marker fill style, the most common setting filled."""
  counts = collections.Counter(_setting(r) for r in rows)
  ordered = sorted(counts, key=lambda s: (-counts[s], str(s)))
  return {s: _FILLS[min(i, len(_FILLS) - 1)] for i, s in enumerate(ordered)}


def _describe(setting: tuple, main: tuple | None = None) -> str:
  """'75 steps, lr 0.004'; with main, only what differs from it."""
  steps, lr = setting
  parts = []
  if main is None or steps != main[0]:
    parts.append(f"{steps} steps" if steps is not None else "steps unknown")
  if main is None or lr != main[1]:
    parts.append(f"lr {lr:g}" if lr is not None else "lr unknown")
  return ", ".join(parts)


def _pair_styles(rows: list[dict]) -> dict:
  """pair -> (marker, colour), the same in every figure drawn from the same rows."""
  extra = iter(_EXTRA_MARKERS)
  return {p: (_MARKERS.get(p) or next(extra, "o"), _PAIR_COLORS[i % len(_PAIR_COLORS)])
          for i, p in enumerate(sorted({r["pair"] for r in rows}))}


def _k3(row: dict, floor: float = _FLOOR) -> float:
  return max(row["mismatch"].get("mismatch/k3", 0.0), floor)


def _none_at(rows: list[dict]) -> float:
  """Where to draw runs without mismatch on a log k3 axis: the decade below the smallest mismatch measured, so
  the axis spans the measured range rather than down to rounding noise."""
  measured = [r["mismatch"].get("mismatch/k3", 0.0) for r in rows]
  measured = [k for k in measured if k >= _FLOOR]
  return 10.0 ** (np.floor(np.log10(min(measured))) - 1) if measured else _FLOOR


def _stat(values: list[float], floor: float | None = None) -> tuple[float, float, float]:
  """(seed mean, low, high): the 95% t-interval of the mean with >= 2 values, (mean, mean) with one; `floor`
  clips the low end (a magnitude drawn on log axes)."""
  mean = float(np.mean(values))
  lo, hi = t_interval(values) if len(values) > 1 else (mean, mean)
  return mean, lo if floor is None else max(lo, floor), hi


def _groups(rows: list[dict], floor: float = _FLOOR) -> list[dict]:
  """Runs of one configuration grouped over seeds: seed mean and 95% t-interval of k3 and of the quality loss
  (accuracy points vs the baseline of each run's own results file; None where a run has no baseline)."""
  by_config: dict[tuple, list[dict]] = {}
  for row in _unique_runs(rows):
    by_config.setdefault(_config_key(row), []).append(row)
  out = []
  for runs in by_config.values():
    losses = [-100 * r["delta_final_accuracy"] for r in runs if "delta_final_accuracy" in r]
    out.append({"pair": runs[0]["pair"], "point": runs[0]["point"], "source": source_of(runs[0]),
                "setting": _setting(runs[0]), "rollout": runs[0].get("rollout", {}), "n": len(runs),
                "seeds": sorted(r.get("seed", 0) for r in runs), "k3": _stat([_k3(r, floor) for r in runs], floor),
                "loss": _stat(losses) if len(losses) == len(runs) else None})
  return out


def _bars(stats: list[tuple[float, float, float]]) -> np.ndarray:
  """(mean, low, high) per point -> matplotlib's asymmetric error bars (clipped at 0 against rounding)."""
  return np.maximum(np.array([[m - lo for m, lo, _ in stats], [hi - m for m, _, hi in stats]]), 0.0)


def _draw(ax, xs, groups: list[dict], *, marker: str, color: str, fill: str, label: str, line: str = "") -> None:
  """Seed means as markers (joined by `line`), with t-interval bars on the points that have several seeds."""
  ys = [g["k3"][0] for g in groups]
  ax.plot(xs, ys, marker=marker, ls=line or "none", color=color, fillstyle=fill, label=label, ms=6)
  spread = [(x, g["k3"]) for x, g in zip(xs, groups) if g["n"] > 1]
  if spread:
    ax.errorbar([x for x, _ in spread], [s[0] for _, s in spread], yerr=_bars([s for _, s in spread]), fmt="none",
                ecolor=color, elinewidth=1, capsize=3)


def _series(groups: list[dict]) -> dict:
  """(pair, setting) -> its groups."""
  out: dict[tuple, list[dict]] = {}
  for g in sorted(groups, key=lambda g: (g["pair"], str(g["setting"]))):
    out.setdefault((g["pair"], g["setting"]), []).append(g)
  return out


def _label(pair: str, setting: tuple, main: tuple) -> str:
  return pair if setting == main else f"{pair} ({_describe(setting, main)})"


def _quality_panels(groups: list[dict]) -> list[tuple[str, str, list[dict]]]:
  """(title, quality measure, groups) per panel: the embedded pairs on one, each real pair on its own; a panel
  without points is left out (the embedded one is kept when there is nothing else to draw)."""
  panels = [("embedded pairs", EMBEDDED_QUALITY, [g for g in groups if g["pair"] not in REAL_PAIR_QUALITY])]
  panels += [(f"real pair {p}", REAL_PAIR_QUALITY[p], [g for g in groups if g["pair"] == p])
             for p in sorted({g["pair"] for g in groups} & set(REAL_PAIR_QUALITY))]
  return [p for p in panels if p[2]] or panels[:1]


def _draw_budget(ax, budget: dict, with_tolerance: bool) -> list:
  """The pooled budget (dashed), its 90% interval and, on the quality measure it was set on, the tolerance."""
  name = "pooled" if "pooled" in budget["budgets"] else next(iter(budget["budgets"]))
  b = budget["budgets"][name]
  horizon = f", {b['steps']}-step runs" if b.get("steps") else ""
  handles = [ax.axvline(b["budget"], color="#555555", ls="--",
                        label=f"budget k3 = {b['budget']:.2g} ({name}{horizon})"),
             ax.axvspan(*b["interval"], color="#999999", alpha=0.2, label="90% interval of the budget")]
  if with_tolerance:
    handles.append(ax.axhline(100 * b["tolerance_abs"], color="#999999", lw=0.8, ls=":",
                              label=f"tolerance ({EMBEDDED_QUALITY})"))
  return handles


def plot_quality_vs_mismatch(rows: list[dict], budget: dict | None, path: str) -> str:
  styles, fills = _pair_styles(rows), _settings(rows)
  none_at = _none_at(rows)
  groups = [g for g in _groups(rows, none_at) if g["loss"] is not None]
  panels = _quality_panels(groups)
  fig, axes = plt.subplots(1, len(panels), figsize=(9 + 3.5 * (len(panels) - 1), 5), sharex=True,
                           squeeze=False, gridspec_kw={"width_ratios": [2.5] + [1.0] * (len(panels) - 1)})
  handles = []
  for ax, (title, measure, of_panel) in zip(axes[0], panels):
    for g in of_panel:
      kwargs = {"fmt": styles[g["pair"]][0], "color": _COLORS[g["source"]], "fillstyle": fills[g["setting"]], "ms": 6}
      if g["n"] > 1:
        kwargs.update(xerr=_bars([g["k3"]]), yerr=_bars([g["loss"]]), elinewidth=0.8, capsize=2)
      ax.errorbar([g["k3"][0]], [g["loss"][0]], **kwargs)
    if budget is not None:
      drawn = _draw_budget(ax, budget, with_tolerance=measure == EMBEDDED_QUALITY)
      handles = handles or drawn
    ax.set_xscale("log")
    ax.set_xlabel(f"run-averaged sampler-learner mismatch k3\n(nats/token; {none_at:g} = none)")
    ax.set_ylabel(f"quality loss vs baseline ({measure} points)")
    ax.set_title(f"{title}: {measure}", fontsize=10)
  present = {g["source"] for g in groups}
  handles += [Line2D([], [], ls="none", marker="o", color=_COLORS[s], label=s) for s in SOURCES if s in present]
  pairs = sorted({g["pair"] for g in groups})
  handles += [Line2D([], [], ls="none", marker=styles[p][0], color="#777777", label=p) for p in pairs]
  settings = [s for s in fills if any(g["setting"] == s for g in groups)]
  if len(settings) > 1:  # fill style tells run lengths / learning rates apart
    handles += [Line2D([], [], ls="none", marker="o", color="#777777", fillstyle=fills[s], label=_describe(s))
                for s in settings]
  if any(g["n"] > 1 for g in groups):
    handles.append(Line2D([], [], ls="none", marker="|", ms=12, color="#777777",
                          label=f"bars: {T_INTERVAL}\n(points with >= 2 seeds;\none-seed points have none)"))
  fig.suptitle("OPD quality vs rollout mismatch (" + _SPREAD + ", where a configuration has several)", fontsize=10)
  _legend(axes[0][-1], handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
  return _save(fig, path)


def _plot_knob(ax, groups: list[dict], source: str, styles: dict, fills: dict, main: tuple) -> None:
  key, xlabel = _KNOBS[source]
  ax.set_xlabel(xlabel)
  if not groups:
    _no_data(ax, f"no data: none of the given runs\nvaries {source} alone")
    return
  for (pair, setting), series in _series(groups).items():
    series = sorted(series, key=lambda g: g["rollout"].get(key, 0))
    marker, color = styles[pair]
    _draw(ax, [g["rollout"].get(key, 0) for g in series], series, marker=marker, color=color, fill=fills[setting],
          label=_label(pair, setting, main), line="-" if setting == main else "--")
  if source == "noise":
    ax.set_xscale("log")
  ax.set_yscale("log")
  _legend(ax, fontsize=7)


def _plot_by_point(ax, groups: list[dict], styles: dict, fills: dict, main: tuple) -> None:
  """Categorical x (the sweep points), one marker series per pair, side by side."""
  points = sorted({g["point"] for g in groups})
  series = _series(groups)
  width = 0.5 / max(len(series), 1)
  for i, ((pair, setting), of_series) in enumerate(series.items()):
    offset = (i - (len(series) - 1) / 2) * width
    marker, color = styles[pair]
    _draw(ax, [points.index(g["point"]) + offset for g in of_series], of_series, marker=marker, color=color,
          fill=fills[setting], label=_label(pair, setting, main))
  ax.set_xticks(np.arange(len(points)), points, rotation=30, ha="right")
  ax.set_xlim(-0.5, len(points) - 0.5)
  ax.set_yscale("log")
  ax.grid(axis="y", alpha=0.3)


def plot_sources(rows: list[dict], path: str) -> str:
  fig, axes = plt.subplots(1, 3, figsize=(14, 4.4))
  styles, fills = _pair_styles(rows), _settings(rows)
  main = next(iter(fills), None)
  groups = _groups(rows)
  for ax, source in zip(axes[:2], ("noise", "staleness")):
    _plot_knob(ax, [g for g in groups if g["source"] == source], source, styles, fills, main)
  quant = [g for g in groups if g["source"] == "quantization"]
  axes[2].set_xlabel("rollout precision (sweep point)")
  if quant:
    _plot_by_point(axes[2], quant, styles, fills, main)
    _legend(axes[2], fontsize=7)
  else:
    _no_data(axes[2], "no data: none of the given runs\nvaries quantization alone")
  for ax, title in zip(axes, ("noise", "staleness", "quantization")):
    ax.set_ylabel("mismatch k3 (nats/token)")
    ax.set_title(f"mismatch from {title}")
  fig.suptitle(_SPREAD + " where a point has several; colour and marker: pair", fontsize=9)
  return _save(fig, path)


def plot_per_pair_quantization(rows: list[dict], path: str) -> str:
  styles, fills = _pair_styles(rows), _settings(rows)
  quant = [g for g in _groups(rows) if g["source"] == "quantization"]
  fig, ax = plt.subplots(figsize=(10, 4.2))
  if quant:
    _plot_by_point(ax, quant, styles, fills, next(iter(fills)))
    _legend(ax, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  else:
    _no_data(ax, "no data: none of the given runs varies quantization alone")
  ax.set_ylabel("mismatch k3 (nats/token)")
  ax.set_xlabel("rollout precision (sweep point)")
  ax.set_title("quantization mismatch per pair\n(" + _SPREAD + ", where a point has several)", fontsize=10)
  return _save(fig, path)


def load_rows(results: list[str]) -> list[dict]:
  """The finished runs of the given results files (deltas vs each file's own baseline), one per configuration and
  seed; results that mix objectives are an error."""
  rows = []
  for path in results:
    rows += [r for r in fill_deltas(read_results(path)) if r.get("status") == "ok"]
  check_one_objective(rows)
  return _unique_runs(rows)
