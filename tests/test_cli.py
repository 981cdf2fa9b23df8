"""The launch scripts' contracts: JSON output, one-line errors with exit code 2, admission exit codes."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args, timeout=300):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
  return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_sample_json(tiny_pair):
  result = _run("launch/sample.py", f"--checkpoint={tiny_pair['student']}", "--prompt_ids=5,6,7",
                "--max_new_tokens=6", "--temperature=0", "--weights=int8", "--kv_cache=fp8", "--json")
  assert result.returncode == 0, result.stderr
  lines = [line for line in result.stdout.splitlines() if line.strip()]
  assert len(lines) == 1
  out = json.loads(lines[0])
  assert set(out) == {"tokens", "logprobs"} and 1 <= len(out["tokens"]) == len(out["logprobs"]) <= 6
  assert all(lp <= 0 for lp in out["logprobs"])


@pytest.mark.parametrize("args,message", [
    (("launch/train.py", "--config=configs/pair1.py:runlocal", "--config.objective.name=kl"),
     "objective.name 'kl' is unknown"),
    (("launch/train.py", "--config=configs/pair1.py", "--config.teacher=/no/such/dir"), "/no/such/dir"),
    (("launch/sample.py", "--checkpoint=/no/such/dir", "--prompt_ids=1", "--json"), "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
  result = _run(*args, f"--workdir={tmp_path}" if args[0].endswith("train.py") else "--seed=0")
  assert result.returncode == 2, result.stderr[-2000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and message in errors[0]
  assert not os.listdir(tmp_path)  # nothing written


def test_launch_scripts_fill_and_reuse_the_compilation_cache(tiny_pair, tmp_path):
  cache = tmp_path / "cache"
  args = ["launch/sample.py", f"--checkpoint={tiny_pair['student']}", "--prompt_ids=5,6,7", "--max_new_tokens=6",
          "--temperature=0", "--json"]
  outputs = []
  for _ in range(2):
    result = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "",
                                 "OPD_JAX_COMPILATION_CACHE": str(cache)})
    assert result.returncode == 0, result.stderr[-2000:]
    outputs.append(result.stdout)
    entries = sorted(os.listdir(cache))
  assert entries and outputs[0] == outputs[1]  # the second run loads executables and answers the same


def test_xm_launch_builds_train_arguments_and_rejects_bad_input():
  code = ("from launch import xm_launch as x; "
          "print(x.train_args('configs/pair1.py', '/gcs/b/run', ['train.steps=9'], x.hosts(*x.parse_accelerator("
          "'tpu_v3=32')))); print(x.train_args('configs/pair1.py', '/gcs/b/run', [], x.hosts('a100', 8)))")
  result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
  assert result.returncode == 0, result.stderr
  pod, gpu = result.stdout.splitlines()
  assert pod == str(["--config=configs/pair1.py", "--workdir=/gcs/b/run", "--config.train.progress_bar=False",
                     "--config.train.steps=9", "--config.distributed.coordinator=auto"])  # 4 hosts
  assert "distributed" not in gpu  # one node
  for flags, message in [(["--accelerator=tpu_v9=8"], "unknown resource 'tpu_v9'"),
                         (["--accelerator=tpu_v3=12"], "multiple of 8"),
                         (["--accelerator=a100=16"], "one GPU node"),
                         (["--accelerator=a100=x"], "positive integer"),
                         (["--workdir=gs://b/run"], "/gcs/BUCKET"),
                         (["--override=steps"], "expected key=value")]:
    result = _run("launch/xm_launch.py", "--config=configs/pair1.py", "--workdir=/gcs/b/run", *flags)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and message in errors[0], (flags, result.stderr[-1500:])


def test_admit_exit_codes(tiny_pair, tmp_path):
  base = ["launch/admit.py", "--config=configs/pair1.py", f"--config.teacher={tiny_pair['teacher']}",
          f"--config.student={tiny_pair['student']}", "--config.rollout.max_new_tokens=8", "--prompts=16"]
  budget = {"scale": "k3", "budgets": {"pooled": {"budget": 1e-3, "interval": [5e-4, 2e-3],
                                                  "bootstrap_budgets": [5e-4, 1e-3, 2e-3]}}}
  path = tmp_path / "budget.json"
  path.write_text(json.dumps(budget))
  admitted = _run(*base, f"--budget={path}", "--weights=int8")
  assert admitted.returncode == 0 and admitted.stdout.startswith("ADMIT"), admitted.stdout + admitted.stderr[-2000:]
  rejected = _run(*base, f"--budget={path}", "--noise=0.5")
  assert rejected.returncode == 1 and rejected.stdout.startswith("REJECT"), rejected.stdout
  missing = _run(*base, f"--budget={tmp_path / 'nope.json'}")
  assert missing.returncode == 2 and "does not exist" in missing.stderr
