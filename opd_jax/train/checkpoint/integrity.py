"""A checkpoint step's checksum manifest (`checksums.json`: the sha256 of every other file of the step), written
once orbax has finished the save and verified before the step is read (see opd_jax/train/checkpoint/manager.py)."""

from __future__ import annotations

import json
import os

from opd_jax.files import sha256, write_json

REQUIRED_FILES = ("_CHECKPOINT_METADATA", "arrays/_METADATA", "meta/metadata")
MANIFEST = "checksums.json"  # in the step directory: {"sha256": {relative path: hex digest}} of its other files


class Unreadable(Exception):
  """A damaged checkpoint step; the message is the short reason."""


def step_files(step_dir: str) -> list[str]:
  """Every file of a step directory but the manifest, as sorted relative paths."""
  files = []
  for root, _, names in os.walk(step_dir):
    files += [os.path.relpath(os.path.join(root, name), step_dir) for name in names]
  return sorted(f for f in files if f != MANIFEST)


def write_manifest_if_kept(step_dir: str) -> None:
  """write_manifest, unless max_to_keep removed the step before its turn came (then there is nothing to seal)."""
  try:
    write_manifest(step_dir)
  except FileNotFoundError:
    if os.path.isdir(step_dir):
      raise


def write_manifest(step_dir: str) -> None:
  """checksums.json of a finished step (atomically: a temporary file, then a rename)."""
  manifest = {"sha256": {name: sha256(os.path.join(step_dir, name)) for name in step_files(step_dir)}}
  write_json(os.path.join(step_dir, MANIFEST), manifest, indent=0)


def verify_manifest(step_dir: str, share: tuple[int, int] = (0, 1)) -> None:
  """Raises Unreadable when a file of the step differs from its manifest (share=(i, n): this process checks
  the sorted files i, i + n, ...; missing and extra files are checked by every process). No manifest: no
  check."""
  path = os.path.join(step_dir, MANIFEST)
  if not os.path.exists(path):
    return
  try:
    with open(path) as f:
      expected = json.load(f)["sha256"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise Unreadable(f"{MANIFEST} is unreadable ({type(e).__name__})") from None
  present = step_files(step_dir)
  missing = sorted(set(expected) - set(present))
  if missing:
    raise Unreadable(f"{missing[0]} is missing (listed in {MANIFEST})")
  extra = sorted(set(present) - set(expected))
  if extra:
    raise Unreadable(f"{extra[0]} is not in {MANIFEST} (a file added after the save)")
  index, count = share
  for name in sorted(expected)[index::count]:
    if sha256(os.path.join(step_dir, name)) != expected[name]:
      raise Unreadable(f"{name} does not match its checksum in {MANIFEST} (its bytes changed after the save)")
