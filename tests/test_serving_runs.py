"""Whole runs against a served teacher (real server processes on 127.0.0.1): the in-process run reproduced, a
server killed with SIGKILL mid-run, restarted or not, and launch/train.py's exit when no teacher answers."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from configs import common
from opd_jax.errors import InputError, TrainingStopped
from opd_jax.experiments.sweep import set_field
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
    set_field(config, key, value)
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


@pytest.mark.slow  # a long end-to-end run: CI's full suite, not the fast tier
def test_a_served_teacher_that_is_another_model_is_refused_before_anything_is_written(tiny_pair, tmp_path):
  """The preflight compares the served scores of the first batch with config.teacher's own: a server of another
  model (here the student) is refused with one message naming the threshold, before the workdir exists."""
  with servers.teacher(f"--checkpoint={tiny_pair['student']}") as (_, url):
    with pytest.raises(InputError, match=r"scores the first batch at k3 \S+ from config.teacher .* above "
                                         r"served_teacher.preflight_max_k3=0.0001: it serves another model"):
      train(_config(tiny_pair, teacher_endpoint=url), str(tmp_path / "refused"))
  assert not os.path.exists(tmp_path / "refused")


_STEPS = 12  # enough steps after each kill (at 3 and 5) to show the run going on


def _killer(server, workdir: str, step: int, then=None) -> threading.Thread:
  """A thread that SIGKILLs the server once the run in `workdir` has logged `step` (it is then mid-run), then
  calls `then` (a restart)."""
  def watch():
    path = os.path.join(workdir, "metrics.jsonl")
    deadline = time.time() + 300
    while time.time() < deadline:
      if os.path.exists(path) and any(json.loads(line).get("step", 0) >= step and "loss" in json.loads(line)
                                      for line in open(path)):
        os.kill(server.pid, signal.SIGKILL)
        server.wait(30)
        if then is not None:
          then()
        return
      time.sleep(0.05)
  thread = threading.Thread(target=watch, daemon=True)
  thread.start()
  return thread


@pytest.mark.slow
def test_a_killed_server_restarted_loses_no_step_and_one_not_restarted_stops_the_run(tiny_pair, tmp_path, capfd):
  """The server is a real process killed with SIGKILL mid-run; the trainer runs in this process (the stop's exit
  code and error line: the next test)."""
  teacher = ["launch/serve_teacher.py", f"--checkpoint={tiny_pair['teacher']}"]
  steps = {"train.steps": _STEPS, "train.log_every": 1, "train.eval_every": _STEPS, "train.checkpoint_every": 2}
  # 1. Killed after step 3, back 3 s later on the same port: the run waits, warns once, finishes every step.
  server, url = servers.start([*teacher, "--port=0"])
  port = url.split(":")[-1].split("/")[0]
  restarted = []
  workdir = str(tmp_path / "restarted")
  killer = _killer(server, workdir, 3, then=lambda: (time.sleep(3), restarted.append(
      servers.start([*teacher, f"--port={port}"])[0])))
  try:
    capfd.readouterr()
    train(_config(tiny_pair, teacher_endpoint=url, **steps), workdir)
    killer.join(60)
    warnings = [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning: served teacher")]
    assert len(warnings) == 1 and "is not answering" in warnings[0], warnings
    rows = _rows(workdir)
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, _STEPS + 1)) and rows[-1]["eval/accuracy"] >= 0
    assert max(r["teacher/outages"] for r in rows if "loss" in r) == 1
    # 2. Killed and not restarted within served_teacher.retry_for_s: the run stops (TrainingStopped: one error
    #    line and exit 1 in launch/train.py), the checkpoint kept; the same run resumes once a server is back.
    workdir = str(tmp_path / "stopped")
    config = _config(tiny_pair, teacher_endpoint=url, **steps, **{"served_teacher.retry_for_s": 3.0})
    killer = _killer(restarted[0], workdir, 5)
    with pytest.raises(TrainingStopped, match=r"has not answered for \d+ s .* rerun the same command to resume"):
      train(config, workdir)
    killer.join(60)
    saved = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
    assert saved and saved[-1] >= 4
    with servers.running([*teacher, f"--port={port}"]):
      train(config, workdir)
    assert [r["step"] for r in _rows(workdir) if "loss" in r][-1] == _STEPS
  finally:
    servers.stop(server)
    for process in restarted:
      servers.stop(process)


def test_an_unreachable_teacher_stops_train_py_with_one_error_line_and_exit_1(tmp_path):
  """launch/train.py's side of a stop: exit 1, one `error:` line naming the setting, nothing written."""
  port = servers.free_port()  # nothing listens there
  result = subprocess.run([sys.executable, "launch/train.py", "--config=configs/pair1.py:runlocal",
                           f"--workdir={tmp_path / 'run'}", f"--config.teacher_endpoint=http://127.0.0.1:{port}/v1",
                           "--config.served_teacher.retry_for_s=1"], cwd=REPO, env=servers.ENV,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 1, result.stderr[-2000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "has not answered for" in errors[0] and "retry_for_s=1" in errors[0], result.stderr
  assert "Traceback" not in result.stderr and not os.path.exists(tmp_path / "run")


@pytest.mark.slow  # a long end-to-end run: CI's full suite, not the fast tier
def test_the_admission_check_measures_the_served_teacher_as_the_preflight_does(tiny_pair):
  """launch/admit.py's teacher side (opd_jax/screening/teacher_check.py): a server of the teacher's own
  checkpoint passes at float32 round-off, a server of another model (the student) fails
  served_teacher.preflight_max_k3, on the calibration batch; without an endpoint there is nothing to measure."""
  from opd_jax.screening.calibration import Calibration
  from opd_jax.screening.teacher_check import served_teacher_mismatch
  from opd_jax.spec import screening_spec
  config = _config(tiny_pair)
  cal = Calibration.from_spec(screening_spec(config), num_prompts=8)
  assert served_teacher_mismatch(cal, screening_spec(config)) is None
  measured = {}
  for name in ("teacher", "student"):
    with servers.teacher(f"--checkpoint={tiny_pair[name]}") as (_, url):
      measured[name] = served_teacher_mismatch(cal, screening_spec(_config(tiny_pair, teacher_endpoint=url)))
  assert measured["teacher"]["ok"] and measured["teacher"]["k3"] < 1e-8 and measured["teacher"]["repeat_k3"] == 0.0
  assert not measured["student"]["ok"] and measured["student"]["k3"] > 1e-4
  assert measured["student"]["max_k3"] == config.served_teacher.preflight_max_k3
