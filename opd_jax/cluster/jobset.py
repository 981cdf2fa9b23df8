"""A training run on GKE as a JobSet: one pod per host of a TPU slice or GPU node pool, started together.

The manifest (`render`) is one JobSet (jobset.x-k8s.io/v1alpha2) with one replicated job of one Indexed Job:
`nodes` pods, run to completion together (parallelism = completions = nodes), no retries inside the Job
(backoffLimit 0: a failed host fails the slice, and the JobSet restarts it whole up to `max_restarts`, each time
resuming from the newest checkpoint in the shared workdir). `network.enableDNSHostnames` gives every pod a stable
name, `<jobset>-<replicated job>-<job index>-<pod index>.<jobset>`, behind the headless service the JobSet
controller creates for it; pod 0's name is the jax.distributed coordinator.

In the pod, `launch/train.py --config.distributed.coordinator=jobset` starts jax.distributed from the
environment (`jobset_environment`): OPD_COORDINATOR (pod 0's name and COORDINATOR_PORT, set here),
OPD_NUM_PROCESSES (the pods, set here) and JOB_COMPLETION_INDEX (the pod's index, which Kubernetes sets in every
pod of an Indexed Job). A single-host run needs none of it.

Accelerators (`ACCELERATORS`): TPU slices by GKE's node labels (cloud.google.com/gke-tpu-accelerator and
gke-tpu-topology) with `google.com/tpu` chips per host, the hosts following from the topology; GPU node pools by
cloud.google.com/gke-accelerator with `nvidia.com/gpu` per node and any number of nodes. The workdir is on a
Cloud Storage bucket mounted by the GCS FUSE CSI driver at /gcs/<bucket>, or on a shared PersistentVolumeClaim
mounted at /mnt/shared: every host must see the same checkpoints.
"""

from __future__ import annotations

import dataclasses
import os
import re

from opd_jax.errors import InputError

API_VERSION = "jobset.x-k8s.io/v1alpha2"
COORDINATOR_PORT = 8476
REPLICATED_JOB = "workers"
SHARED_VOLUME_PATH = "/mnt/shared"
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")  # short enough for <name>-workers-0-<pod>.<name>


@dataclasses.dataclass(frozen=True)
class Accelerator:
  node_selector: dict  # node labels the pods must land on
  resource: str  # the extended resource each pod requests
  per_host: int  # of `resource`, per pod (host)
  hosts: int = 0  # pods of a TPU slice (its topology's chips / per_host); 0 = any number (GPU nodes)


