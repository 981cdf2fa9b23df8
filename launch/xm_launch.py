"""Launch a training run on a Cloud TPU slice or GPU VMs through xmanager (Vertex AI custom jobs).

  pip install -e '.[xm]'
  xmanager launch/xm_launch.py -- --config=configs/pair1.py --workdir=/gcs/BUCKET/opd/pair1 \\
      --accelerator=tpu_v3=32 [--override=train.steps=2000 --override=rollout.weights=fp8 ...]

Packages this repository into a container (`pip install -e .[tpu]` or `.[cuda]`) and runs launch/train.py on
every host. A slice or job that spans several hosts gets --config.distributed.coordinator=auto, so
jax.distributed finds its peers itself (opd_jax/train/distributed.py). The workdir must be visible to every
host: Vertex AI mounts Cloud Storage buckets at /gcs/BUCKET. Only the argument building below is tested here
(tests/test_cli.py); the Vertex submission needs GCP credentials.
"""

import os

from absl import flags

from launch import _cli
from opd_jax.errors import InputError

_CONFIG = flags.DEFINE_string("config", None, "Config file inside this repository, e.g. configs/pair1.py.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory every host can see, e.g. /gcs/BUCKET/opd/run1.")
_ACCELERATOR = flags.DEFINE_string("accelerator", "tpu_v3=8", "xm.JobRequirements resource=count: tpu_v3=32 "
                                   "(TPU cores), a100=8 (GPUs), ...")
_OVERRIDES = flags.DEFINE_multi_string("override", [], "Config overrides key=value (passed as --config.key=value).")
_TITLE = flags.DEFINE_string("title", "opd_jax", "Experiment title.")

# The accelerator names of xmanager's xm.ResourceType (checked against its resources.py); a newer xmanager with
# more of them needs an entry here.
CORES_PER_TPU_HOST = {"tpu_v2": 8, "tpu_v3": 8}  # TensorCores per TPU VM
GPU_TYPES = ("a100", "v100", "p100", "t4", "p4")
GPUS_PER_NODE = 8  # this launcher submits single-node GPU jobs


def parse_accelerator(spec: str) -> tuple[str, int]:
  """'tpu_v4=32' -> ('tpu_v4', 32), checked against the resources this launcher knows."""
  name, _, count = spec.partition("=")
  if name not in CORES_PER_TPU_HOST and name not in GPU_TYPES:
    raise InputError(f"--accelerator {spec!r}: unknown resource {name!r}; use one of "
                     f"{', '.join([*CORES_PER_TPU_HOST, *GPU_TYPES])}, as resource=count")
  if not count.isdigit() or int(count) < 1:
    raise InputError(f"--accelerator {spec!r}: the count after '=' must be a positive integer")
  return name, int(count)


def hosts(name: str, count: int) -> int:
  """Hosts the job spans: TPU slices of more than one VM's cores are multi-host; GPU jobs are one node."""
  if name not in CORES_PER_TPU_HOST:
    if count > GPUS_PER_NODE:
      raise InputError(f"--accelerator {name}={count}: this launcher starts one GPU node (<= {GPUS_PER_NODE}); "
                       "for several, run launch/train.py on each with --config.distributed.coordinator=HOST0:PORT")
    return 1
  per_host = CORES_PER_TPU_HOST[name]
  if count > per_host and count % per_host:
    raise InputError(f"--accelerator {name}={count}: a multi-host slice has a multiple of {per_host} cores")
  return max(1, count // per_host)


def train_args(config: str, workdir: str, overrides: list[str], num_hosts: int) -> list[str]:
  """Arguments of launch/train.py on every host."""
  if not config or not workdir:
    raise InputError("--config and --workdir are required")
  if workdir.startswith("gs://"):
    raise InputError(f"--workdir {workdir!r}: metrics are written with plain file I/O; use the bucket's "
                     "Vertex AI mount, /gcs/BUCKET/...")
  args = [f"--config={config}", f"--workdir={workdir}", "--config.train.progress_bar=False"]
  for override in overrides:
    key, sep, value = override.partition("=")
    if not sep or not key:
      raise InputError(f"--override {override!r}: expected key=value, e.g. train.steps=2000")
    args.append(f"--config.{key}={value}")
  if num_hosts > 1:
    args.append("--config.distributed.coordinator=auto")
  return args


def launch():
  name, count = parse_accelerator(_ACCELERATOR.value)
  args = train_args(_CONFIG.value, _WORKDIR.value, _OVERRIDES.value, hosts(name, count))
  from xmanager import xm, xm_local  # the 'xm' extra

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  extra = "tpu" if name.startswith("tpu") else "cuda"

  @xm.run_in_asyncio_loop
  async def submit():
    async with xm_local.create_experiment(experiment_title=_TITLE.value) as experiment:
      executor = xm_local.Vertex(requirements=xm.JobRequirements(**{name: count}))
      [executable] = experiment.package([xm.python_container(
          executor.Spec(), path=root, base_image="python:3.11-slim",
          docker_instructions=[f"COPY {os.path.basename(root)}/ opd_jax", "WORKDIR opd_jax",
                               f"RUN python -m pip install -e '.[{extra}]'"],
          entrypoint=xm.CommandList(["python launch/train.py"]))])
      experiment.add(xm.Job(executable=executable, executor=executor, args=args))

  submit()
  print(f"submitted {_TITLE.value}: {name}={count} ({hosts(name, count)} host(s)), launch/train.py {' '.join(args)}")


def main(argv):
  del argv
  _cli.run_or_exit(launch)


if __name__ == "__main__":
  _cli.run(main)
