"""The launch scripts' contracts: JSON output, one-line errors with exit code 2, admission exit codes."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": os.environ["OPD_JAX_TEST_XLA_FLAGS"]}


def _run(*args, timeout=300):
  return subprocess.run([sys.executable, *args], cwd=REPO, env=_ENV, capture_output=True, text=True, timeout=timeout)


def _run_together(*commands, timeout=300):
  """Several launch-script runs at once (each mostly waits on single-threaded compiles); CompletedProcesses."""
  processes = [subprocess.Popen([sys.executable, *args], cwd=REPO, env=_ENV, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for args in commands]
  results = []
  for args, process in zip(commands, processes):
    stdout, stderr = process.communicate(timeout=timeout)
    results.append(subprocess.CompletedProcess(args, process.returncode, stdout, stderr))
  return results


@pytest.mark.slow
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
  if args[0].endswith("train.py"):  # the workdir it was given stays empty (sample.py writes no file at all)
    assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_launch_scripts_fill_and_reuse_the_compilation_cache(tiny_pair, tmp_path):
  cache = tmp_path / "cache"
  args = ["launch/sample.py", f"--checkpoint={tiny_pair['student']}", "--prompt_ids=5,6,7", "--max_new_tokens=6",
          "--temperature=0", "--json"]
  outputs, entries = [], []
  for _ in range(2):
    result = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "",
                                 "OPD_JAX_COMPILATION_CACHE": str(cache)})
    assert result.returncode == 0, result.stderr[-2000:]
    outputs.append(result.stdout)
    entries.append(sorted(os.listdir(cache)))
  assert entries[0], "the first run wrote no executable to the cache"
  assert entries[1] == entries[0]  # the second run compiled nothing new: every executable came from the cache
  assert outputs[0] == outputs[1]  # and answers the same


def test_the_compilation_cache_switch_is_not_a_folder_named_on():
  from launch._cli import DEFAULT_CACHE, cache_dir
  assert cache_dir(None) == cache_dir("on") == cache_dir(" True ") == DEFAULT_CACHE
  assert cache_dir("off") is None and cache_dir("0") is None and cache_dir("") is None
  assert cache_dir("/tmp/xla") == "/tmp/xla"


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


@pytest.mark.slow
def test_admit_exit_codes(tiny_pair, tmp_path):
  base = ["launch/admit.py", "--config=configs/pair1.py", f"--config.teacher={tiny_pair['teacher']}",
          f"--config.student={tiny_pair['student']}", "--config.rollout.max_new_tokens=8", "--prompts=16"]
  budget = {"scale": "k3", "budgets": {"pooled": {"budget": 1e-3, "interval": [5e-4, 2e-3],
                                                  "bootstrap_budgets": [5e-4, 1e-3, 2e-3]}}}
  path = tmp_path / "budget.json"
  path.write_text(json.dumps(budget))
  # Many candidates in one process: ranked admitted-first by KV tokens at Qwen3-8B shapes, then by k3.
  screened, rejected, missing = _run_together(
      (*base, f"--budget={path}", "--json", "--candidates=weights=int8;noise=0.5;kv_cache=int8"),
      (*base, f"--config.admission_budget={path}", "--noise=0.5"), (*base, f"--budget={tmp_path / 'nope.json'}"))
  assert screened.returncode == 0, screened.stdout + screened.stderr[-2000:]
  rows = json.loads(screened.stdout.strip().splitlines()[-1])["rows"]
  assert [(r["rank"], r["candidate"], r["admit"]) for r in rows] == [
      (1, "kv_cache=int8", True), (2, "weights=int8", True), (3, "noise_sigma=0.5", False)]
  assert rows[0]["kv_tokens"] > rows[1]["kv_tokens"] and rows[1]["weight_bytes"] < 0.6 * rows[0]["weight_bytes"]
  assert "ADMIT" in screened.stdout and "KV tokens @ qwen3-8b" in screened.stdout
  assert rejected.returncode == 1 and rejected.stdout.startswith("REJECT"), rejected.stdout
  # Which budget judged, from which file: --budget, or (without it) the config's admission_budget.
  assert f"budget: pooled (0.001, quality accuracy) from {path} (--budget)" in screened.stdout, screened.stdout
  assert f"budget: pooled (0.001, quality accuracy) from {path} (the config's admission_budget)" in rejected.stdout
  assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_candidates_parse_and_memory_columns(tmp_path):
  from configs import common
  from opd_jax.planning.plan_spec import GIB, resolve_model
  from opd_jax.rollout.config import RolloutConfig
  from opd_jax.screening import candidates
  inline = candidates.parse("weights=fp8,kv=fp8,staleness=2;noise=0.1;quantize_embedding=true,weights=int8")
  path = tmp_path / "c.jsonl"
  path.write_text('{"name": "fp8 both", "weights": "fp8", "kv_cache": "fp8", "staleness_steps": 2}\n'
                  '{"noise_sigma": 0.1}\n{"weights": "int8", "quantize_embedding": true}\n')
  from_file = candidates.parse(str(path))
  assert [c.overrides for c in inline] == [c.overrides for c in from_file]
  assert [c.name for c in from_file] == ["fp8 both", "noise_sigma=0.1", "weights=int8,quantize_embedding=True"]
  config = common.base_config("pair1")
  rollouts = candidates.rollouts_for(RolloutConfig.from_config(config.rollout), inline)
  shape = resolve_model("qwen3-8b", "--shape")
  stale = candidates.capacity(shape, rollouts[0], 80 * GIB)
  plain = candidates.capacity(shape, candidates.rollout_for(rollouts[0], candidates.Candidate("x", {
      "staleness_steps": 0})), 80 * GIB)
  assert stale["held_weight_bytes"] == 3 * stale["weight_bytes"] == 3 * plain["weight_bytes"]
  assert stale["kv_tokens"] < plain["kv_tokens"]
  for bad, message in (("weights=fp8;stalenes=2", "unknown rollout field"), ("weights", "is not field=value"),
                       ("kv_cache=int2", "kv cache dtype 'int2'"), ("", "--candidates is empty")):
    with pytest.raises(ValueError, match=message):
      candidates.rollouts_for(RolloutConfig.from_config(config.rollout), candidates.parse(bad))


def test_a_backend_that_cannot_start_is_one_line_with_the_trace_in_the_workdir(tmp_path):
  """JAX_PLATFORMS naming a runtime this machine lacks (libtpu here) fails as every backend limit does: one
  `error:` line with what to change and where the full trace is, exit 2, and only that log in the workdir."""
  workdir = tmp_path / "run"
  result = subprocess.run([sys.executable, "launch/train.py", "--config=configs/pair1.py:runlocal",
                           f"--workdir={workdir}"], cwd=REPO, env={**_ENV, "JAX_PLATFORMS": "tpu"},
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
  assert "the tpu backend could not start" in errors[0] and f"full trace: {workdir}/error.log" in errors[0]
  assert os.listdir(workdir) == ["error.log"] and "Traceback" in (workdir / "error.log").read_text()


@pytest.mark.parametrize("exc, fragment, code", [
    (RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 3.2GiB."), "ran out of memory", 1),
    (RuntimeError("UNIMPLEMENTED: Unsupported element type for DotThunk::Execute: BF16 x BF16 = F32"),
     "student_compute_dtype=float32", 2),
    (RuntimeError("FAILED_PRECONDITION: DNN library initialization failed."), "model.attention=xla", 2),
    (ValueError("Number of devices 1 must be >= the product of mesh_shape (16,)"), "mesh.fsdp x mesh.tensor", 2),
    (RuntimeError("division by zero in my own code"), None, None),
    (KeyError("RESOURCE_EXHAUSTED"), None, None),  # not a runtime error type: a bug keeps its traceback
])
def test_backend_limits_are_named_and_anything_else_is_left_alone(exc, fragment, code):
  from opd_jax.backend_errors import explain
  found = explain(exc)
  if fragment is None:
    assert found is None
  else:
    assert fragment in found[0] and found[1] == code and "\n" not in found[0]


def test_a_full_disk_is_named_as_such_not_as_device_memory():
  """orbax reports a checkpoint write on a full disk as RESOURCE_EXHAUSTED, raised while handling the OSError it
  met: the line names the disk (exit 1, the run resumes), not device memory."""
  import errno
  from opd_jax.backend_errors import explain
  try:
    try:
      raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
      raise ValueError('RESOURCE_EXHAUSTED: Error writing "params/0" in OCDBT database at local file "/w/40"')
  except ValueError as e:
    wrapped = e
  for exc in (wrapped, OSError(errno.ENOSPC, "No space left on device")):
    message, code = explain(exc)
    assert message.startswith("the disk ran out of space") and "device ran out of memory" not in message
    assert code == 1
  assert explain(FileNotFoundError(errno.ENOENT, "No such file or directory")) is None  # a bug keeps its trace


def test_sample_command_decodes_greedy_with_either_engine_alike():
  """launch/sample.py --engine=paged: the static engine's greedy tokens (log-probs to float summation order)."""
  import numpy as np
  static, paged = _run_together(*[("launch/sample.py", "--checkpoint=opd_jax/assets/pair1/student",
                                   "--prompt_ids=5,6,7,8", "--temperature=0", "--max_new_tokens=12", "--json",
                                   f"--engine={engine}") for engine in ("static", "paged")])
  outs = [json.loads(r.stdout.strip().splitlines()[-1]) for r in (static, paged)]
  assert outs[0]["tokens"] == outs[1]["tokens"] and len(outs[0]["tokens"]) == 12
  assert np.abs(np.subtract(outs[0]["logprobs"], outs[1]["logprobs"])).max() <= 2e-5