ACCELERATORS = {
    # v5e: 4 x 4 chips, 4 hosts of 4 chips (ct5lp-hightpu-4t).
    "tpu-v5e-16": Accelerator({"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
                               "cloud.google.com/gke-tpu-topology": "4x4"}, "google.com/tpu", 4, 4),
    # v5p-8: 8 TensorCores = 4 chips, 2 x 2 x 1, one host (ct5p-hightpu-4t).
    "tpu-v5p-8": Accelerator({"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
                              "cloud.google.com/gke-tpu-topology": "2x2x1"}, "google.com/tpu", 4, 1),
    # v6e: 2 x 4 chips, 2 hosts of 4 chips (ct6e-standard-4t).
    "tpu-v6e-8": Accelerator({"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                              "cloud.google.com/gke-tpu-topology": "2x4"}, "google.com/tpu", 4, 2),
    "nvidia-h100-80gb:8": Accelerator({"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}, "nvidia.com/gpu",
                                      8),
}


@dataclasses.dataclass(frozen=True)
class JobSpec:
  name: str  # the JobSet's name (DNS label)
  accelerator: str  # a key of ACCELERATORS
  image: str  # a container image with this repository installed (pip install -e '.[tpu]' or '.[cuda]')
  config: str  # the run's config file inside the image, e.g. configs/real/qwen3_1p7b_to_0p6b.py
  workdir: str  # the run directory, under the bucket's or the volume's mount path
  nodes: int = 0  # pods; 0 = the TPU slice's hosts (GPU: required)
  overrides: tuple[str, ...] = ()  # "--config.x.y=v" flags for launch/train.py
  bucket: str = ""  # a Cloud Storage bucket mounted at /gcs/<bucket> (GCS FUSE CSI driver)
  volume_claim: str = ""  # or a PersistentVolumeClaim mounted at SHARED_VOLUME_PATH
  namespace: str = "default"
  service_account: str = ""  # the Kubernetes service account (Workload Identity, for the bucket); "" = default
  max_restarts: int = 3  # whole-JobSet restarts after a pod fails (each resumes from the last checkpoint)
  repo_dir: str = "/app"  # where the image holds this repository (the container's working directory)


def hosts(spec: JobSpec) -> int:
  """The pods of the run, checked against the accelerator."""
  if spec.accelerator not in ACCELERATORS:
    raise InputError(f"--accelerator={spec.accelerator!r} is not one of {sorted(ACCELERATORS)}")
  accelerator = ACCELERATORS[spec.accelerator]
  if accelerator.hosts:
    if spec.nodes not in (0, accelerator.hosts):
      raise InputError(f"--nodes={spec.nodes}: a {spec.accelerator} slice has {accelerator.hosts} host(s), one pod "
                       f"each; leave --nodes unset or give {accelerator.hosts}")
    return accelerator.hosts
  if spec.nodes < 1:
    raise InputError(f"--nodes must be >= 1 for {spec.accelerator} (GPU nodes per run), got {spec.nodes}")
  return spec.nodes


def check(spec: JobSpec) -> None:
  """Every mistake in the job's settings, each naming its flag."""
  if not _NAME.match(spec.name):
    raise InputError(f"--name={spec.name!r} must be a DNS label of lowercase letters, digits and '-', starting "
                     "with a letter, at most 40 characters")
  hosts(spec)
  if not spec.image:
    raise InputError("--image is required: a container image with this repository installed")
  if bool(spec.bucket) == bool(spec.volume_claim):
    raise InputError("give exactly one of --bucket (a Cloud Storage bucket, mounted with GCS FUSE) or --volume_claim "
                     "(a shared PersistentVolumeClaim): every host must see the same workdir")
  mount = mount_path(spec)
  if not os.path.normpath(spec.workdir).startswith(mount + "/"):
    raise InputError(f"--workdir={spec.workdir!r} is not under {mount}/, where the shared storage is mounted; "
                     f"use e.g. {mount}/opd/{spec.name}")
  bad = [o for o in spec.overrides if not o.startswith("--config.")]
  if bad:
    raise InputError(f"--override {bad[0]!r}: overrides are launch/train.py's --config.x.y=v flags")
  if spec.max_restarts < 0:
    raise InputError(f"--max_restarts must be >= 0, got {spec.max_restarts}")


def mount_path(spec: JobSpec) -> str:
  return f"/gcs/{spec.bucket}" if spec.bucket else SHARED_VOLUME_PATH


def coordinator_address(spec: JobSpec) -> str:
  """Pod 0's stable DNS name and the coordinator port."""
  return f"{spec.name}-{REPLICATED_JOB}-0-0.{spec.name}:{COORDINATOR_PORT}"


def render(spec: JobSpec) -> dict:
  """The JobSet manifest of the run (module docstring)."""
  check(spec)
  accelerator, nodes = ACCELERATORS[spec.accelerator], hosts(spec)
  args = ["python", "launch/train.py", f"--config={spec.config}", f"--workdir={spec.workdir}", *spec.overrides]
  env = []
  if nodes > 1:
    args.append("--config.distributed.coordinator=jobset")
    env = [{"name": "OPD_COORDINATOR", "value": coordinator_address(spec)},
           {"name": "OPD_NUM_PROCESSES", "value": str(nodes)}]
  volume = ({"name": "workdir", "csi": {"driver": "gcsfuse.csi.storage.gke.io",
                                        "volumeAttributes": {"bucketName": spec.bucket}}} if spec.bucket
            else {"name": "workdir", "persistentVolumeClaim": {"claimName": spec.volume_claim}})
  container = {
      "name": "train", "image": spec.image, "workingDir": spec.repo_dir, "command": args, "env": env,
      "ports": [{"containerPort": COORDINATOR_PORT, "name": "coordinator"}],
      "resources": {"requests": {accelerator.resource: str(accelerator.per_host)},
                    "limits": {accelerator.resource: str(accelerator.per_host)}},
      "volumeMounts": [{"name": "workdir", "mountPath": mount_path(spec)}],
  }
  pod_spec = {"restartPolicy": "Never", "nodeSelector": dict(accelerator.node_selector), "containers": [container],
              "volumes": [volume]}
  if spec.service_account:
    pod_spec["serviceAccountName"] = spec.service_account
  pod_metadata = {"annotations": {"gke-gcsfuse/volumes": "true"}} if spec.bucket else {}
  job_template = {"spec": {"parallelism": nodes, "completions": nodes, "completionMode": "Indexed",
                           "backoffLimit": 0, "template": {"metadata": pod_metadata, "spec": pod_spec}}}
  return {"apiVersion": API_VERSION, "kind": "JobSet",
          "metadata": {"name": spec.name, "namespace": spec.namespace},
          "spec": {"failurePolicy": {"maxRestarts": spec.max_restarts},
                   "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                   "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1, "template": job_template}]}}


def jobset_environment(environ) -> tuple[str, int, int]:
  """(coordinator address, processes, this process's id) of a pod of the JobSet `render` made."""
  missing = [k for k in ("OPD_COORDINATOR", "OPD_NUM_PROCESSES", "JOB_COMPLETION_INDEX") if not environ.get(k)]
  if missing:
    raise InputError(f"distributed.coordinator='jobset' reads {', '.join(missing)} from the environment, which is "
                     "not set: run it in a pod of a JobSet made by launch/gke_launch.py (or give "
                     "distributed.coordinator=host:port with num_processes and process_id)")
  try:
    processes, index = int(environ["OPD_NUM_PROCESSES"]), int(environ["JOB_COMPLETION_INDEX"])
  except ValueError:
    raise InputError(f"OPD_NUM_PROCESSES={environ['OPD_NUM_PROCESSES']!r} and JOB_COMPLETION_INDEX="
                     f"{environ['JOB_COMPLETION_INDEX']!r} must be integers") from None
  return environ["OPD_COORDINATOR"], processes, index
