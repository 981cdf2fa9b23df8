"""launch/gke_launch.py (opd_jax/cluster/jobset.py): the JobSet of every accelerator kind against the Kubernetes
client's models and the JobSet API's fields, the mistakes it names, --dry_run, and the in-pod start of
jax.distributed from a JobSet pod's environment with two CPU processes. No cluster is reached."""

import json
import os
import socket
import subprocess
import sys

import pytest

from opd_jax.cluster import jobset
from opd_jax.errors import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = dict(name="qwen3-opd", image="us-docker.pkg.dev/p/opd/opd_jax:1", config="configs/real/qwen3_1p7b_to_0p6b.py",
            bucket="my-bucket", workdir="/gcs/my-bucket/opd/qwen3", overrides=("--config.train.steps=2000",))
# The JobSet v1alpha2 fields this renderer may use (kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go).
JOBSET_SPEC_FIELDS = {"replicatedJobs", "network", "successPolicy", "failurePolicy", "startupPolicy", "suspend",
                      "coordinator", "managedBy", "ttlSecondsAfterFinished"}
REPLICATED_JOB_FIELDS = {"name", "groupName", "template", "replicas", "dependsOn"}
NETWORK_FIELDS = {"enableDNSHostnames", "subdomain", "publishNotReadyAddresses"}


def _spec(**overrides):
  return jobset.JobSpec(**{**BASE, **overrides})


def _model(data: dict, kind: str):
  """`data` read into the Kubernetes client's model `kind`, and written back: a misspelled or misplaced field
  is dropped on the way (the round trip differs) and a wrong type or a missing required field raises."""
  import inspect
  from kubernetes.client import ApiClient
  api = ApiClient()
  if "response_text" in inspect.signature(api.deserialize).parameters:  # kubernetes >= 35
    model = api.deserialize(json.dumps(data), kind, "application/json")
  else:  # older clients read a response object's .data
    model = api.deserialize(type("Response", (), {"data": json.dumps(data)})(), kind)
  assert api.sanitize_for_serialization(model) == data, kind
  return model


@pytest.mark.parametrize("accelerator,nodes,pods", [("tpu-v5e-16", 0, 4), ("tpu-v5p-8", 0, 1), ("tpu-v6e-8", 2, 2),
                                                    ("nvidia-h100-80gb:8", 2, 2)])
