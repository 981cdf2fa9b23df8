"""Cluster launchers' shared parts: the GKE JobSet of a run (jobset.py)."""
