"""Run identity: which config, seed and code a results row came from, as one hash.

`run_id` = sha256 of {"config": the run's full resolved config, "seed": its seed, "code_version": the commit of the
opd_jax package it ran} as JSON with sorted keys. Two rows with the same run_id are the same run (a held-out
validation must share none with calibration); any change to a config field, the seed or the package's code gives
another. Paths inside the repository are written relative to it, so the same run in two checkouts has one id.
`code_version` reads the commit as launch/bench/_machine.py's provenance() does: the short HEAD commit of the
checkout the package was imported from, "+dirty" when the package has uncommitted changes ("unknown" outside git).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import opd_jax

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(opd_jax.__file__)))


def code_version(root: str = PACKAGE_ROOT) -> str:
  """`<12-hex HEAD commit>` of the checkout at `root`, + "+dirty" when its opd_jax/ has uncommitted changes."""
  git = lambda *args: subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)
  head = git("rev-parse", "--short=12", "HEAD")
  if head.returncode != 0:
    return "unknown"
  dirty = "+dirty" if git("status", "--porcelain", "--", "opd_jax").stdout.strip() else ""
  return head.stdout.strip() + dirty


def portable(value, root: str = PACKAGE_ROOT):
  """`value` (a config as JSON types) with absolute paths under `root` made relative to it."""
  if isinstance(value, dict):
    return {k: portable(v, root) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [portable(v, root) for v in value]
  if isinstance(value, str) and value.startswith(root + os.sep):
    return os.path.relpath(value, root)
  return value


def run_id(config: dict, seed: int, version: str, root: str = PACKAGE_ROOT) -> str:
  """sha256 hex of the resolved `config` (a dict of JSON types, e.g. json.loads(config.to_json())), `seed` and
  the code `version` (code_version())."""
  text = json.dumps({"config": portable(config, root), "seed": int(seed), "code_version": version},
                    sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(text.encode()).hexdigest()
