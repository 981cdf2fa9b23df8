"""Real-vocabulary scale check: peak host memory of launch/train.py per objective on a 151,936-token pair.

  python launch/bench/scale.py [--batch=32] [--response_tokens=512] [--steps=2]
      [--objectives=reverse_kl_pg,reverse_kl,forward_kl_topk] [--extra="--config.train.micro_batch_size=8 ..."]
      [--root=DIR] [--max_rss_gb=12] [--predict [--out=results/host_rss.jsonl --name=scale]]
      [--config=configs/real/qwen3_1p7b_to_0p6b.py]   # the shipped real config, shapes overridden only

Builds (or reuses, from --root) the random Qwen3-shaped pair of opd_jax/bench/scale_pair.py, then runs
launch/train.py on it once per objective in a child process, and prints a table: objective | peak RSS GB |
peak RSS / one whole [B, R, V] bfloat16 tensor | wall s | last step s | mean response tokens | exit; with
--predict also the planner's host-RSS prediction for the same config (launch/plan_memory.py --host_rss) and
predicted / measured.
Random weights rarely emit EOS, so every response runs the whole --response_tokens. The child is killed when
its resident memory passes --max_rss_gb (reported as KILLED), so a blow-up cannot take the machine down.
On CPU, host RSS is all the memory the run uses; on an accelerator it counts only the host side. GB = 1e9 bytes.
"""

import json
import os
import shlex
import sys
import tempfile
import time

from absl import flags

from launch import _cli
from opd_jax.bench import host_rss

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_OBJECTIVES = flags.DEFINE_list("objectives", ["reverse_kl_pg", "reverse_kl", "forward_kl_topk"],
                                "Objectives (config.objective.name) to run, one child process each.")
_STEPS = flags.DEFINE_integer("steps", 2, "Learner updates per run (config.train.steps).")
_BATCH = flags.DEFINE_integer("batch", 32, "Responses per update (config.train.batch_size); also the eval size.")
_RESPONSE_TOKENS = flags.DEFINE_integer("response_tokens", 512, "config.rollout.max_new_tokens.")
_EXTRA = flags.DEFINE_string("extra", "", "More --config.* overrides for every run, one shell-quoted string.")
_ROOT = flags.DEFINE_string("root", None, "Pair directory: reused when it holds a pair, built there otherwise "
                            "(default: a temp dir).")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 151_936, "Vocabulary of a pair built here (Qwen3: 151,936).")
_MAX_RSS_GB = flags.DEFINE_float("max_rss_gb", 12.0, "Kill a run whose resident memory passes this (GB).")
_TIMEOUT_S = flags.DEFINE_integer("timeout_s", 0, "Kill a run after this many seconds; 0 = no limit.")
_CONFIG = flags.DEFINE_string("config", "configs/pair1.py", "Base config file (a Qwen3 pair config).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where the runs' workdirs go (default: <root>/runs).")
_OUT = flags.DEFINE_string("out", "", "With --predict: a JSONL file to keep one row per finished objective in "
                           "(scale_<objective>: prediction, measured peak RSS, wall), e.g. results/host_rss.jsonl.")
_NAME = flags.DEFINE_string("name", "scale", "With --out: rows are named <name>_<objective> (a row of that name is "
                            "replaced).")
_PREDICT = flags.DEFINE_bool("predict", False, "Also run launch/plan_memory.py --host_rss on each run's exact "
                             "config and print the predicted peak RSS next to the measured one.")


