"""Mismatch on one scale: token- and vocabulary-level metrics, sensitivity, prefix shift, budget, admission."""

from opd_jax.mismatch.metrics import token_metrics, vocab_metrics, vocab_metrics_topk

__all__ = ["token_metrics", "vocab_metrics", "vocab_metrics_topk"]
