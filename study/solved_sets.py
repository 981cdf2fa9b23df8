"""Which held-out problems trained students solve, and how much their solved sets overlap:

  python -m study.solved_sets --config=configs/pair2.py --run=NAME=WORKDIR/export [--run=...] --out=sets.json

Greedy answers through transformers (the test extra: torch) on the config's held-out problems (train.eval_size
of them, the same the training loop evaluates); prints each run's solved count by number of terms and, per pair of
runs, how many verdicts agree. Tells two runs with equal accuracy apart (docs/limits.md: pair2's equal counts).
"""

import os

from absl import flags
from ml_collections import config_flags

from launch import _cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Pair config, e.g. configs/pair2.py.", lock_config=True)
_RUNS = flags.DEFINE_multi_string("run", None, "NAME=DIR: an exported student (a run's workdir/export).")
_OUT = flags.DEFINE_string("out", None, "Write the verdicts and overlaps here (JSON).")
_SIZE = flags.DEFINE_integer("problems", 256, "Held-out problems (the sweeps evaluate 256).")


def run():
  from opd_jax.data.problems import get_problems
  from opd_jax.errors import InputError
  from opd_jax.files import check_output_file
  from study.analysis import solved_sets
  from opd_jax.experiments.files import write_json
  from opd_jax.spec import DataSpec
  if _SIZE.value < 1:
    raise InputError(f"--problems={_SIZE.value} must be >= 1")
  runs = {}
  for spec in _RUNS.value:
    name, sep, path = spec.partition("=")
    if not sep or not name or not os.path.isdir(path):
      raise InputError(f"--run={spec!r} must be NAME=DIR with DIR an exported student folder (a run's export/)")
    runs[name] = path
  if _OUT.value:
    check_output_file(_OUT.value, "--out")
  config, d = _CONFIG.value, _CONFIG.value.data
  problems = get_problems(d.source, "heldout", _SIZE.value, d.seed, DataSpec.from_section(config.data).task, d.train_file, d.heldout_file)
  verdicts = {name: solved_sets.solved(path, problems) for name, path in runs.items()}
  result = solved_sets.compare(verdicts, problems)
  for name, r in result["runs"].items():
    print(f"{name:<24} solved {r['solved']:>3} / {len(problems)}  by terms "
          + "  ".join(f"{k}: {a}/{b}" for k, (a, b) in r["by_terms"].items()))
  for p in result["pairs"]:
    print(f"{p['a']} vs {p['b']}: same verdict on {p['same_verdict']} of {len(problems)}, both solved "
          f"{p['both_solved']}")
  if _OUT.value:
    write_json(_OUT.value, {"config": config.pair, **result})
    print(f"wrote {_OUT.value}")


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main, required=("config", "run"))