def test_every_accelerator_renders_a_jobset_the_api_accepts(accelerator, nodes, pods):
  manifest = jobset.render(_spec(accelerator=accelerator, nodes=nodes))
  assert (manifest["apiVersion"], manifest["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
  _model(manifest["metadata"], "V1ObjectMeta")
  spec = manifest["spec"]
  assert set(spec) <= JOBSET_SPEC_FIELDS and set(spec["network"]) <= NETWORK_FIELDS
  assert spec["network"]["enableDNSHostnames"] is True  # pod 0's stable name is the coordinator
  (replicated,) = spec["replicatedJobs"]
  assert set(replicated) <= REPLICATED_JOB_FIELDS and replicated["replicas"] == 1
  template = _model(replicated["template"], "V1JobTemplateSpec")
  job = template.spec
  assert (job.parallelism, job.completions, job.completion_mode, job.backoff_limit) == (pods, pods, "Indexed", 0)
  (container,) = job.template.spec.containers
  resource = jobset.ACCELERATORS[accelerator].resource
  assert container.resources.requests == container.resources.limits == {
      resource: str(jobset.ACCELERATORS[accelerator].per_host)}
  assert job.template.spec.node_selector == jobset.ACCELERATORS[accelerator].node_selector
  assert container.command[:4] == ["python", "launch/train.py", f"--config={BASE['config']}",
                                   f"--workdir={BASE['workdir']}"]
  env = {e.name: e.value for e in container.env or []}
  if pods > 1:
    assert container.command[-1] == "--config.distributed.coordinator=jobset"
    assert env == {"OPD_COORDINATOR": "qwen3-opd-workers-0-0.qwen3-opd:8476", "OPD_NUM_PROCESSES": str(pods)}
  else:
    assert "--config.distributed.coordinator=jobset" not in container.command and not env
  assert job.template.spec.volumes[0].csi.volume_attributes == {"bucketName": "my-bucket"}
  assert job.template.metadata.annotations == {"gke-gcsfuse/volumes": "true"}


def test_a_shared_volume_instead_of_a_bucket():
  manifest = jobset.render(_spec(accelerator="tpu-v6e-8", bucket="", volume_claim="shared",
                                 workdir="/mnt/shared/opd/run1"))
  job = _model(manifest["spec"]["replicatedJobs"][0]["template"], "V1JobTemplateSpec").spec
  assert job.template.spec.volumes[0].persistent_volume_claim.claim_name == "shared"
  assert job.template.spec.containers[0].volume_mounts[0].mount_path == "/mnt/shared"


def test_the_model_check_fails_on_a_misspelled_field():
  with pytest.raises(AssertionError):
    _model({"spec": {"paralelism": 2, "template": {"spec": {"containers": [{"name": "x"}]}}}}, "V1JobTemplateSpec")


@pytest.mark.parametrize("overrides,message", [
    ({"accelerator": "tpu-v4-8"}, "--accelerator='tpu-v4-8' is not one of"),
    ({"accelerator": "tpu-v5e-16", "nodes": 2}, "a tpu-v5e-16 slice has 4 host"),
    ({"accelerator": "nvidia-h100-80gb:8"}, "--nodes must be >= 1 for nvidia-h100-80gb:8"),
    ({"accelerator": "tpu-v6e-8", "name": "Qwen3_run"}, "--name='Qwen3_run' must be a DNS label"),
    ({"accelerator": "tpu-v6e-8", "volume_claim": "shared"}, "give exactly one of --bucket"),
    ({"accelerator": "tpu-v6e-8", "workdir": "/tmp/run"}, "--workdir='/tmp/run' is not under /gcs/my-bucket/"),
    ({"accelerator": "tpu-v6e-8", "overrides": ("train.steps=2",)}, "overrides are launch/train.py's --config"),
])
def test_mistakes_are_named(overrides, message):
  with pytest.raises(InputError, match=message):
    jobset.render(_spec(**overrides))


def test_dry_run_prints_the_manifest():
  out = subprocess.run([sys.executable, "launch/gke_launch.py", "--name=qwen3-opd", "--accelerator=tpu-v6e-8",
                        f"--image={BASE['image']}", f"--config={BASE['config']}", "--bucket=my-bucket",
                        f"--workdir={BASE['workdir']}", "--override=--config.train.steps=2000", "--dry_run"],
                       cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr
  assert json.loads(out.stdout) == jobset.render(_spec(accelerator="tpu-v6e-8"))


_POD = """
import json, sys
from opd_jax.train import distributed
distributed.initialize("jobset", 1, 0)
import jax, numpy as np
from jax.experimental import multihost_utils
ids = multihost_utils.process_allgather(np.array([jax.process_index()]))
print(json.dumps({"index": jax.process_index(), "count": jax.process_count(), "ids": np.asarray(ids).ravel().tolist()}))
"""


def test_two_pods_start_jax_distributed_from_the_jobset_environment():
  """Two CPU processes given a JobSet pod's environment as the manifest sets it (OPD_COORDINATOR,
  OPD_NUM_PROCESSES) and as Kubernetes sets it for an Indexed Job (JOB_COMPLETION_INDEX) join one run. The one
  change: pod 0's DNS name becomes 127.0.0.1 (no cluster DNS here)."""
  manifest = jobset.render(_spec(accelerator="tpu-v6e-8"))
  container = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
  env = {e["name"]: e["value"] for e in container["env"]}
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  host, _, manifest_port = env["OPD_COORDINATOR"].rpartition(":")
  assert host == "qwen3-opd-workers-0-0.qwen3-opd" and manifest_port == "8476"
  env["OPD_COORDINATOR"] = f"127.0.0.1:{port}"
  base = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  pods = [subprocess.Popen([sys.executable, "-c", _POD], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env={**base, **env, "JOB_COMPLETION_INDEX": str(i), "JAX_PLATFORMS": "cpu"})
          for i in range(2)]
  outs = [pod.communicate(timeout=300) for pod in pods]
  assert all(pod.returncode == 0 for pod in pods), [err[-2000:] for _, err in outs]
  rows = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
  assert rows == [{"index": i, "count": 2, "ids": [0, 1]} for i in range(2)]


def test_the_pod_environment_must_be_complete():
  with pytest.raises(InputError, match="reads JOB_COMPLETION_INDEX from the environment"):
    jobset.jobset_environment({"OPD_COORDINATOR": "a:1", "OPD_NUM_PROCESSES": "2"})
  assert jobset.jobset_environment({"OPD_COORDINATOR": "a:1", "OPD_NUM_PROCESSES": "2", "JOB_COMPLETION_INDEX": "1"}
                                   ) == ("a:1", 2, 1)
