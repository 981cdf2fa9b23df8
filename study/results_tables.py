"""The results page (markdown) from the shipped result files: printed, or written to --out.

  python -m study.results_tables --out=docs/results.md [--results_dir=results]

tests/test_results.py checks that docs/results.md is what this writes, and that every table README.md and the
other docs pages quote is one of these, verbatim.
"""

import os
import sys

from absl import flags

from launch import _cli
from opd_jax.errors import InputError

_DIR = flags.DEFINE_string("results_dir", "results", "Folder with the shipped result files.")
_OUT = flags.DEFINE_string("out", "", "Write the page here (whole-file write) instead of printing it.")


def run():
  from opd_jax.experiments.files import write_text
  from opd_jax.files import check_output_file
  from study.tables.results import all_tables, render_page
  if not os.path.isdir(_DIR.value):
    raise InputError(f"--results_dir={_DIR.value!r} is not a folder; the shipped results are in results/")
  if _OUT.value:
    check_output_file(_OUT.value, "--out", example="results.md")
  if not all_tables(_DIR.value):
    raise InputError(f"--results_dir={_DIR.value!r} holds none of the result files (sources.jsonl, budget.json, ...)")
  page = render_page(_DIR.value)
  if _OUT.value:
    write_text(_OUT.value, page)
    print(f"wrote {_OUT.value}", file=sys.stderr)
  else:
    print(page, end="")


def main(argv):
  del argv
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