def test_a_run_with_the_paged_engine_trains_and_logs_its_statistics(tiny_pair, tmp_path):
  """rollout.engine=paged through the whole loop (one device: this process's conftest simulates 8, the command
  gets one): the sampler's log-probs are the learner's (k3 ~ 0, as with the static engine) and every log row
  carries the engine's statistics."""
  result = _run("launch/train.py", "--config=configs/pair1.py:runlocal", f"--workdir={tmp_path}",
                f"--config.teacher={tiny_pair['teacher']}", f"--config.student={tiny_pair['student']}",
                "--config.rollout.engine=paged", "--config.rollout.page_size=4", "--config.rollout.decode_steps=4",
                "--config.train.progress_bar=False", "--config.train.export_dtype=")
  assert result.returncode == 0, result.stderr[-3000:]
  with open(tmp_path / "metrics.jsonl") as f:
    rows = [r for r in map(json.loads, f) if "loss" in r]  # every training log row
  assert rows and all(r["rollout/engine_rounds"] >= 1 for r in rows)
  assert all(r["rollout/engine_peak_rows"] >= 1 and r["rollout/engine_preempted"] == 0 for r in rows)
  assert all(abs(r["mismatch/k3"]) < 1e-5 for r in rows)
  again = _run("launch/train.py", "--config=configs/pair1.py:runlocal", f"--workdir={tmp_path}",
               f"--config.teacher={tiny_pair['teacher']}", f"--config.student={tiny_pair['student']}",
               "--config.rollout.engine=paged", "--config.rollout.page_size=4", "--config.rollout.decode_steps=4",
               "--config.train.progress_bar=False", "--config.train.export_dtype=")
  assert again.returncode == 0, again.stderr[-3000:]  # the finished run asked again: says so, claims no result
  assert again.stdout.strip().splitlines()[-1].endswith("the workdir already holds this run's 6 steps"), again.stdout


