"""Two revisions' sampler benchmark runs side by side (launch/bench/compare.py): each run's speed relative to
transformers' generate in the same run, then this tree over the other revision."""

from __future__ import annotations

import statistics


def compare_runs(rows: dict[str, list[list[dict]]]) -> list[dict]:
  """{"this": runs, "rev": runs} (a run: its benchmark rows) -> per (target, mode, engine) the median over runs of
  each run's vs_transformers on each tree and their ratio, this / rev. Dividing by transformers' figure of the
  same run first cancels the host's drift between runs."""
  ratios: dict[tuple, dict[str, list[float]]] = {}
  for tree, runs in rows.items():
    for run_rows in runs:
      for row in run_rows:
        key = (row["target"], row["mode"], row["engine"])
        ratios.setdefault(key, {}).setdefault(tree, []).append(row["vs_transformers"])
  table = []
  for (target, mode, engine), by_tree in ratios.items():
    here, there = statistics.median(by_tree["this"]), statistics.median(by_tree["rev"])
    table.append(dict(target=target, mode=mode, engine=engine, this_vs_transformers=here,
                      rev_vs_transformers=there, this_over_rev=here / there))
  return table
