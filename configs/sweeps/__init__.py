"""Sweep configs: python launch/sweep.py --config=configs/sweeps/<name>.py (shared settings in common.py)."""
