"""Transfer: a pair's held-out validation judged again with another budget file, beside its own (issue 35, item 5),
and what its own calibration cost against one training run.

  python -m study.transfer --validation=results/smollm2/validation/validation.json --budget=results/budget.json \
      --main_run=results/smollm2/run_v4_beta0.5/seed0/time.json --main_run=... \
      --out=results/smollm2/validation/transfer.json

--validation is study/report.py --validate's file for the pair (rows judged with the pair's own budget file);
--budget the other file (the embedded pairs' pooled budget and factor); --main_run the time.json of each seed of the
pair's main run (its wall_seconds). No training and no measuring: the stored admission k3 is judged again.
"""

from absl import flags

from launch import _cli

_VALIDATION = flags.DEFINE_string("validation", None, "The pair's validation file (study/report.py --validate).")
_BUDGET = flags.DEFINE_string("budget", "results/budget.json", "The budget file calibrated elsewhere.")
_MAIN_RUN = flags.DEFINE_multi_string("main_run", [], "time.json of each seed of the pair's main run.")
_OUT = flags.DEFINE_string("out", None, "Where the comparison goes (JSON).")


def run():
  from opd_jax.errors import InputError
  from opd_jax.files import check_output_file
  from opd_jax.experiments.files import read_budget, read_json, write_json
  from study.analysis import transfer
  if not _MAIN_RUN.value:
    raise InputError("give --main_run=<time.json> for each seed of the pair's main run (the cost's yardstick)")
  check_output_file(_OUT.value, "--out", (_VALIDATION.value, _BUDGET.value, *_MAIN_RUN.value))
  validation = read_json(_VALIDATION.value, "validation file")
  result = transfer.transfer(validation, read_budget(_BUDGET.value), _BUDGET.value)
  own_path = validation.get("budget_file")
  if not own_path:
    raise InputError(f"{_VALIDATION.value} does not name its budget file; validate with --budget=FILE")
  seconds = [read_json(path, "time file")["wall_seconds"] for path in _MAIN_RUN.value]
  result["calibration_cost"] = transfer.calibration_cost(read_budget(own_path), seconds)
  write_json(_OUT.value, result)
  for side in ("own", "transferred"):
    s = result[side]
    print(f"{side:>11}: admission agrees with the real runs on {s['agreed']} of {s['n']} "
          f"(95% Wilson {s['agreement_interval'][0]:.0%}-{s['agreement_interval'][1]:.0%})")
  cost = result["calibration_cost"]
  print(f"calibration: {cost['runs']} runs, {cost['seconds'] / 3600:.1f} h = {cost['main_runs_equivalent']:.1f} main "
        f"runs -> {_OUT.value}")


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main, required=("validation", "out"))
