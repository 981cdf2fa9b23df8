"""The processes of a multi-process run decide together which checkpoint step to restore: the worst finding over
them wins, with the reason of the process that found it; processes that list different steps stop the run."""

from __future__ import annotations

import jax
import numpy as np

from opd_jax.errors import InputError

# What each process found in a step, worst last; the run takes the worst over its processes.
INTACT, DAMAGED, MISMATCH = 0, 1, 2

_TEXT_BYTES = 512  # the length of the texts processes exchange (reasons, step listings), cut to fit


def gather_texts(text: str) -> list[str]:
  """Every process's `text` (process order), through one all-gather of fixed-length bytes."""
  from jax.experimental import multihost_utils
  data = text.encode()[:_TEXT_BYTES].ljust(_TEXT_BYTES, b"\0")
  gathered = np.asarray(multihost_utils.process_allgather(np.frombuffer(data, np.uint8)))
  return [bytes(row).rstrip(b"\0").decode(errors="replace") for row in gathered.reshape(-1, _TEXT_BYTES)]


def agree(status: int, reason: str, value):
  """(status, reason, value) decided by all processes: the worst status over them, with the reason of the
  first process that has it (named when it is not this one); a single process decides alone."""
  if jax.process_count() == 1:
    return status, reason, value
  found = [(int(t[0]), t[2:]) for t in gather_texts(f"{status} {reason}")]
  worst = max(s for s, _ in found)
  if worst == status:
    return status, reason, value
  process, (_, theirs) = next((i, f) for i, f in enumerate(found) if f[0] == worst)
  return worst, f"on process {process}: {theirs}", None


def check_same_listing(steps: list[int], directory: str) -> None:
  """Every process must see the same steps; a workdir that is not one shared filesystem would split the run."""
  if jax.process_count() == 1:
    return
  listings = gather_texts(",".join(map(str, steps)))
  if len(set(listings)) > 1:
    seen = "; ".join(f"process {i}: [{listing}]" for i, listing in enumerate(listings))
    raise InputError(f"the processes of this run see different checkpoint steps in {directory!r} ({seen}); "
                     "give every process the same workdir on a shared filesystem")
