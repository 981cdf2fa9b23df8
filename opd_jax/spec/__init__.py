"""The run spec: the typed, checked form of a training config (opd_jax/spec/run_spec.py)."""

from opd_jax.spec.parts import (DataSpec, MeshSpec, ModelOptions, OptimizerSpec, PairSpec, ServedSpec, TeacherSpec,
                                TrainSpec)
from opd_jax.spec.run_spec import RunSpec, devices_named, pair_vocab, response_group, screening_spec
from opd_jax.spec.teachers import Teachers

__all__ = ["DataSpec", "MeshSpec", "ModelOptions", "OptimizerSpec", "PairSpec", "RunSpec", "ServedSpec", "TeacherSpec",
           "Teachers", "TrainSpec", "devices_named", "pair_vocab", "response_group", "screening_spec"]
