"""Whole runs against a served teacher (real server processes on 127.0.0.1): the in-process run reproduced, and a
server killed with SIGKILL mid-run, restarted or not."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from configs import common
from opd_jax.errors import InputError
from opd_jax.train.loop import train
from tests import servers

REPO = servers.REPO
_TIMINGS = ("time/", "perf/", "eval/seconds", "teacher/")  # wall-clock keys, and the served run's own


def _config(pair, **overrides):
  config = common.base_config("tiny")
  common.shrink_for_local_run(config)
  config.teacher, config.student = pair["teacher"], pair["student"]
  config.rollout.max_new_tokens = 12
  config.objective.name = "reverse_kl"  # exact: served as its top-k form over the whole vocabulary
  config.train.progress_bar, config.train.export_dtype = False, ""
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow  # the fast tier keeps the refused run below
def test_a_served_teacher_reproduces_the_in_process_run(tiny_pair, tmp_path):
  """Every logged value within 1e-4 of the in-process run (a float32 server, the same seed), held-out accuracy
  equal; the served run also logs the wire bytes per scored token."""
  train(_config(tiny_pair), str(tmp_path / "local"))
  with servers.teacher(f"--checkpoint={tiny_pair['teacher']}") as (_, url):
    train(_config(tiny_pair, teacher_endpoint=url), str(tmp_path / "served"))
  local, served = _rows(tmp_path / "local"), _rows(tmp_path / "served")
  assert [r["step"] for r in local] == [r["step"] for r in served]
  compared = 0
  for want, got in zip(local, served):
    for key, value in want.items():
      if not key.startswith(_TIMINGS):
        assert got[key] == pytest.approx(value, abs=1e-4), (want["step"], key)
        compared += 1
    if "eval/accuracy" in want:
      assert got["eval/accuracy"] == want["eval/accuracy"]
  assert compared > 100 and all(r["teacher/wire_bytes_per_token"] > 0 for r in served if "loss" in r)
  first = next(r for r in served if "loss" in r)  # the preflight: served vs in-process scores of the first batch
  assert first["teacher/preflight_k3"] < 1e-8 and first["teacher/preflight_repeat_k3"] == 0.0


def test_a_served_teacher_that_is_another_model_is_refused_before_anything_is_written(tiny_pair, tmp_path):
  """The preflight compares the served scores of the first batch with config.teacher's own: a server of another
  model (here the student) is refused with one message naming the threshold, before the workdir exists."""
  with servers.teacher(f"--checkpoint={tiny_pair['student']}") as (_, url):
    with pytest.raises(InputError, match=r"scores the first batch at k3 \S+ from config.teacher .* above "
                                         r"served_teacher.preflight_max_k3=0.0001: it serves another model"):
      train(_config(tiny_pair, teacher_endpoint=url), str(tmp_path / "refused"))
  assert not os.path.exists(tmp_path / "refused")


def _train_command(url: str, workdir: str, *extra: str) -> list[str]:
  return [sys.executable, "launch/train.py", "--config=configs/pair1.py:runlocal", f"--workdir={workdir}",
          f"--config.teacher_endpoint={url}", "--config.train.steps=40", "--config.train.log_every=1",
          "--config.train.eval_every=40", "--config.train.checkpoint_every=2", "--config.train.progress_bar=False",
          "--config.train.export_dtype=", *extra]


def _kill_after_step(server, workdir: str, step: int, trainer) -> None:
  """SIGKILL the server once the trainer has logged `step` (it is then mid-run)."""
  path = os.path.join(workdir, "metrics.jsonl")
  deadline = time.time() + 300
  while time.time() < deadline and trainer.poll() is None:
    if os.path.exists(path) and any(json.loads(line).get("step", 0) >= step and "loss" in json.loads(line)
                                    for line in open(path)):
      os.kill(server.pid, signal.SIGKILL)
      server.wait(30)
      return
    time.sleep(0.05)
  raise AssertionError(f"the trainer did not reach step {step}")


@pytest.mark.slow
def test_a_killed_server_restarted_loses_no_step_and_one_not_restarted_stops_the_run(tmp_path):
  env = servers.ENV
  # 1. Killed after step 3, back 3 s later on the same port: the run waits, warns once, finishes every step.
  server, url = servers.start(["launch/serve_teacher.py", "--config=configs/pair1.py", "--port=0"])
  port = url.split(":")[-1].split("/")[0]
  workdir = str(tmp_path / "restarted")
  trainer = subprocess.Popen(_train_command(url, workdir), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
  try:
    _kill_after_step(server, workdir, 3, trainer)
    time.sleep(3)
    server, _ = servers.start(["launch/serve_teacher.py", "--config=configs/pair1.py", f"--port={port}"])
    _, stderr = trainer.communicate(timeout=600)
  finally:
    trainer.kill()
    servers.stop(server)
  assert trainer.returncode == 0, stderr
  warnings = [line for line in stderr.splitlines() if line.startswith("warning: served teacher")]
  assert len(warnings) == 1 and "is not answering" in warnings[0], stderr
  rows = _rows(workdir)
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, 41)) and rows[-1]["eval/accuracy"] >= 0
  assert max(r["teacher/outages"] for r in rows if "loss" in r) == 1
  # 2. Killed and not restarted within served_teacher.retry_for_s: one error line, exit 1, the checkpoint kept;
  #    the same command resumes from it once a server is back.
  server, url = servers.start(["launch/serve_teacher.py", "--config=configs/pair1.py", "--port=0"])
  workdir = str(tmp_path / "stopped")
  command = _train_command(url, workdir, "--config.served_teacher.retry_for_s=3")
  trainer = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
  try:
    _kill_after_step(server, workdir, 5, trainer)
    _, stderr = trainer.communicate(timeout=600)
  finally:
    trainer.kill()
  assert trainer.returncode == 1, stderr
  errors = [line for line in stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "has not answered for" in errors[0] and "rerun the same command" in errors[0]
  saved = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
  assert saved and saved[-1] >= 4
  port = url.split(":")[-1].split("/")[0]
  with servers.running(["launch/serve_teacher.py", "--config=configs/pair1.py", f"--port={port}"]):
    resumed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr
  assert [r["step"] for r in _rows(workdir) if "loss" in r][-1] == 40
