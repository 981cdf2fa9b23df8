"""The run spec: the typed, checked form of a training config (opd_jax/spec/run_spec.py)."""

from opd_jax.spec.parts import (DataSpec, MeshSpec, ModelOptions, OptimizerSpec, PairSpec, ServedSpec, TeacherSpec,
                                TrainSpec)
from opd_jax.spec.run_spec import RunSpec, pair_vocab, response_group
from opd_jax.spec.teachers import Teachers

__all__ = ["DataSpec", "MeshSpec", "ModelOptions", "OptimizerSpec", "PairSpec", "RunSpec", "ServedSpec",
           "TeacherSpec", "Teachers", "TrainSpec", "pair_vocab", "response_group"]
