"""Multi-process training through jax.distributed: two CPU processes with two devices each log the same
metrics (to 1e-4) as one process with four devices (same global mesh, same global batches)."""

import json
import os
import socket
import subprocess
import sys

import pytest

from opd_jax.train import distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _start(pair, workdir, devices, *coordinator_processes_id):
  args = [sys.executable, "-m", "tests.multihost_worker", pair["teacher"], pair["student"], str(workdir),
          str(devices), *map(str, coordinator_processes_id)]
  return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(process) -> str:
  output, _ = process.communicate(timeout=600)
  assert process.returncode == 0, output[-3000:]
  return output


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_two_processes_train_like_one(tiny_pair, tmp_path):
  port = _free_port()
  workers = [_start(tiny_pair, tmp_path / "two", 2, f"localhost:{port}", 2, i) for i in range(2)]
  single = _start(tiny_pair, tmp_path / "one", 4)
  outputs = [_finish(process) for process in workers + [single]]
  assert all("processes=2 devices=4" in output for output in outputs[:2]) and "processes=1 devices=4" in outputs[2]
  one, two = _rows(tmp_path / "one"), _rows(tmp_path / "two")
  assert [r["step"] for r in two] == [r["step"] for r in one] and len(one) >= 6
  compared = 0
  for a, b in zip(one, two):
    assert set(a) == set(b)
    for key in a:
      if not key.startswith(("perf/", "eval/seconds", "time/")):
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
        compared += 1
  assert compared > 50
  assert any(r.get("mismatch/k3", 0) > 0 for r in two)
  assert sorted(os.listdir(tmp_path / "two" / "checkpoints")) == ["3", "6"]  # written by both processes


@pytest.mark.parametrize("args,message", [
    (("", 2, 0), "distributed.num_processes=2 needs distributed.coordinator"),
    (("localhost:1", 2, 2), "0 <= process_id < num_processes"),
    (("localhost:1", 1, 0), "num_processes >= 2"),
])
def test_distributed_config_mistakes_are_named(args, message):
  with pytest.raises(ValueError, match=message):
    distributed.initialize(*args)
