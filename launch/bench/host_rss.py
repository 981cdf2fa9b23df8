"""Host memory of a run, predicted and measured: launch/plan_memory.py --host_rss next to the peak RSS of
launch/train.py on the same config, as a ratio.

  python launch/bench/host_rss.py --name=pair1_main --train_args="--config=configs/pair1.py" \
      [--out=results/host_rss.jsonl] [--workdir=DIR] [--max_rss_gb=12] [--timeout_s=0]

--train_args are the run's --config arguments (one shell-quoted string, --config.x=v overrides included); both
the planner and the run get exactly these. Both run without the persistent compilation cache (what a fresh
machine does; a warm cache lowers the run's compile memory). The run is a child process whose own peak RSS is
the kernel's ru_maxrss (exact); it is killed past --max_rss_gb. Prints the prediction's terms, the measured
peak and predicted / measured; --out keeps one row per --name (opd_jax/bench/host_rss.py). GB = 1e9 bytes.
For the real-vocabulary pair, launch/bench/scale.py --predict does the same per objective.
"""

import os
import shlex
import sys
import tempfile

from absl import flags

from launch import _cli
from opd_jax.errors import InputError
from opd_jax.files import check_output_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_NAME = flags.DEFINE_string("name", None, "Row name in --out (e.g. pair1_main).")
_TRAIN_ARGS = flags.DEFINE_string("train_args", None, "The run's --config arguments, one shell-quoted string.")
_OUT = flags.DEFINE_string("out", "", "JSONL file keeping one row per --name; empty = print only.")
_WORKDIR = flags.DEFINE_string("workdir", None, "The run's workdir (default: a new temp dir).")
_MAX_RSS_GB = flags.DEFINE_float("max_rss_gb", 12.0, "Kill the run when its resident memory passes this (GB).")
_TIMEOUT_S = flags.DEFINE_integer("timeout_s", 0, "Kill the run after this many seconds; 0 = no limit.")


def run() -> int:
  from opd_jax.bench import host_rss
  args = shlex.split(_TRAIN_ARGS.value)
  if not args or not all(arg.startswith("--config") for arg in args):
    raise InputError(f"--train_args={_TRAIN_ARGS.value!r} must be --config=FILE and --config.x=v arguments only")
  if _OUT.value:
    check_output_file(_OUT.value, "--out")
  env = dict(os.environ, OPD_JAX_COMPILATION_CACHE="off")
  predicted = host_rss.predict_host_rss(os.path.join(REPO, "launch", "plan_memory.py"), args, env)
  print("predicted: " + ", ".join(f"{k} {v / 1e9:.3f} GB" for k, v in predicted.items() if k.endswith("bytes")),
        file=sys.stderr, flush=True)
  workdir = _WORKDIR.value or tempfile.mkdtemp(prefix=f"host_rss_{_NAME.value}_")
  os.makedirs(workdir, exist_ok=True)
  cmd = [sys.executable, os.path.join(REPO, "launch", "train.py"), *args, f"--workdir={workdir}"]
  result = host_rss.run_guarded(cmd, os.path.join(workdir, "train.log"), int(_MAX_RSS_GB.value * 1e9),
                                _TIMEOUT_S.value, env, cwd=REPO)
  ratio = predicted["peak_bytes"] / result["peak_rss_bytes"]
  print("| run | predicted GB (runtime + compile + device) | measured peak GB | predicted / measured | wall s | exit |")
  print("|---|---|---|---|---|---|")
  parts = " + ".join(f"{predicted[k] / 1e9:.2f}" for k in ("runtime_bytes", "compile_bytes", "device_bytes"))
  print(f"| {_NAME.value} | {predicted['peak_bytes'] / 1e9:.2f} ({parts}) | {result['peak_rss_bytes'] / 1e9:.2f} | "
        f"{ratio:.2f} | {result['wall_s']:.0f} | {result['exit']} {result['killed']} |")
  if _OUT.value and not result["exit"]:
    host_rss.write_row(_OUT.value, {"name": _NAME.value, "command": "python " + shlex.join(sys.argv),
                                    "predicted": predicted, **{k: result[k] for k in ("peak_rss_bytes", "wall_s")}})
  return result["exit"]


def main(argv):
  del argv
  sys.exit(1 if _cli.run_or_exit(run) else 0)


if __name__ == "__main__":
  _cli.run(main, required=("name", "train_args"))