def _last_train_row(workdir: str) -> dict:
  """The run's last training row of metrics.jsonl ({} when there is none)."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.isfile(path):
    return {}
  rows = [json.loads(line) for line in open(path) if line.strip()]
  train_rows = [r for r in rows if "perf/step_s" in r]
  return train_rows[-1] if train_rows else {}


def train_command(pair: dict, objective: str, workdir: str) -> list[str]:
  """The launch/train.py command line of one run (everything but --extra is fixed here)."""
  batch = _BATCH.value
  overrides = {
      "pair": "scale_qwen3",
      "teacher": pair["teacher"], "student": pair["student"],
      "data.source": "jsonl", "data.train_file": pair["train_file"], "data.heldout_file": pair["heldout_file"],
      "data.use_chat_template": True, "data.max_prompt_tokens": 64,
      "rollout.max_new_tokens": _RESPONSE_TOKENS.value, "objective.name": objective,
      "train.batch_size": batch, "train.steps": _STEPS.value, "train.log_every": 1,
      "train.eval_every": 10**9, "train.eval_size": batch, "train.eval_batch_size": batch,
      "train.checkpoint_every": 10**9, "train.progress_bar": False,
      "model.attention": "xla", "model.scan_layers": True,  # the real-scale defaults (pair configs pick CPU ones)
  }
  return ([sys.executable, os.path.join(REPO, "launch", "train.py"), f"--config={_CONFIG.value}",
           f"--workdir={workdir}"] + [f"--config.{k}={v}" for k, v in overrides.items()] + shlex.split(_EXTRA.value))


def main(argv):
  del argv
  from opd_jax.bench.scale_pair import build_scale_pair, pair_paths
  from opd_jax.errors import InputError
  from opd_jax.files import check_output_file
  if _OUT.value:  # checked before the pair is built and the runs start, as rows are written after each run
    try:
      check_output_file(_OUT.value, "--out")
    except InputError as e:
      _cli.fail(str(e))
  root = _ROOT.value or tempfile.mkdtemp(prefix="opd_scale_")
  pair = pair_paths(root)
  if all(os.path.exists(path) for path in pair.values()):
    print(f"reusing the pair in {root}", file=sys.stderr)
  else:
    start = time.time()
    pair = build_scale_pair(root, vocab_size=_VOCAB_SIZE.value)
    print(f"built the pair in {root} ({time.time() - start:.0f} s)", file=sys.stderr)
  from opd_jax.models import read_hf_config
  vocab = read_hf_config(pair["student"]).vocab_size
  B, R = _BATCH.value, _RESPONSE_TOKENS.value
  tensor_bytes = B * R * vocab * 2
  runs_dir = _WORKDIR.value or os.path.join(root, "runs")
  os.makedirs(runs_dir, exist_ok=True)
  env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OPD_JAX_COMPILATION_CACHE="off")

  results = []
  for objective in _OBJECTIVES.value:
    workdir = tempfile.mkdtemp(prefix=f"{objective}_", dir=runs_dir)
    cmd = train_command(pair, objective, workdir)
    print(f"[{objective}] {shlex.join(cmd)}", file=sys.stderr, flush=True)
    result = host_rss.run_guarded(cmd, os.path.join(workdir, "train.log"), int(_MAX_RSS_GB.value * 1e9),
                                  _TIMEOUT_S.value, env, cwd=REPO)
    last = _last_train_row(workdir)
    result["step_s"], result["response_tokens"] = last.get("perf/step_s"), last.get("response_tokens")
    result["log"] = os.path.join(workdir, "train.log")
    if result["exit"] and not result["killed"]:
      with open(result["log"]) as f:
        tail = f.read().strip().splitlines()[-5:]
      print(f"[{objective}] exit {result['exit']}; log tail:\n  " + "\n  ".join(tail), file=sys.stderr)
    if _PREDICT.value:
      result["predicted"] = host_rss.predict_host_rss(os.path.join(REPO, "launch", "plan_memory.py"),
                                                      [arg for arg in cmd if arg.startswith("--config")], env)
      if _OUT.value and not result["exit"]:
        host_rss.write_row(_OUT.value, {"name": f"{_NAME.value}_{objective}", "command": "python " + shlex.join(sys.argv),
            "predicted": result["predicted"], **{k: result[k] for k in ("peak_rss_bytes", "wall_s", "exit")}})
      print(f"[{objective}] predicted {json.dumps(result['predicted'])}", file=sys.stderr, flush=True)
    results.append((objective, result))
    print(f"[{objective}] peak RSS {result['peak_rss_bytes'] / 1e9:.2f} GB, {result['wall_s']:.0f} s, exit "
          f"{result['exit']} {result['killed']}".rstrip(), file=sys.stderr, flush=True)

  shape = f"[{B}, {R}, {vocab}] bf16 = {tensor_bytes / 1e9:.2f} GB"
  print(f"\nbatch {B} x {R} response tokens, vocab {vocab}, {_STEPS.value} steps; extra: {_EXTRA.value or '-'}")
  predicted = " predicted GB (runtime + compile + device) | predicted / measured |" if _PREDICT.value else ""
  print(f"| objective | peak RSS GB | vs one {shape} | wall s | last step s | mean response tokens | exit |"
        + predicted)
  print("|---|---|---|---|---|---|---|" + ("---|---|" if _PREDICT.value else ""))
  for objective, r in results:
    step = f"{r['step_s']:.1f}" if r["step_s"] is not None else "-"
    tokens = f"{r['response_tokens']:.0f}" if r["response_tokens"] is not None else "-"
    status = f"KILLED ({r['killed']})" if r["killed"] else str(r["exit"])
    peak = r["peak_rss_bytes"] / 1e9
    print(f"| {objective} | {'>= ' if r['killed'] else ''}{peak:.2f} | {peak * 1e9 / tensor_bytes:.2f}x | "
          f"{r['wall_s']:.0f} | {step} | {tokens} | {status} |" + (_predicted_cells(r) if _PREDICT.value else ""))
  return 1 if any(r["exit"] for _, r in results) else 0


def _predicted_cells(result: dict) -> str:
  p = result["predicted"]
  parts = " + ".join(f"{p[k] / 1e9:.2f}" for k in ("runtime_bytes", "compile_bytes", "device_bytes"))
  return f" {p['peak_bytes'] / 1e9:.2f} ({parts}) | {p['peak_bytes'] / result['peak_rss_bytes']:.2f} |"


if __name__ == "__main__":
  _cli.run(main)
