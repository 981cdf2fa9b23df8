"""Markdown for the results tables: the one table writer every table module uses, and the number formats they
share."""

from __future__ import annotations

import math
from typing import Callable


def md_table(header: list[str], body: list[list[str]]) -> str:
  """A GitHub markdown table: the header row, its rule, one row per list of cells."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(cells) + " |" for cells in body]
  return "\n".join(lines)


def g3(x) -> str:
  """Three significant digits; n/a for a missing or NaN value."""
  return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"


def mean_cell(values: list[float], show: Callable[[float], str] = lambda x: f"{x:.3f}", collapse: bool = True) -> str:
  """The seed mean of `values` and its 95% t-interval, "mean [lo, hi]", each number written by `show`; one value
  alone for a single seed, or (collapse) where every seed gives the same (a greedy evaluation of the same weights),
  to within the float noise between hosts (1e-6 relative: runs on two machines differ at the seventh digit)."""
  from opd_jax.experiments.intervals import t_interval
  if len(values) < 2 or collapse and max(values) - min(values) <= 1e-6 * max(abs(v) for v in values):
    return show(values[0])
  lo, hi = t_interval(values)
  return f"{show(sum(values) / len(values))} [{show(lo)}, {show(hi)}]"
