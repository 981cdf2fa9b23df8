"""Budget calibration from sweep results:

  python launch/calibrate.py --results=DIR/results.jsonl --out=budget.json [--tolerance=0.02] [--relative]
      [--quality=accuracy|reverse_kl]
      [--pair_test=results/pair_budgets.json] [--seed_means] [--admission_k3=results/admission_k3.jsonl]
      [--horizon_test]

Fits quality loss vs mismatch (k3 primary; k1, tv, mult_prob_error reported too), per pair and pooled, with
bootstrap intervals, and says how far the per-pair budgets differ (does one budget transfer across pairs?).
"""

from absl import flags

from launch import _cli

_RESULTS = flags.DEFINE_multi_string("results", None, "One or more sweep results.jsonl files.")
_OUT = flags.DEFINE_string("out", "budget.json", "Budget file to write.")
_TOLERANCE = flags.DEFINE_float("tolerance", 0.02, "Allowed quality loss: accuracy points (0..1), or a fraction "
                                "of the baseline accuracy with --relative.")
_RELATIVE = flags.DEFINE_bool("relative", False, "Tolerance relative to the baseline accuracy.")
_QUALITY = flags.DEFINE_enum("quality", "accuracy", ["accuracy", "reverse_kl"],
                             "What a point loses against its seed's baseline: final held-out accuracy (points), or "
                             "the rise of its final held-out reverse KL to the teacher as a fraction of the "
                             "baseline's (a real pair's measure).")
_HOLDOUT = flags.DEFINE_string("holdout", "", "Point names excluded from calibration (comma-separated), "
                               "kept for validating the admission check.")
_SEED_MEANS = flags.DEFINE_bool("seed_means", False, "Each point is the mean over its seeds (the same sweep run "
                                 "with seed=S, one results file per seed); the interval resamples points, then seeds.")
_PAIR_TEST = flags.DEFINE_string("pair_test", None, "pair_budgets.json from study/pair_budgets.py: its decision "
                                 "(per-pair or pooled budgets) goes into the budget file, and admission follows it.")
_ADMISSION_K3 = flags.DEFINE_string("admission_k3", None, "launch/admission_k3.py's measurements of these points: "
                                    "the budget file carries the measured factor from the admission check's step-0 "
                                    "k3 to the budgets' run-mean k3 (k3_conversion), and admission divides by it.")
_HORIZON_TEST = flags.DEFINE_bool("horizon_test", False, "Run the pre-registered horizon test "
                                  "(opd_jax/experiments/horizon.py) over --results (with --seed_means) and write its "
                                  "decision into budget.json: admission picks a budget per run length only when it "
                                  "says run length moves the budget.")


def run():
  from opd_jax.experiments import calibrate_report
  holdout = [p for p in _HOLDOUT.value.split(",") if p]
  calibrate_report.run(_RESULTS.value, _OUT.value, tolerance=_TOLERANCE.value, relative=_RELATIVE.value,
                       holdout=holdout, pair_test=_PAIR_TEST.value, seed_means=_SEED_MEANS.value,
                       admission_k3=_ADMISSION_K3.value, horizon_test=_HORIZON_TEST.value,
                       quality=_QUALITY.value)


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main, required=("results",))
