"""The pre-registered per-pair budget decision from configs/sweeps/pair_budgets.py's runs (one results file per
seed; each holds the pairs' baselines):

  python -m study.pair_budgets --results=results/pair_budgets_seed0.jsonl --results=results/pair_budgets_seed1.jsonl \
      --results=results/pair_budgets_seed2.jsonl --out=results/pair_budgets.json

Prints each point's seed-mean quality loss with its interval and the decision (per-pair or pooled budgets);
`launch/calibrate.py --pair_test=results/pair_budgets.json` writes the decision into budget.json.
"""

from absl import flags

from launch import _cli

_RESULTS = flags.DEFINE_multi_string("results", None, "results.jsonl of configs/sweeps/pair_budgets.py, one per seed.")
_OUT = flags.DEFINE_string("out", "pair_budgets.json", "Decision file to write.")
_TOLERANCE = flags.DEFINE_float("tolerance", 0.05, "Allowed quality loss (accuracy points, 0..1): the budgets'.")


def run():
  from opd_jax.errors import InputError
  from opd_jax.experiments.calibrate_report import load_rows
  from opd_jax.experiments.files import write_json
  from opd_jax.experiments.pair_budgets import decide
  from opd_jax.files import check_output_file
  if not 0 < _TOLERANCE.value < 1:
    raise InputError(f"--tolerance={_TOLERANCE.value:g} must be in (0, 1)")
  check_output_file(_OUT.value, "--out", tuple(_RESULTS.value))
  result = decide(load_rows(_RESULTS.value), _TOLERANCE.value)
  result["results"] = list(_RESULTS.value)
  for p in result["points"]:
    lo, hi = p["interval"]
    print(f"{p['pair']:<6} {p['point']:<15} run k3 {p['run_k3']:.3g}  loss {100 * p['quality_loss']:+5.1f} "
          f"[{100 * lo:+5.1f}, {100 * hi:+5.1f}] {p['side']:<9} per seed "
          + ", ".join(f"{100 * s['quality_loss']:+.1f}" for s in p["seeds"]))
  print(f"decision: {result['decision']} ({result['outcome']})")
  write_json(_OUT.value, result)
  print(f"wrote {_OUT.value}")


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main, required=("results",))
