"""opd_jax: on-policy distillation under training-inference mismatch, in JAX."""

__version__ = "0.1.0"
