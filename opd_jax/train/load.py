"""Loading a run's models: the pair's teacher or student, in its dtypes and model options."""

from __future__ import annotations

from flax import nnx

from opd_jax.models import load_pretrained
from opd_jax.models import sharding as shard_lib
from opd_jax.models.finite import check_finite
from opd_jax.models.tokenizer_compat import PairVocab
from opd_jax.spec import PairSpec


def load_model(pair: PairSpec, role: str, mesh=None, vocab: PairVocab | None = None, path: str = ""):
  """The pair's teacher or student (role), in its param / compute dtypes with the pair's model options, each
  tensor placed straight onto its shards of `mesh` when given; with `vocab`, a model with a padded vocabulary
  keeps only the pair's common rows. `path`: another checkpoint in that role's dtypes (a second teacher);
  default the pair's own."""
  path = path or pair.path(role)
  sharding_for = shard_lib.loader_shardings(mesh) if mesh is not None else None
  m = pair.model
  model = load_pretrained(path, pair.param_dtype(role), compute_dtype=pair.compute_dtype(role),
                          sharding_for=sharding_for, attention=m.attention, remat=m.remat, scan_layers=m.scan_layers,
                          vocab_size=vocab.slice_to(role) if vocab is not None else None)
  check_finite(nnx.state(model), path)
  return model
