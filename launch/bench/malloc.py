"""The whole training loop under two glibc malloc settings, side by side: step time, kernel time, peak RSS.

  python launch/bench/malloc.py [--config=configs/smollm2.py] [--steps=10] [--rounds=2] \
      [--baseline="--config.train.malloc_keep_freed=False --config.train.malloc_arena_max=2"] \
      [--out=results/bench/malloc.json]

Runs launch/train.py on --config for --steps steps (evaluation shrunk to 8 prompts, no checkpoint or export,
a row per step), once with the config's own malloc settings ("config") and once with --baseline's overrides,
interleaved ABBA over --rounds, each in a fresh process without GLIBC_TUNABLES in its environment (so each run's
settings are its config's: opd_jax/train/malloc.py) and without the persistent compilation cache (every run
compiles its programs, as on a fresh machine). For each run: the mean step time after the first
--warmup steps (compilation), the process's user and system CPU seconds and its peak RSS (os.wait4). Then the
median of each per variant and the ratio baseline / config, and whether the two variants logged the same
numbers (every metric except timings): a malloc setting must not change the math.
"""

import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

from absl import flags

from launch import _cli

_CONFIG = flags.DEFINE_string("config", "configs/smollm2.py", "The run's config (path[:arg]).")
_STEPS = flags.DEFINE_integer("steps", 10, "Training steps per run.")
_WARMUP = flags.DEFINE_integer("warmup", 3, "First steps left out of the mean (they compile).")
_ROUNDS = flags.DEFINE_integer("rounds", 2, "Runs per variant, alternating which goes first (ABBA).")
_BASELINE = flags.DEFINE_string("baseline", "--config.train.malloc_keep_freed=False --config.train.malloc_arena_max=2",
                                "The baseline's --config overrides (one shell-quoted string).")
_OUT = flags.DEFINE_string("out", "", "Also write every run and the comparison to this JSON file.")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TIMINGS = ("perf/", "time/", "eval/seconds")


def _run(variant: str, extra: list[str], workdir: str) -> dict:
  args = [f"--config={_CONFIG.value}", f"--workdir={workdir}", f"--config.train.steps={_STEPS.value}",
          "--config.train.log_every=1", f"--config.train.eval_every={_STEPS.value + 1}",
          "--config.train.eval_size=8", "--config.train.eval_batch_size=8", "--config.train.eval_samples=8",
          "--config.train.export_dtype=", f"--config.train.checkpoint_every={_STEPS.value + 1}",
          "--config.train.progress_bar=False", *extra]
  env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
  env["OPD_JAX_COMPILATION_CACHE"] = "off"  # every run compiles, as on a fresh machine
  with open(os.path.join(workdir + ".log"), "w") as log:
    proc = subprocess.Popen([sys.executable, "launch/train.py", *args], cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
  if os.waitstatus_to_exitcode(status):
    raise RuntimeError(f"{variant}: launch/train.py exited {os.waitstatus_to_exitcode(status)}; see {workdir}.log")
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  steps = [r["perf/step_s"] for r in rows if "perf/step_s" in r]
  numbers = [{k: v for k, v in r.items() if not k.startswith(_TIMINGS)} for r in rows]
  return {"variant": variant, "step_s": steps, "step_s_mean": statistics.mean(steps[_WARMUP.value:]),
          "user_s": usage.ru_utime, "sys_s": usage.ru_stime, "peak_rss_bytes": usage.ru_maxrss * 1024,
          "numbers": numbers}


def run() -> None:
  if _STEPS.value <= _WARMUP.value:
    from opd_jax.errors import InputError
    raise InputError(f"--steps={_STEPS.value} leaves no step after --warmup={_WARMUP.value}; raise --steps")
  if _OUT.value:
    from opd_jax.files import check_output_file
    check_output_file(_OUT.value, "--out")
  variants = {"config": [], "baseline": shlex.split(_BASELINE.value)}
  scratch, runs = tempfile.mkdtemp(prefix="opd_bench_malloc_"), []
  commit = _cli.git(REPO, "rev-parse", "--short=12", "HEAD")
  commit += "+dirty" if _cli.git(REPO, "status", "--porcelain", "--untracked-files=no") else ""
  print(f"{_CONFIG.value}, {_STEPS.value} steps per run (mean of steps {_WARMUP.value + 1}+), commit {commit}; "
        f"baseline: {_BASELINE.value}")
  print(f"{'run':<12} {'step s':>7} {'user s':>7} {'sys s':>7} {'peak RSS GB':>12}")
  for round_ in range(_ROUNDS.value):
    order = list(variants) if round_ % 2 == 0 else list(variants)[::-1]
    for name in order:
      run = _run(name, variants[name], os.path.join(scratch, f"{name}{round_}"))
      runs.append(run)
      print(f"{name + str(round_):<12} {run['step_s_mean']:>7.2f} {run['user_s']:>7.1f} {run['sys_s']:>7.1f} "
            f"{run['peak_rss_bytes'] / 1e9:>12.2f}", flush=True)
  median = {name: {key: statistics.median(r[key] for r in runs if r["variant"] == name)
                   for key in ("step_s_mean", "sys_s", "peak_rss_bytes")} for name in variants}
  ratio = {key: median["baseline"][key] / median["config"][key] for key in median["config"]}
  same = all(r["numbers"] == runs[0]["numbers"] for r in runs)
  print(f"median step s: config {median['config']['step_s_mean']:.2f}, baseline "
        f"{median['baseline']['step_s_mean']:.2f}: baseline / config {ratio['step_s_mean']:.2f}x; "
        f"system time {ratio['sys_s']:.2f}x; peak RSS {ratio['peak_rss_bytes']:.2f}x; "
        f"same numbers in every run: {'yes' if same else 'NO'}")
  if _OUT.value:
    for r in runs:
      del r["numbers"]
    from opd_jax.files import write_json
    write_json(_OUT.value, {
        "bench": "malloc", "config": _CONFIG.value, "steps": _STEPS.value, "warmup": _WARMUP.value,
        "baseline": _BASELINE.value, "commit": commit,
        "runs": runs, "median": median, "baseline_over_config": ratio, "same_numbers": same})


def main(argv):
  del argv
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
