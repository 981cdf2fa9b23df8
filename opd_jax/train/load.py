"""Loading a run's models: the config's teacher or student, in the config's dtypes and model options."""

from __future__ import annotations

from flax import nnx

from opd_jax.models import load_pretrained
from opd_jax.models import sharding as shard_lib
from opd_jax.models.finite import check_finite
from opd_jax.models.tokenizer_compat import PairVocab


def load_model(config, role: str, mesh=None, vocab: PairVocab | None = None, path: str = ""):
  """The config's teacher or student (role), in its param / compute dtypes with the config's model options,
  each tensor placed straight onto its shards of `mesh` when given; with `vocab`, a model with a padded
  vocabulary keeps only the pair's common rows. `path`: another checkpoint in that role's dtypes (a second
  teacher); default config[role]."""
  path = path or config[role]
  sharding_for = shard_lib.loader_shardings(mesh) if mesh is not None else None
  m = config.model
  model = load_pretrained(path, config[f"{role}_param_dtype"], compute_dtype=config[f"{role}_compute_dtype"],
                          sharding_for=sharding_for, attention=m.attention, remat=m.remat, scan_layers=m.scan_layers,
                          vocab_size=vocab.slice_to(role) if vocab is not None else None)
  check_finite(nnx.state(model), path)
  return model
