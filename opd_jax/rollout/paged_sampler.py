"""The static `Sampler`'s call over the paged engine (rollout.engine=paged): on one device, or data-parallel over
the devices of the sampler's mesh.

Legend: B rows (requests) of a call, D devices, G rows per group (samples_per_prompt).

`PagedSampler(graphdef, config, engine_config, mesh=None)(state, prompt_BxP, prompt_valid_BxP, key)` returns a
SampleOutput, so the training loop, evaluation and launch/sample.py take either engine. Row b is request b, drawn
under fold_in(key, b) (or under key[b] when `key` holds one key per row); the rows of a group share their prompt's
pages.

With a mesh of D devices (its tensor axis 1: the weights replicated), the B rows split into D contiguous blocks of
B / D (whole groups), as the static sampler's batch sharding places them, and each device runs its own engine
(its own KV pool and rows) on its block with its own replica of the weights, one thread per device (JAX releases
the GIL while a device computes). Each request keeps its key, so the tokens do not depend on D. The output is
sharded over the mesh's rows like the static sampler's.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from opd_jax.errors import InputError
from opd_jax.rollout import placement
from opd_jax.rollout.engine import EngineConfig, PagedEngine
from opd_jax.rollout.sampler import SampleOutput, SamplingConfig

# Statistics that describe one engine's configuration, not work done: the largest over devices, not the sum.
_SAME_ON_EVERY_DEVICE = ("page_size",)


_REPLICAS = threading.Lock()  # reading an array's shards from several threads at once raced inside JAX


def _replicas(tree, devices) -> list:
  """The tree's copy on each device: an array's shard there when it is replicated over the mesh (no transfer),
  else the array moved there."""
  def one(x, device):
    if not isinstance(x, jax.Array):
      return x
    for shard in x.addressable_shards:
      if shard.device == device and shard.data.shape == x.shape:
        return shard.data
    return jax.device_put(x, device)
  with _REPLICAS:
    return [jax.tree.map(lambda x: one(x, device), tree) for device in devices]


class PagedSampler:
  """See the module docstring. `engine`: the first device's engine (the planner plans its programs, which every
  device's engine shares); `last_stats`: the latest call's statistics, summed over devices."""

  def __init__(self, graphdef, config: SamplingConfig, engine: EngineConfig, mesh: Mesh | None = None):
    if mesh is not None and mesh.shape.get("tensor", 1) > 1:
      raise InputError(f"rollout.engine='paged' splits rows over devices, not tensors; the sampler's mesh has a "
                       f"tensor axis of {mesh.shape['tensor']} (set rollout.tensor_parallel=1, or use "
                       "rollout.engine='static')")
    self.config, self.mesh = config, mesh
    self.devices = list(mesh.devices.flat) if mesh is not None else [None]
    self.engines = [PagedEngine(graphdef, config, engine) for _ in self.devices]
    self.engine = self.engines[0]
    self.last_stats: dict = {}

  def __call__(self, state, prompt_BxP, prompt_valid_BxP, key, *, version: int = 0, weights=None) -> SampleOutput:
    """version / weights: in-flight weight updates (`PagedEngine.generate`)."""
    tokens_BxP, valid_BxP = np.asarray(prompt_BxP), np.asarray(prompt_valid_BxP).astype(bool)
    prompts = [row[valid].tolist() for row, valid in zip(tokens_BxP, valid_BxP)]
    keys_B = key if key.ndim == 1 else jax.vmap(lambda b: jax.random.fold_in(key, b))(jnp.arange(len(prompts)))
    D, B, G = len(self.devices), len(prompts), self.config.samples_per_prompt
    if D == 1:
      out, self.last_stats = self.engine.generate(state, prompts, keys_B, version=version, weights=weights)
      return out if self.mesh is None else jax.device_put(out, placement.batch_sharding(self.mesh))
    if B % (D * G):
      raise InputError(f"paged sampling over {D} devices gives each a block of whole groups of {G} rows; the "
                       f"batch has {B} rows (make the batch a multiple of {D * G})")
    block = B // D

    states = _replicas(state, self.devices)  # before the threads start
    keys = [jax.device_put(keys_B[d * block:(d + 1) * block], device) for d, device in enumerate(self.devices)]

    def run(d: int):
      device = self.devices[d]
      on_device = None if weights is None else (lambda: (lambda v, s: (v, _replicas(s, [device])[0]))(*weights()))
      with jax.default_device(device):
        return self.engines[d].generate(states[d], prompts[d * block:(d + 1) * block], keys[d], version=version,
                                        weights=on_device)

    with concurrent.futures.ThreadPoolExecutor(D) as pool:
      results = list(pool.map(run, range(D)))
    self.last_stats = _merged([stats for _, stats in results])
    joined = jax.tree.map(lambda *parts: np.concatenate([np.asarray(p) for p in parts]),
                          *[out for out, _ in results])
    return jax.device_put(joined, placement.batch_sharding(self.mesh))


def _merged(per_device: list[dict]) -> dict:
  """Every device's engine statistics summed (rows, pages, bytes and steps add up across devices), except the
  configuration ones."""
  total = collections.Counter()
  for stats in per_device:
    total.update({k: v for k, v in stats.items() if k not in _SAME_ON_EVERY_DEVICE})
  return {**dict(total), **{k: max(s[k] for s in per_device) for k in _SAME_ON_EVERY_DEVICE if k in per_device[0]}}
