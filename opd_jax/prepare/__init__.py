"""Turning released checkpoints into a teacher-student pair (layer pruning, config-driven preparation); below
the learner, which prepares the pair a config describes before loading it."""
