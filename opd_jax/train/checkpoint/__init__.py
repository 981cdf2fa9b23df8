"""A run's checkpoints: the orbax manager with the damaged-step fallback (manager.py), the checksum manifest
(integrity.py), multi-process agreement on a step (agreement.py) and the quieting of orbax's abandoned reads that
the commands install (quiet.py). Import the module you need; this file imports nothing, so a command can
install the quieting before jax starts."""
