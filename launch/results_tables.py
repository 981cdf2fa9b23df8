"""Prints the README's result tables from the shipped result files (markdown), so README numbers can be
refreshed by copying and are checked against the files by tests/test_results.py.

  python launch/results_tables.py [--results_dir=results]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402

from launch import _cli  # noqa: E402
from opd_jax.errors import InputError  # noqa: E402

_DIR = flags.DEFINE_string("results_dir", "results", "Folder with the shipped result files.")


def run():
  from opd_jax.experiments.results_tables import all_tables
  if not os.path.isdir(_DIR.value):
    raise InputError(f"--results_dir={_DIR.value!r} is not a folder; the shipped results are in results/")
  tables = all_tables(_DIR.value)
  if not tables:
    raise InputError(f"--results_dir={_DIR.value!r} holds none of the result files (sources.jsonl, budget.json, ...)")
  for title, table in tables.items():
    print(f"### {title}\n\n{table}\n")


def main(argv):
  del argv
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
