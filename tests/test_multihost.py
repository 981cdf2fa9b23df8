"""Multi-process training through jax.distributed: two CPU processes with two devices each log the same
metrics (to 1e-4) as one process with four devices (same global mesh, same global batches), also when the
two-process run is preempted and its newest checkpoint is then damaged."""

import json
import os
import socket
import subprocess
import sys

import pytest

from opd_jax.train import distributed
from tests import checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _start(pair, workdir, devices, *coordinator_processes_id, sigterm_at=None, pod_env=None):
  args = [sys.executable, "-m", "tests.multihost_worker", pair["teacher"], pair["student"], str(workdir),
          str(devices), *map(str, coordinator_processes_id)]
  env = dict(os.environ, **({"OPD_JAX_TEST_SIGTERM_AT": str(sigterm_at)} if sigterm_at is not None else {}),
             **(pod_env or {}))
  # The resumed processes compile what the preempted ones did: one compilation cache for the test's processes.
  env.update(JAX_COMPILATION_CACHE_DIR=str(os.path.join(os.path.dirname(workdir), "xla_cache")),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _finish(process, status=0) -> str:
  output, _ = process.communicate(timeout=600)
  assert process.returncode == status, output[-3000:]
  return output


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _pod_environment() -> dict:
  """The environment launch/gke_launch.py's manifest gives each pod of a 2-host TPU v6e slice."""
  from opd_jax.cluster import jobset
  manifest = jobset.render(jobset.JobSpec(name="opd", accelerator="tpu-v6e-8", image="i", config="configs/pair1.py",
                                          bucket="b", workdir="/gcs/b/run"))
  container = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
  assert "--config.distributed.coordinator=jobset" in container["command"]
  return {e["name"]: e["value"] for e in container["env"]}


@pytest.mark.slow
def test_two_processes_train_like_one_through_preemption_and_a_damaged_checkpoint(tiny_pair, tmp_path):
  """SIGTERM to process 1 during step 4: JAX's preemption service stops both processes at the same step with a
  checkpoint there (exit 143, one line each). A bit then flipped in that checkpoint is found by one process
  (each checks its share of the files), and both fall back to step 3 together, restarted as JobSet pods. The
  finished run's metrics equal one process's with four devices."""
  port, two = _free_port(), tmp_path / "two"
  workers = [_start(tiny_pair, two, 2, f"localhost:{port}", 2, i, sigterm_at=3 if i == 1 else None)
             for i in range(2)]
  single = _start(tiny_pair, tmp_path / "one", 4)
  preempted = [_finish(process, status=143) for process in workers]
  stops = [[line for line in output.splitlines() if line.startswith("preempted: ")] for output in preempted]
  assert all(len(lines) == 1 for lines in stops) and stops[0] == stops[1], stops
  assert "a preemption notice (SIGTERM) reached this run; every process stopped" in stops[0][0]
  saved = sorted(os.listdir(two / "checkpoints"), key=int)
  stopped_at = int(saved[-1])
  assert saved == ["3", str(stopped_at)] and 4 <= stopped_at < 6 and f"after step {stopped_at} " in stops[0][0]
  assert max(r["step"] for r in _rows(two)) == stopped_at

  checkpoints.flip_a_bit_in_the_largest_array_file(str(two / "checkpoints" / str(stopped_at)))
  # Resumed as two pods of the GKE JobSet launch/gke_launch.py renders for a 2-host slice: the coordinator,
  # process count and index come from the pod's environment (the manifest's, with pod 0's DNS name -> localhost,
  # and Kubernetes' JOB_COMPLETION_INDEX), not from flags.
  port, pod = _free_port(), _pod_environment()
  workers = [_start(tiny_pair, two, 2, "jobset", 1, 0, pod_env={
      **pod, "OPD_COORDINATOR": f"localhost:{port}", "JOB_COMPLETION_INDEX": str(i)}) for i in range(2)]
  outputs = [_finish(process) for process in workers + [single]]
  assert all("processes=2 devices=4" in output for output in outputs[:2]) and "processes=1 devices=4" in outputs[2]
  warnings = [line for line in outputs[0].splitlines() if line.startswith("warning: checkpoint")]
  assert len(warnings) == 1 and f"step {stopped_at} " in warnings[0] and "falling back to step 3" in warnings[0]
  assert "does not match its checksum" in warnings[0], warnings
  assert not any(line.startswith("warning: checkpoint") for line in outputs[1].splitlines())  # process 0 warns
  one, two_rows = _rows(tmp_path / "one"), _rows(two)
  assert [r["step"] for r in two_rows] == [r["step"] for r in one] and len(one) >= 6
  compared = 0
  for a, b in zip(one, two_rows):
    assert set(a) == set(b)
    for key in a:
      if not key.startswith(("perf/", "eval/seconds", "time/")):
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
        compared += 1
  assert compared > 50
  assert any(r.get("mismatch/k3", 0) > 0 for r in two_rows)
  left = sorted(os.listdir(two / "checkpoints"))
  assert len(left) == 3 and left[0] == "3" and left[2] == "6" and left[1].startswith(f"{stopped_at}.corrupt-")


@pytest.mark.parametrize("args,message", [
    (("", 2, 0), "distributed.num_processes=2 needs distributed.coordinator"),
    (("localhost:1", 2, 2), "0 <= process_id < num_processes"),
    (("localhost:1", 1, 0), "num_processes >= 2"),
])
def test_distributed_config_mistakes_are_named(args, message):
  with pytest.raises(ValueError, match=message):
    distributed.initialize(*args)
