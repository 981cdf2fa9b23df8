"""Screen and select the pre-registered held-out validation (configs/sweeps/validation_heldout.py); no training.

  python -m study.heldout_screen --pair=pair1     # -> results/validation_heldout/screen_pair1.json
  python -m study.heldout_screen --select         # the rule on the three screens -> .../selected.json

--pair measures every candidate of study.analysis.heldout's pool that the pair never trained in a shipped
results file, with the admission check launch/admit.py --candidates runs, and judges it with --budget at the
sweep's 150 steps. --select applies the written rule (heldout.RULE) to the screen files and writes the points the
sweep config reads, with the sweep's cost estimated from the wall time of similar shipped runs.
"""

import os

from absl import flags

from launch import _cli
from opd_jax.errors import InputError

_PAIR = flags.DEFINE_string("pair", None, "Screen this pair (pair1, pair2 or pair3).")
_SELECT = flags.DEFINE_bool("select", False, "Apply the selection rule to the screen files.")
_BUDGET = flags.DEFINE_string("budget", "results/budget.json", "The budget file admission uses.")
_RESULTS = flags.DEFINE_string("results_dir", "results", "Shipped results: the runs a candidate must not repeat.")
_OUT = flags.DEFINE_string("out_dir", "results/validation_heldout", "Where the screens and the selection go.")
_SIMILAR = flags.DEFINE_list("similar", ["results/pair_budgets_seed0.jsonl", "results/pair_budgets_seed1.jsonl",
                                         "results/pair_budgets_seed2.jsonl"],
                             "--select: shipped 150-step runs of the same pairs, for the cost estimate.")


def screen(pair: str) -> None:
  from configs import common
  from study.analysis import heldout
  from opd_jax.experiments.files import read_budget, write_json
  from opd_jax.planning.plan_spec import GIB, resolve_model
  if pair not in heldout.PAIRS:
    raise InputError(f"--pair={pair!r} is not one of {list(heldout.PAIRS)}")
  budget_file = read_budget(_BUDGET.value)
  bases = {p: dict(common.config_for(p).rollout) for p in heldout.PAIRS}
  trained = heldout.trained_before(heldout.shipped_rows(_RESULTS.value, skip=_OUT.value), bases)
  result = heldout.screen_pair(common.config_for(pair), budget_file, _BUDGET.value, trained, bases,
                               shape=resolve_model("qwen3-8b", "--shape"), device_bytes=80 * GIB)
  os.makedirs(_OUT.value, exist_ok=True)
  path = os.path.join(_OUT.value, f"screen_{pair}.json")
  write_json(path, result)
  for row in sorted(result["rows"], key=lambda r: r["compared"]):
    print(f"  {row['candidate']:<26} k3 {row['measured']:9.3g}  compared {row['compared']:9.3g}  "
          f"{row['compared'] / row['budget']:6.2f}x the {row['budget_source']} budget")
  print(f"{len(result['rows'])} candidates in {result['seconds']:.0f} s ({len(result['excluded'])} excluded: trained "
        f"before) -> {path}")


def select() -> None:
  from study.analysis import heldout
  from opd_jax.experiments.files import read_budget, read_json, read_jsonl, write_json
  paths = {p: os.path.join(_OUT.value, f"screen_{p}.json") for p in heldout.PAIRS}
  missing = [path for path in paths.values() if not os.path.isfile(path)]
  if missing:
    raise InputError(f"no screen file(s) {missing}; run --pair=<pair> for each first")
  screens = {p: read_json(path, "screen file") for p, path in paths.items()}
  similar = {path: read_jsonl(path, "results file") for path in _SIMILAR.value}
  result = heldout.selection_file(screens, paths, read_budget(_BUDGET.value), _BUDGET.value, similar)
  path = os.path.join(_OUT.value, "selected.json")
  write_json(path, result)
  for pair, points in result["points"].items():
    for p in points:
      print(f"  {pair} {p['name']:<26} compared k3 {p['compared']:8.3g}  {p['ratio']:5.2f}x  {p['band']:<9} "
            f"{'real' if p['real'] else 'noise'}")
  cost = result["cost_estimate"]
  print(f"{sum(map(len, result['points'].values()))} configurations; the sweep: {cost['total_runs']} runs, about "
        f"{cost['seconds'] / 3600:.1f} h -> {path}")


def run() -> None:
  if _SELECT.value == bool(_PAIR.value):
    raise InputError("give exactly one of --pair=<pair> (screen it) and --select (apply the rule to the screens)")
  select() if _SELECT.value else screen(_PAIR.value)


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
