"""Screen and select a pre-registered held-out validation of admission; no training.

  python -m study.heldout_screen --pair=pair1     # -> results/validation_heldout/screen_pair1.json
  python -m study.heldout_screen --select         # the rule on the three screens -> .../selected.json
  python -m study.heldout_screen --plan=smollm2 --pair=smollm2   # the real pair's -> results/smollm2/validation/
  python -m study.heldout_screen --plan=smollm2 --select

--plan picks the validation (study.analysis.heldout.PLANS): `embedded` (configs/sweeps/validation_heldout.py, the
default) or `smollm2` (configs/sweeps/smollm2_validation.py). --pair measures every candidate of the plan's pool
that the pair never trained in the plan's shipped results files, with the admission check launch/admit.py
--candidates runs, and judges it with the plan's budget file at the plan's run length. --select applies the plan's
written rule to the screen files and writes the points the sweep config reads, with the sweep's cost estimated
from the wall time of similar shipped runs.
"""

import os

from absl import flags

from launch import _cli
from opd_jax.errors import InputError

_PLAN = flags.DEFINE_string("plan", "embedded", "Which validation: embedded (pair1-3) or smollm2 (the real pair).")
_PAIR = flags.DEFINE_string("pair", None, "Screen this pair (one of the plan's: pair1, pair2, pair3; smollm2).")
_SELECT = flags.DEFINE_bool("select", False, "Apply the selection rule to the screen files.")
_BUDGET = flags.DEFINE_string("budget", None, "The budget file admission uses (default: the plan's).")
_RESULTS = flags.DEFINE_string("results_dir", "results", "Shipped results: the runs a candidate must not repeat.")
_OUT = flags.DEFINE_string("out_dir", None, "Where the screens and the selection go (default: the plan's).")
_SIMILAR = flags.DEFINE_list("similar", None, "--select: shipped runs of the same pairs at the plan's length, for "
                             "the cost estimate (default: the plan's).")


def _plan():
  from opd_jax.files import check_output_dir
  from study.analysis import heldout
  plan = heldout.plan_for(_PLAN.value)
  out_dir = _OUT.value or plan.out_dir
  check_output_dir(out_dir, "--out_dir")  # before the screening
  return plan, _BUDGET.value or plan.budget, out_dir


def screen(pair: str) -> None:
  from configs import common
  from study.analysis import heldout
  from opd_jax.experiments.files import read_budget, write_json
  from opd_jax.planning.plan_spec import GIB, resolve_model
  plan, budget, out_dir = _plan()
  if pair not in plan.pairs:
    raise InputError(f"--pair={pair!r} is not one of the {plan.name} plan's pairs {list(plan.pairs)}")
  budget_file = read_budget(budget)
  bases = {p: dict(common.config_for(p).rollout) for p in plan.pairs}
  shipped = heldout.shipped_rows(_RESULTS.value, skip=out_dir, pattern=plan.trained_in)
  trained = heldout.trained_before(shipped, bases)
  result = heldout.screen_pair(common.config_for(pair), budget_file, budget, trained, bases,
                               shape=resolve_model("qwen3-8b", "--shape"), device_bytes=80 * GIB, plan=plan)
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, f"screen_{pair}.json")
  write_json(path, result)
  for row in sorted(result["rows"], key=lambda r: r["compared"]):
    print(f"  {row['candidate']:<26} k3 {row['measured']:9.3g}  compared {row['compared']:9.3g}  "
          f"{row['compared'] / row['budget']:6.2f}x the {row['budget_source']} budget")
  print(f"{len(result['rows'])} candidates in {result['seconds']:.0f} s ({len(result['excluded'])} excluded: trained "
        f"before) -> {path}")


def select() -> None:
  from study.analysis import heldout
  from opd_jax.experiments.files import read_budget, read_json, read_jsonl, write_json
  plan, budget, out_dir = _plan()
  paths = {p: os.path.join(out_dir, f"screen_{p}.json") for p in plan.pairs}
  missing = [path for path in paths.values() if not os.path.isfile(path)]
  if missing:
    raise InputError(f"no screen file(s) {missing}; run --pair=<pair> for each first")
  screens = {p: read_json(path, "screen file") for p, path in paths.items()}
  similar = {path: read_jsonl(path, "results file") for path in (_SIMILAR.value or plan.similar)}
  result = heldout.selection_file(screens, paths, read_budget(budget), budget, similar, plan)
  path = os.path.join(out_dir, "selected.json")
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
