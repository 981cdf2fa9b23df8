"""Report: python -m study.report --results=DIR/results.jsonl [--results=...] --budget=budget.json --out=report/
    [--sensitivity=runs/sensitivity_pair1/sensitivity_fp8_e4m3.json ...] [--prefix_shift=.../prefix_shift.json]
    [--validation=validation.json]
  python -m study.report --rejudge --validation=results/validation_pairs.json --budget=results/budget.json
  python -m study.report --figures=docs/img      # the study's figures, from the shipped results/ files

Writes PNG plots and out/report.html (self-contained). With --validate, first runs the admission-check
validation (held-out sweep points, judged with --budget as launch/admit.py judges them) and writes
out/validation.json. With --rejudge, judges a stored validation's measurements again with --budget (no measuring)
and writes the file back; without --results it writes no report. With --figures=DIR, draws only the study's figures
(quality vs mismatch, mismatch per source) from the shipped files study/analysis/figures.py lists, each with a
DIR/<name>.png.inputs.json sidecar holding the command and the sha256 of every input (tests/test_figures.py
checks docs/img against them).
"""

import os

from absl import flags

from launch import _cli

_RESULTS = flags.DEFINE_multi_string("results", [], "Sweep results.jsonl files.")
_BUDGET = flags.DEFINE_string("budget", None, "budget.json from launch/calibrate.py.")
_SENSITIVITY = flags.DEFINE_multi_string("sensitivity", [], "sensitivity_*.json from launch/sensitivity.py.")
_PREFIX = flags.DEFINE_string("prefix_shift", None, "prefix_shift.json from study/prefix_shift.py.")
_VALIDATION = flags.DEFINE_string("validation", None, "validation.json (existing, or written by --validate).")
_VALIDATE = flags.DEFINE_bool("validate", False, "Run the admission validation first.")
_REJUDGE = flags.DEFINE_bool("rejudge", False, "Judge --validation's stored measurements again with --budget (the "
                             "file and rule launch/admit.py uses) and write it back.")
_HOLDOUT = flags.DEFINE_float("holdout_fraction", 0.3, "Share of sweep points held out for validation.")
_HELDOUT = flags.DEFINE_multi_string("heldout_results", [], "--validate: results.jsonl of configurations the budget "
                                     "has not seen (e.g. configs/sweeps/boundary.py, one file per seed); replaces "
                                     "the hash hold-out.")
_EXCLUDE = flags.DEFINE_list("heldout_exclude", [], "--validate: pair/point rows of --heldout_results to leave out "
                              "(e.g. pair3/k3_low when it repeats a calibration configuration).")
_SEED_MEANS = flags.DEFINE_bool("seed_means", False, "--validate: calibrate on seed means, as launch/calibrate.py "
                                 "--seed_means (give every seed's --results file).")
_ADMISSION_K3 = flags.DEFINE_string("admission_k3", None, "--validate: launch/admission_k3.py's measurements of the "
                                    "calibration points; the budget carries the step-0 / run-mean k3 factor, as "
                                    "launch/calibrate.py --admission_k3.")
_TOLERANCE = flags.DEFINE_float("tolerance", 0.02, "Budget tolerance for validation (accuracy points).")
_PROMPTS = flags.DEFINE_integer("prompts", 128, "Calibration prompts for validation's admission checks.")
_OUT = flags.DEFINE_string("out", "report", "Output directory.")
_FIGURES = flags.DEFINE_string("figures", None, "Draw only the study's figures, from the shipped results/ files "
                               "study/analysis/figures.py lists, into this directory (docs/img), with inputs "
                               "sidecars; takes no other input flag.")


