"""Load-time check that a model's weights are finite: NaN/inf weights are bad input, not a training problem."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from opd_jax.errors import InputError


def check_finite(state, source: str) -> None:
  """Raises InputError naming `source` and the first tensors with NaN/inf values (one reduction per tensor)."""
  leaves = jax.tree_util.tree_leaves_with_path(state)
  finite = jax.device_get([jnp.isfinite(leaf).all() for _, leaf in leaves])
  bad = [jax.tree_util.keystr(path) for (path, _), ok in zip(leaves, finite) if not np.asarray(ok)]
  if bad:
    raise InputError(f"checkpoint {source!r} has non-finite (NaN/inf) weights in {len(bad)} tensor(s), e.g. "
                     f"{', '.join(bad[:3])}; use a healthy checkpoint")
