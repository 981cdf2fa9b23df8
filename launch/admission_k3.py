"""The admission check's step-0 k3 on every calibration point (what budget.json's k3_conversion is fitted on):

  python launch/admission_k3.py --results=results/sources.jsonl [--results=...] --out=results/admission_k3.jsonl
      [--prompts=128] [--seed=0]

Give the same results files as launch/calibrate.py; each distinct configuration is measured once, as
launch/admit.py measures a candidate (the same prompts and seed defaults). Then
`launch/calibrate.py ... --admission_k3=results/admission_k3.jsonl` carries the conversion.
"""

from absl import flags

from launch import _cli

_RESULTS = flags.DEFINE_multi_string("results", None, "Calibration sweep results.jsonl files.")
_OUT = flags.DEFINE_string("out", "admission_k3.jsonl", "JSONL file to write (one row per configuration).")
_PROMPTS = flags.DEFINE_integer("prompts", 128, "Calibration prompts (held-out split), as launch/admit.py.")
_SEED = flags.DEFINE_integer("seed", 0, "Calibration prompts and sampling key, as launch/admit.py.")


def run():
  import json
  from configs import common
  from opd_jax.errors import InputError
  from opd_jax.experiments import admission_k3
  from opd_jax.experiments.calibrate_report import load_rows
  from opd_jax.experiments.files import write_text
  from opd_jax.files import check_output_file
  if _PROMPTS.value < 1:
    raise InputError(f"--prompts={_PROMPTS.value} must be >= 1 (calibration prompts)")
  check_output_file(_OUT.value, "--out", tuple(_RESULTS.value))
  rows = admission_k3.measure(load_rows(_RESULTS.value), common.config_for,
                              num_prompts=_PROMPTS.value, seed=_SEED.value)
  write_text(_OUT.value, "".join(json.dumps(r) + "\n" for r in rows))
  print(f"wrote {len(rows)} admission measurements to {_OUT.value}")


def main(argv):
  del argv
  _cli.log_devices()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main, required=("results",))
