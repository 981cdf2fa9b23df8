"""A change's speed against another revision: the same benchmark on the working tree and on REV, interleaved.

  python launch/bench/compare.py --rev=58fbacb \
      --bench_flags="--checkpoint=smollm2 --variants=none/native,fp8/native,fp8/fp8"
  python launch/bench/compare.py --rev=HEAD~1 --rounds=3 --bench_flags=--configs=tiny

Checks REV out into a temporary git worktree and runs this tree's launch/bench/sampler.py (with --bench_flags)
once per round against each library, alternating which goes first (ABBA), each in its own process with
PYTHONPATH pointing at that tree. The sampler benchmark imports only the public API, so one script measures both.
Each run times transformers' generate in the same process: every engine's tokens/s is first divided by that
run's transformers figure, which cancels the host's drift between runs; the table then gives each engine's
median ratio on both trees and the ratio of ratios (this tree / REV). Run it before landing a change to rollout/,
models/ or the train step, and quote its table (docs/contributing.md). No timed test in the suite does this.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from absl import flags

from launch import _cli

_REV = flags.DEFINE_string("rev", None, "The git revision to compare with (a commit, tag or branch).")
_ROUNDS = flags.DEFINE_integer("rounds", 2, "Benchmark runs per tree (alternating trees, ABBA order).")
_BENCH_FLAGS = flags.DEFINE_string("bench_flags", "", "Flags for launch/bench/sampler.py, space-separated.")
_OUT = flags.DEFINE_string("out", None, "Also write every run's rows and the comparison to this JSON file.")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "launch", "bench", "sampler.py")


def _run_bench(tree: str, bench_args: list[str], out: str) -> list[dict]:
  env = dict(os.environ, PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
  proc = subprocess.run([sys.executable, BENCH, *bench_args, f"--out={out}"], env=env, cwd=tree,
                        capture_output=True, text=True)
  if proc.returncode:
    raise RuntimeError(f"the benchmark failed on {tree} (exit {proc.returncode}):\n{proc.stdout[-2000:]}"
                       f"{proc.stderr[-3000:]}")
  print(proc.stdout.strip().splitlines()[0])  # the header names the commit each run measured
  with open(out) as f:
    return [json.loads(line) for line in f]


def run(bench_args: list[str]):
  from opd_jax.bench.revisions import compare_runs
  if not _REV.value:
    from opd_jax.errors import InputError
    raise InputError("--rev is required: the revision to compare the working tree with")
  if _OUT.value:
    from opd_jax.files import check_output_file
    check_output_file(_OUT.value, "--out")
  commit = _cli.git(ROOT, "rev-parse", "--verify", "--short=12", _REV.value + "^{commit}")
  scratch = tempfile.mkdtemp(prefix="opd_compare_")
  worktree = os.path.join(scratch, "rev")
  _cli.git(ROOT, "worktree", "add", "--detach", worktree, commit)
  try:
    trees = {"this": ROOT, "rev": worktree}
    rows = {"this": [], "rev": []}
    for round_ in range(_ROUNDS.value):
      order = ["this", "rev"] if round_ % 2 == 0 else ["rev", "this"]
      for name in order:
        rows[name].append(_run_bench(trees[name], bench_args, os.path.join(scratch, f"{name}_{round_}.jsonl")))
    table = compare_runs(rows)
  finally:
    _cli.git(ROOT, "worktree", "remove", "--force", worktree)
    shutil.rmtree(scratch, ignore_errors=True)
  here = _cli.git(ROOT, "rev-parse", "--short=12", "HEAD")
  print(f"\nthis tree ({here} + working changes) vs {_REV.value} ({commit}), "
        f"{_ROUNDS.value} runs each, medians of each run's ratio to transformers' generate")
  print(f"  {'target':<22} {'mode':<8} {'engine':<30} {'this':>7} {'rev':>7} {'this / rev':>11}")
  for r in table:
    print(f"  {r['target']:<22} {r['mode']:<8} {r['engine']:<30} {r['this_vs_transformers']:>6.2f}x "
          f"{r['rev_vs_transformers']:>6.2f}x {r['this_over_rev']:>10.2f}x")
  if _OUT.value:
    from opd_jax.experiments.files import write_json
    write_json(_OUT.value, {"rev": _REV.value, "rev_commit": commit, "bench_args": bench_args,
                                   "rows": rows, "comparison": table})


def main(argv):
  del argv
  _cli.log_devices()
  _cli.run_or_exit(lambda: run(_BENCH_FLAGS.value.split()))


if __name__ == "__main__":
  _cli.run(main)
