"""Launch a training run on GKE: a TPU slice (v5e, v5p, v6e) or GPU nodes, one pod per host, as a JobSet.

  python launch/gke_launch.py --name=qwen3-opd --accelerator=tpu-v5e-16 \\
      --image=us-docker.pkg.dev/PROJECT/opd/opd_jax:latest --config=configs/real/qwen3_1p7b_to_0p6b.py \\
      --bucket=BUCKET --workdir=/gcs/BUCKET/opd/qwen3 [--override=--config.train.steps=2000 ...] --dry_run
  python launch/gke_launch.py ... --accelerator=nvidia-h100-80gb:8 --nodes=2   # two 8-GPU nodes

--dry_run prints the manifest (YAML) and submits nothing; without it the manifest is created in the cluster of
the current kubectl context with the official Kubernetes Python client (pip install -e '.[gke]'). The cluster
needs the JobSet controller (kubernetes-sigs/jobset), a node pool of the accelerator, and for --bucket the GCS
FUSE CSI driver with a service account allowed to write the bucket (--service_account). Each pod runs
launch/train.py; with several hosts they join through jax.distributed from the JobSet's environment
(opd_jax/cluster/jobset.py). A failed pod restarts the whole JobSet, which resumes from the newest checkpoint.
Tested here: the manifests of every accelerator against the Kubernetes client's models and the in-pod start
with two CPU processes (tests/test_gke_launch.py); no cluster was reached.
"""

import json

from absl import flags

from launch import _cli

_NAME = flags.DEFINE_string("name", None, "The JobSet's name (a DNS label; its pods are <name>-workers-0-<i>).")
_ACCELERATOR = flags.DEFINE_string("accelerator", None, "tpu-v5e-16 | tpu-v5p-8 | tpu-v6e-8 | nvidia-h100-80gb:8.")
_NODES = flags.DEFINE_integer("nodes", 0, "Pods (hosts); 0 = the TPU slice's hosts. Required for GPU nodes.")
_IMAGE = flags.DEFINE_string("image", None, "Container image with this repository installed.")
_CONFIG = flags.DEFINE_string("config", None, "Config file inside the image, e.g. configs/real/qwen3_1p7b_to_0p6b.py.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory under the shared storage's mount path.")
_BUCKET = flags.DEFINE_string("bucket", "", "Cloud Storage bucket for the workdir, mounted at /gcs/<bucket>.")
_VOLUME_CLAIM = flags.DEFINE_string("volume_claim", "", "Or a shared PersistentVolumeClaim, mounted at /mnt/shared.")
_OVERRIDES = flags.DEFINE_multi_string("override", [], "launch/train.py flags --config.x.y=v (repeat the flag).")
_NAMESPACE = flags.DEFINE_string("namespace", "default", "Kubernetes namespace.")
_SERVICE_ACCOUNT = flags.DEFINE_string("service_account", "", "Kubernetes service account of the pods.")
_MAX_RESTARTS = flags.DEFINE_integer("max_restarts", 3, "Whole-JobSet restarts after a pod fails.")
_REPO_DIR = flags.DEFINE_string("repo_dir", "/app", "Where the image holds this repository.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the manifest and submit nothing.")


def job_spec():
  from opd_jax.cluster.jobset import JobSpec
  return JobSpec(name=_NAME.value, accelerator=_ACCELERATOR.value, image=_IMAGE.value, config=_CONFIG.value,
                 workdir=_WORKDIR.value, nodes=_NODES.value, overrides=tuple(_OVERRIDES.value), bucket=_BUCKET.value,
                 volume_claim=_VOLUME_CLAIM.value, namespace=_NAMESPACE.value,
                 service_account=_SERVICE_ACCOUNT.value, max_restarts=_MAX_RESTARTS.value, repo_dir=_REPO_DIR.value)


def launch() -> None:
  from opd_jax.cluster import jobset
  manifest = jobset.render(job_spec())
  if _DRY_RUN.value:
    print(json.dumps(manifest, indent=2))  # JSON is YAML: kubectl apply -f takes it as it is
    return
  from opd_jax.errors import InputError
  try:
    from kubernetes import client, config as kube_config
  except ImportError:
    raise InputError("submitting needs the Kubernetes client: pip install -e '.[gke]' (or use --dry_run and "
                     "kubectl apply -f)") from None
  kube_config.load_kube_config()
  group, version = jobset.API_VERSION.split("/")
  client.CustomObjectsApi().create_namespaced_custom_object(group, version, _NAMESPACE.value, "jobsets", manifest)
  print(f"created JobSet {_NAME.value} in namespace {_NAMESPACE.value}: kubectl get jobset {_NAME.value}; logs of "
        f"pod 0: kubectl logs -l jobset.sigs.k8s.io/jobset-name={_NAME.value} -c train")


def main(argv):
  del argv
  _cli.run_or_exit(launch)


if __name__ == "__main__":
  _cli.run(main, required=("name", "accelerator", "image", "config", "workdir"))
