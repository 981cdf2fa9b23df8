"""Rollout engine: sampler, KV cache, precision recipes, snapshots, noise, memory accounting."""
