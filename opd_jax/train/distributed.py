"""Multi-process (multi-host) runs through jax.distributed: start-up, global batches, host reads.

One process per host (a TPU VM of a pod slice, a GPU node), or several processes on one CPU machine in the
tests. Every process runs the same program on the same config. The prompt pipeline is seeded identically
everywhere, so each process builds the same global batch and places only the shards its own devices hold
(`put_global`); host-side work on batch-sharded outputs (grading, decoding) reads them whole through an
all-gather (`to_host`). Only process 0 writes metrics and run info; orbax checkpoints are written by all
processes together, each its own shards, into a directory they all see (a shared filesystem or GCS).
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from opd_jax.cluster import jobset
from opd_jax.errors import InputError


def initialize(coordinator: str, num_processes: int, process_id: int, environ=None) -> None:
  """Joins this process to the run. coordinator: "" = single process; "auto" = let jax.distributed detect
  the cluster (Cloud TPU pod slices, SLURM, ...); "jobset" = a pod of the GKE JobSet launch/gke_launch.py made,
  everything read from its environment (opd_jax/cluster/jobset.py; `environ`, default os.environ); "host:port"
  = process 0's address, with explicit counts. Must run before anything touches a JAX device."""
  if not coordinator:
    if num_processes != 1:
      raise InputError(f"distributed.num_processes={num_processes} needs distributed.coordinator (host:port of "
                       "process 0, or 'auto')")
    return
  if coordinator == "auto":
    jax.distributed.initialize()
    return
  if coordinator == "jobset":
    coordinator, num_processes, process_id = jobset.jobset_environment(os.environ if environ is None else environ)
  if num_processes < 2 or not 0 <= process_id < num_processes:
    raise InputError(f"distributed: need num_processes >= 2 and 0 <= process_id < num_processes, got "
                     f"num_processes={num_processes}, process_id={process_id}")
  jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes only; GPU/TPU use their own
  jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)


def is_main() -> bool:
  return jax.process_index() == 0


def put_global(x, sharding: jax.sharding.Sharding) -> jax.Array:
  """A host array that every process holds whole -> a global array; each process places its own shards."""
  x = np.asarray(x)
  if jax.process_count() == 1:
    return jax.device_put(x, sharding)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def to_host(tree):
  """Batch-sharded global arrays -> whole numpy arrays on every process (an all-gather across processes)."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  return multihost_utils.process_allgather(tree, tiled=True)
