"""Weight sync, learner -> sampler: one call per new learner version.

`WeightSync(rollout, learner_params, sampler_mesh, compute_dtype)(params, version)` returns the sampler's copy
of a learner version, already on the sampler's mesh and inference layout:

  1. the rollout recipe (noise, then AQT int8 / fp8 values + float32 scales; see rollout.config) applied where
     the learner's parameters live, so only recipe-precision bytes leave the learner;
  2. every other matrix stored in the compute dtype: the learner's matmuls cast float32 master weights to that
     dtype anyway, so a bfloat16 copy gives bit-identical sampler logits at half the bytes (vectors such as
     norm weights keep the learner's dtype);
  3. resharded onto the sampler mesh (one program when the meshes share devices, a device-to-device transfer
     when the sampler has devices of its own).

The result never shares buffers with `params`, so the learner may donate its state right after the call.
The sampler holds only what this returns: its memory is the recipe's (`bytes_per_device`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from aqt.jax.v2.aqt_tensor import QTensor
from flax import nnx
from jax.sharding import Mesh

from opd_jax.models import sharding as shard_lib
from opd_jax.rollout import placement
from opd_jax.rollout.config import RolloutConfig, build_sampler_state


def _sampler_copy(params: nnx.State, version: jax.Array, *, rollout: RolloutConfig, compute_dtype) -> nnx.State:
  state = build_sampler_state(params, rollout, version)
  compute_dtype = jnp.dtype(compute_dtype)

  def narrow(x):
    if isinstance(x, QTensor):  # values and scales exactly as the recipe made them
      return jax.tree.map(jnp.copy, x)
    if not isinstance(x, jax.Array):
      return x
    if x.ndim >= 2 and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize > compute_dtype.itemsize:
      return x.astype(compute_dtype)
    return jnp.copy(x)  # an explicit copy: never hand the learner's own buffer to the sampler

  return jax.tree.map(narrow, state, is_leaf=lambda x: isinstance(x, QTensor))


class WeightSync:

  def __init__(self, rollout: RolloutConfig, learner_params: nnx.State, mesh: Mesh, compute_dtype):
    """learner_params: the learner's parameters (arrays or abstract ShapeDtypeStructs with shardings)."""
    self.mesh = mesh
    fn = functools.partial(_sampler_copy, rollout=rollout, compute_dtype=compute_dtype)
    abstract = jax.eval_shape(fn, learner_params, jnp.int32(0))
    self.shardings = placement.state_shardings(abstract, mesh)
    self.abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract,
                                 self.shardings)
    learner_devices = {d for leaf in jax.tree.leaves(learner_params) if hasattr(leaf, "sharding")
                       for d in leaf.sharding.device_set}
    self._same_devices = learner_devices == set(mesh.devices.flat)
    # Same devices: quantize and reshard in one program. Own devices: quantize on the learner's, then transfer.
    self._fn = jax.jit(fn, out_shardings=self.shardings) if self._same_devices else jax.jit(fn)

  def __call__(self, params: nnx.State, version: int) -> nnx.State:
    state = self._fn(params, jnp.int32(version))
    return state if self._same_devices else jax.device_put(state, self.shardings)

  def bytes_per_device(self) -> int:
    """Bytes of the sampler's weights on one of its devices."""
    return shard_lib.per_device_bytes(self.abstract)
