"""Screening rollout configurations against the learner without a training run: the calibration batch
(`calibration`), the admission check against a budget (`admission`), the per-layer sensitivity scan and fitted
recipes (`sensitivity`) and the prefix-shift analysis (`prefix_shift`).

These drive the learner (models, sampler, train step), so they sit above opd_jax.train; the pure metrics and the
budget fit they use live below it in opd_jax.mismatch. Imports only run downward:
models -> rollout / objectives -> mismatch -> train -> screening -> planning -> experiments -> bench -> launch.
"""
