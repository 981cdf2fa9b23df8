"""A refactor's equivalence check: the same training runs on the working tree and on REV, metrics compared.

  python launch/bench/same_metrics.py --rev=HEAD~1                  # pair1 :runlocal, 150 steps, lagged fp8
  python launch/bench/same_metrics.py --rev=f7c697d --runs=runlocal

Checks REV out into a temporary git worktree and runs launch/train.py of each tree on the same configs, one after
the other (each in its own process, single device, the trees' own code), then compares every metrics.jsonl row
key by key, timings aside (perf/*, time/*, eval/seconds), and samples.jsonl byte for byte. Prints one line per
run and exits 1 when any value, key or sample differs. A change that should keep every number (a refactor) runs
this before the old path goes (docs/contributing.md). Takes about 4 minutes on 2 CPU cores.

It also prints each run's training time (time/train_s: the updates, without start-up and evaluations) on both
trees side by side, with the ratio; --rounds=N runs each pair N times in alternating order (REV first, then this
tree first, ...) and prints the medians, the speed check of a change to the loop or the train step. Run it with
nothing else on the machine.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from absl import flags

from launch import _cli
from opd_jax.errors import InputError

_REV = flags.DEFINE_string("rev", None, "The git revision to compare with (a commit, tag or branch).")
_RUNS = flags.DEFINE_list("runs", ["runlocal", "steps150", "lagged_fp8"], "Which runs (RUNS below).")
_ROUNDS = flags.DEFINE_integer("rounds", 1, "Runs of each tree per config, in alternating order (timing medians).")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNS = {  # name: launch/train.py flags
    "runlocal": ["--config=configs/pair1.py:runlocal"],
    "steps150": ["--config=configs/pair1.py", "--config.train.steps=150"],
    "lagged_fp8": ["--config=configs/pair1.py", "--config.train.steps=60", "--config.train.eval_every=30",
                   "--config.rollout.weights=fp8", "--config.rollout.staleness_steps=2"],
    # the real pair (prepared on first use), 10 updates, a small evaluation at both ends: about 3 minutes a run
    "smollm2_10": ["--config=configs/smollm2.py", "--config.train.steps=10", "--config.train.eval_every=10",
                   "--config.train.eval_size=8", "--config.train.eval_batch_size=8", "--config.train.eval_samples=8",
                   "--config.train.checkpoint_every=10"],
}
TIMING = ("perf/", "time/", "eval/seconds")


def _train(tree: str, flags_: list[str], workdir: str) -> None:
  env = dict(os.environ, PYTHONPATH=tree, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)  # one device, default optimization: the run as a user makes it
  proc = subprocess.run([sys.executable, os.path.join(tree, "launch", "train.py"), *flags_, f"--workdir={workdir}",
                         "--config.train.progress_bar=False", "--config.train.export_dtype="],
                        env=env, cwd=tree, capture_output=True, text=True)
  if proc.returncode:
    raise RuntimeError(f"launch/train.py failed on {tree} (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def _rows(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def differences(base: list[dict], new: list[dict]) -> tuple[int, list[str]]:
  """(values compared, what differs) between two runs' metrics rows, timings aside."""
  if len(base) != len(new):
    return 0, [f"{len(base)} rows on REV, {len(new)} here"]
  compared, found = 0, []
  for a, b in zip(base, new):
    keys_a, keys_b = ({k for k in r if not k.startswith(TIMING)} for r in (a, b))
    found += [f"step {a.get('step')}: key {k!r} only {'on REV' if k in keys_a else 'here'}" for k in
              sorted(keys_a ^ keys_b)]
    for k in sorted(keys_a & keys_b):
      compared += 1
      if a[k] != b[k]:
        found.append(f"step {a.get('step')}: {k} {a[k]!r} on REV, {b[k]!r} here")
  return compared, found


def train_seconds(rows: list[dict]) -> float:
  """time/train_s of the run's last row that has it: the updates' wall time, start-up and evaluations excluded."""
  return [r["time/train_s"] for r in rows if "time/train_s" in r][-1]


def _compare(name: str, commit: str, base: str, new: str) -> bool:
  """Prints one line for a pair of runs; True when any value, key or sample differs."""
  compared, found = differences(_rows(base), _rows(new))
  with open(os.path.join(base, "samples.jsonl"), "rb") as a, open(os.path.join(new, "samples.jsonl"), "rb") as b:
    if a.read() != b.read():
      found.append("samples.jsonl differs")
  print(f"{name}: {compared} values compared against {commit[:7]}, "
        f"{'identical' if not found else f'{len(found)} differ'}" + "".join(f"\n  {f}" for f in found[:20]),
        flush=True)
  return bool(found)


def run() -> int:
  unknown = sorted(set(_RUNS.value) - set(RUNS))
  if unknown:
    raise InputError(f"--runs: unknown {unknown}; choose from {sorted(RUNS)}")
  if _ROUNDS.value < 1:
    raise InputError(f"--rounds={_ROUNDS.value}: give 1 or more runs of each tree per config")
  commit = _cli.git(ROOT, "rev-parse", "--verify", f"{_REV.value}^{{commit}}")
  scratch = tempfile.mkdtemp(prefix="opd_jax_same_metrics_")
  base_tree = os.path.join(scratch, "rev")
  _cli.git(ROOT, "worktree", "add", "--detach", base_tree, commit)
  failed = False
  try:
    for name in _RUNS.value:
      seconds = {base_tree: [], ROOT: []}
      for round_ in range(_ROUNDS.value):
        trees = (base_tree, ROOT) if round_ % 2 == 0 else (ROOT, base_tree)
        dirs = {tree: os.path.join(scratch, f"{name}_{'rev' if tree == base_tree else 'here'}_{round_}")
                for tree in trees}
        for tree, workdir in dirs.items():
          _train(tree, RUNS[name], workdir)
          seconds[tree].append(train_seconds(_rows(workdir)))
        failed |= _compare(name, commit, dirs[base_tree], dirs[ROOT])
      rev_s, here_s = (float(np.median(seconds[t])) for t in (base_tree, ROOT))
      print(f"  train time (median of {_ROUNDS.value}): {rev_s:.1f} s on {commit[:7]}, {here_s:.1f} s here "
            f"({here_s / rev_s:.3f}x)", flush=True)
  finally:
    _cli.git(ROOT, "worktree", "remove", "--force", base_tree)
    shutil.rmtree(scratch, ignore_errors=True)
  return 1 if failed else 0


def main(argv):
  del argv
  sys.exit(_cli.run_or_exit(run))


if __name__ == "__main__":
  _cli.run(main, required=("rev",))