def test_an_async_run_with_inflight_updates_logs_each_tokens_version_lag(tiny_pair, tmp_path):
  """rollout.inflight_updates=True (async, paged): every log row carries the tokens' version lag (within
  train.max_staleness), its buckets' shares adding up to 1, and the k3 of the tokens at each lag. Sync mode
  refuses the flag in one line."""
  common = ("launch/train.py", "--config=configs/pair1.py:runlocal", f"--config.teacher={tiny_pair['teacher']}",
            f"--config.student={tiny_pair['student']}", "--config.rollout.engine=paged",
            "--config.rollout.page_size=4", "--config.rollout.decode_steps=2", "--config.rollout.inflight_updates=True",
            "--config.train.progress_bar=False", "--config.train.export_dtype=")
  inflight, sync = _run_together((*common, f"--workdir={tmp_path / 'async'}", "--config.train.mode=async",
                                  "--config.train.max_staleness=2"), (*common, f"--workdir={tmp_path / 'sync'}"))
  assert inflight.returncode == 0, inflight.stderr[-3000:]
  with open(tmp_path / "async" / "metrics.jsonl") as f:
    rows = [r for r in map(json.loads, f) if "loss" in r]  # every training log row
  assert rows and all(0 <= r["mismatch/token_version_lag"] <= 2 for r in rows)
  assert any(r["mismatch_lag/tokens_lag1"] > 0 for r in rows)  # some tokens were sampled by older weights
  for r in rows:
    shares = [r[f"mismatch_lag/tokens_lag{name}"] for name in ("0", "1", "2", "3+")]
    assert abs(sum(shares) - 1) < 1e-5 and shares[3] == 0 and "rollout/engine_weight_updates" in r
    # lag-0 tokens need not be at 0 (their context's KV may come from older weights)
    assert all(np.isfinite(r[f"mismatch_lag/k3_lag{name}"]) and r[f"mismatch_lag/k3_lag{name}"] >= 0
               for name in ("0", "1", "2")), r
  # tokens sampled by weights an update old differ from the learner's once the updates move the weights (the first
  # update runs at a learning rate of 0: warmup)
  assert any(r["mismatch_lag/k3_lag1"] > 0 for r in rows)
  assert sync.returncode == 2 and "error: rollout.inflight_updates=True applies to train.mode='async'" in sync.stderr