def run():
  from study.analysis import report
  from opd_jax.errors import InputError
  if _FIGURES.value:
    _draw_figures()
    return
  validation = _VALIDATION.value
  if not 0 < _HOLDOUT.value < 1 or not 0 < _TOLERANCE.value < 1 or _PROMPTS.value < 1:
    raise InputError(f"--holdout_fraction={_HOLDOUT.value:g} and --tolerance={_TOLERANCE.value:g} must be in (0, 1) "
                     f"and --prompts={_PROMPTS.value} >= 1")
  if (_HELDOUT.value or _EXCLUDE.value or _SEED_MEANS.value or _ADMISSION_K3.value) and not _VALIDATE.value:
    raise InputError("--heldout_results, --heldout_exclude, --seed_means and --admission_k3 are only read with "
                     "--validate")
  if _REJUDGE.value:
    from opd_jax.experiments.files import read_budget, read_json, write_json
    from study.analysis.validation import rejudge
    if _VALIDATE.value or not validation or not _BUDGET.value:
      raise InputError("--rejudge needs --validation=FILE and --budget=budget.json, and no --validate")
    result = rejudge(read_json(validation, "validation file"), read_budget(_BUDGET.value), _BUDGET.value)
    write_json(validation, result)
    print(f"{validation}: admission with {_BUDGET.value} agrees with the real run on {result['agreed']} of "
          f"{result['n']} held-out configurations")
    if not _RESULTS.value:
      return
  if _VALIDATE.value:  # before the measuring
    from opd_jax.files import check_output_dir
    check_output_dir(_OUT.value, "--out")
  if _VALIDATE.value:
    from configs import common
    from opd_jax.experiments.calibrate_report import load_rows
    from opd_jax.experiments.files import read_admission_k3, read_budget, write_json
    from opd_jax.experiments.files import file_hash
    from study.analysis.validation import validate
    if _HELDOUT.value and not _BUDGET.value:
      raise InputError("--validate with --heldout_results judges them with the budget file admission uses: give "
                       "--budget=results/budget.json")
    heldout = [row for path in _HELDOUT.value for row in load_rows([path])]
    unknown = sorted(set(_EXCLUDE.value) - {f"{r['pair']}/{r['point']}" for r in heldout})
    if unknown:
      raise InputError(f"--heldout_exclude names {unknown}, which no --heldout_results row has (give pair/point)")
    heldout = [r for r in heldout if f"{r['pair']}/{r['point']}" not in _EXCLUDE.value]
    result = validate(load_rows(_RESULTS.value), common.config_for,
                      holdout_fraction=_HOLDOUT.value, tolerance=_TOLERANCE.value, relative=False,
                      num_prompts=_PROMPTS.value, heldout=heldout, seed_means=_SEED_MEANS.value,
                      budget_file=read_budget(_BUDGET.value) if _BUDGET.value else None,
                      admission_k3=read_admission_k3(_ADMISSION_K3.value) if _ADMISSION_K3.value else None)
    if _BUDGET.value:
      result.update(budget_file=_BUDGET.value, budget_sha256=file_hash(_BUDGET.value))
    os.makedirs(_OUT.value, exist_ok=True)
    validation = validation or os.path.join(_OUT.value, "validation.json")
    write_json(validation, result)
    lo, hi = result["agreement_interval"]
    print(f"admission agrees with the real run on {result['agreed']} of {result['n']} held-out configurations "
          f"({result['agreement']:.0%}, 95% interval [{lo:.0%}, {hi:.0%}]); admission "
          f"{result['admission_seconds_per_candidate']:.1f} s per candidate vs {result['run_seconds_per_seed']:.0f} s "
          "per training run")
  path = report.build(_RESULTS.value, _OUT.value, budget=_BUDGET.value, sensitivity=_SENSITIVITY.value,
                      prefix_shift=_PREFIX.value, validation=validation)
  print(f"wrote {path}")


def _draw_figures():
  from opd_jax.errors import InputError
  from study.analysis import figures
  given = [f"--{f.name}" for f in (_RESULTS, _BUDGET, _SENSITIVITY, _PREFIX, _VALIDATION, _VALIDATE, _REJUDGE,
                                   _HELDOUT, _EXCLUDE, _SEED_MEANS, _ADMISSION_K3) if f.present]
  if given:
    raise InputError(f"--figures draws from the fixed list of shipped files in study/analysis/figures.py; "
                     f"drop {', '.join(given)} (or drop --figures for a report of your own files)")
  for path in figures.render(_FIGURES.value):
    print(f"wrote {path} and {os.path.basename(path)}{figures.SIDECAR}")


def main(argv):
  del argv
  _cli.log_devices()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
