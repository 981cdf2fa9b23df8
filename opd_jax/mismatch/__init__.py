"""Mismatch on one scale: token- and vocabulary-level metrics (imported by the train step) and the budget fit.

Pure functions of log-probs / logits and of sweep rows; nothing here imports the learner. The tools that drive
the learner to measure a rollout configuration (calibration, admission, sensitivity, prefix shift) are in
opd_jax.screening.
"""

from opd_jax.mismatch.metrics import token_metrics, vocab_metrics, vocab_metrics_topk

__all__ = ["token_metrics", "vocab_metrics", "vocab_metrics_topk"]
