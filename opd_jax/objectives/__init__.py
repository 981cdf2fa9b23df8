"""OPD objectives (selectable by name) and the one teacher-forced log-prob path."""

from opd_jax.objectives.losses import OBJECTIVES, ObjectiveConfig, compute_loss, generalized_jsd

__all__ = ["OBJECTIVES", "ObjectiveConfig", "compute_loss", "generalized_jsd"]
