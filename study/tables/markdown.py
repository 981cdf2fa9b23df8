"""Markdown for the results tables: the one table writer every table module uses, and the number formats they
share."""

from __future__ import annotations

import math


def md_table(header: list[str], body: list[list[str]]) -> str:
  """A GitHub markdown table: the header row, its rule, one row per list of cells."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(cells) + " |" for cells in body]
  return "\n".join(lines)


def g3(x) -> str:
  """Three significant digits; n/a for a missing or NaN value."""
  return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"
