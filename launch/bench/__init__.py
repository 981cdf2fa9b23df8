"""Benchmarks: side-by-side ratios (docs/benchmarks.md); run each as python launch/bench/<name>.py."""
