"""Training with a served teacher vs in process, side by side: wall time, and the logged numbers' difference.

  python launch/bench/served_teacher.py [--config=configs/pair1.py] [--modes=sync,async]
      [--out=results/served_teacher.jsonl] [--root=DIR]

Per mode, the in-process run and the served run (launch/serve_teacher.py --config=CONFIG on a free port of
127.0.0.1, started once) alternate, so a drift in machine speed hits both; each run is `launch/train.py
--config=CONFIG` in a process of its own with the compilation cache off. Prints the training time (time/train_s,
evaluations excluded) of each, their ratio, and the largest difference of any logged value; --out keeps one row
per run (opd_jax/bench/served_teacher.py) and copies each run's metrics.jsonl to OUT_STEM/<run name>/, so the
comparison can be recomputed from the shipped files. Run it on a quiet machine: it times.
"""

import os
import shlex
import shutil
import sys
import tempfile

from absl import flags

from launch import _cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CONFIG = flags.DEFINE_string("config", "configs/pair1.py", "Run config (a file, as --config of train.py).")
_MODES = flags.DEFINE_list("modes", ["sync", "async"], "train.mode values to compare.")
_OUT = flags.DEFINE_string("out", "", "JSONL file to keep one row per run in.")
_ROOT = flags.DEFINE_string("root", None, "Where the runs' workdirs go (default: a temp dir).")


def run():
  from opd_jax.bench.host_rss import run_guarded, write_row
  from opd_jax.bench.served_teacher import compare, summary
  from opd_jax.errors import InputError
  from opd_jax.files import check_output_file
  from opd_jax.serving import processes

  if not set(_MODES.value) <= {"sync", "async"}:
    raise InputError(f"--modes must be sync and/or async, got {','.join(_MODES.value)}")
  if _OUT.value:
    check_output_file(_OUT.value, "--out")
  root = _ROOT.value or tempfile.mkdtemp(prefix="opd_served_")
  os.makedirs(root, exist_ok=True)
  env = {**os.environ, "OPD_JAX_COMPILATION_CACHE": "off"}
  server, url = processes.start(["launch/serve_teacher.py", f"--config={_CONFIG.value}", "--port=0"], cwd=REPO,
                                env=env)
  results = []
  try:
    for mode in _MODES.value:
      pair = {}
      for where in ("in_process", "served"):
        workdir = os.path.join(root, f"{mode}_{where}")
        cmd = [sys.executable, "launch/train.py", f"--config={_CONFIG.value}", f"--workdir={workdir}",
               f"--config.train.mode={mode}", "--config.train.progress_bar=False"]
        if where == "served":
          cmd.append(f"--config.teacher_endpoint={url}")
        outcome = run_guarded(cmd, workdir + ".log", max_rss_bytes=20e9, env=env, cwd=REPO)
        if outcome["exit"]:
          raise InputError(f"{' '.join(cmd)} exited {outcome['exit']}; see {workdir}.log")
        pair[where] = {"name": f"{_config_name()}_{mode}_{where}", "mode": mode,
                       "teacher": where, "wall_s": outcome["wall_s"], "peak_rss_bytes": outcome["peak_rss_bytes"],
                       **summary(workdir), "command": "python " + shlex.join(sys.argv)}
        print(f"{mode} {where}: {pair[where]['train_s']:.0f} s training, {pair[where]['step_s']:.2f} s/step",
              file=sys.stderr)
      pair["served"].update(compare(os.path.join(root, f"{mode}_in_process"), os.path.join(root, f"{mode}_served")))
      results += [pair["in_process"], pair["served"]]
  finally:
    processes.stop(server)
  print("| mode | in process: train s (s/step) | served: train s (s/step) | served / in process | "
        "largest logged difference | all within 1e-4 through step | accuracy equal |")
  print("|---|---|---|---|---|---|---|")
  for local, served in zip(results[::2], results[1::2]):
    print(f"| {local['mode']} | {local['train_s']:.0f} ({local['step_s']:.2f}) | {served['train_s']:.0f} "
          f"({served['step_s']:.2f}) | {served['train_s'] / local['train_s']:.2f}x | "
          f"{served.get('max_abs_difference', float('nan')):.2g} ({served.get('largest_at', '')}) | "
          f"{served.get('within_tolerance_through_step')} | "
          f"{served.get('accuracy_equal')} |")
  if _OUT.value:
    for row in results:
      kept = os.path.join(_OUT.value.removesuffix(".jsonl"), row["name"])
      os.makedirs(kept, exist_ok=True)
      shutil.copyfile(os.path.join(root, f"{row['mode']}_{row['teacher']}", "metrics.jsonl"),
                      os.path.join(kept, "metrics.jsonl"))
      write_row(_OUT.value, row)


def _config_name() -> str:
  """configs/pair1.py:runlocal -> pair1_runlocal."""
  path, _, arg = _CONFIG.value.partition(":")
  return os.path.basename(path).removesuffix(".py") + (f"_{arg}" if arg else "")


def main(argv):
  del argv
  _cli.log_devices()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
