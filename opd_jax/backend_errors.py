"""Errors raised by XLA or the runtime that a user can act on, named as one line with the setting to change.

A backend limit (a dtype this backend cannot compute, device memory exhausted, a full disk, a missing cuDNN or
accelerator runtime, more devices asked for than there are) surfaces as a long XLA / runtime traceback whose last
line rarely says what to do. `explain(exc)` matches the exception's text (and that of the exceptions it was raised
while handling) against the limits below and returns what the user should change, or None for anything else (a
bug keeps its traceback). launch/_cli.py prints the line, writes the
full trace to a log file and exits: 1 for running out of memory or disk (a run's earlier checkpoints stay intact),
2 for the rest (a setting to change before running again).
"""

from __future__ import annotations

import dataclasses
import os
import re
import traceback


@dataclasses.dataclass(frozen=True)
class BackendLimit:
  what: str  # what happened, in the user's terms
  fix: str  # the setting to change
  exit_code: int


# (pattern over the exception's type name and text, limit); the first match wins.
_LIMITS = (
    # before the memory rule: a checkpoint write that fills the disk surfaces as RESOURCE_EXHAUSTED from orbax,
    # with the OSError it met as its context
    (re.compile(r"No space left on device|\[Errno 28\]|Disk quota exceeded|\[Errno 122\]", re.IGNORECASE),
     BackendLimit("the disk ran out of space",
                  "free space on the workdir's disk (a finished run's checkpoints/ can go), then rerun the same "
                  "command: it resumes from the last complete checkpoint", 1)),
    (re.compile(r"RESOURCE_EXHAUSTED|out of memory|\bOOM\b|Failed to allocate", re.IGNORECASE),
     BackendLimit("the device ran out of memory",
                  "lower train.micro_batch_size (or train.batch_size, rollout.max_new_tokens, eval_batch_size), "
                  "or set model.remat=full; launch/plan_memory.py --config=... predicts what fits", 1)),
    (re.compile(r"Unsupported element type for \w+::Execute: BF16 x BF16", re.IGNORECASE),
     BackendLimit("XLA:CPU cannot compute a bfloat16 x bfloat16 -> float32 dot",
                  "on CPU set --config.student_compute_dtype=float32 --config.teacher_compute_dtype=float32", 2)),
    (re.compile(r"cudnn|DNN library", re.IGNORECASE),
     BackendLimit("cuDNN is missing or failed to load",
                  "install jax with its CUDA libraries (pip install -e '.[cuda]'), or set model.attention=xla to "
                  "run attention without cuDNN", 2)),
    (re.compile(r"Unable to initialize backend '(\w+)'"),
     BackendLimit("the {0} backend could not start",
                  "install the matching jax extra (pip install -e '.[cuda]' or '.[tpu]'), or unset JAX_PLATFORMS "
                  "(JAX_PLATFORMS=cpu runs on the CPU)", 2)),
    (re.compile(r"Number of devices \d+ must be >= the product of mesh_shape", re.IGNORECASE),
     BackendLimit("the mesh asks for more devices than this process has",
                  "make mesh.fsdp x mesh.tensor (and rollout.devices) fit jax.device_count(); on CPU, "
                  "XLA_FLAGS=--xla_force_host_platform_device_count=N simulates N devices", 2)),
)


def explain(exc: BaseException) -> tuple[str, int] | None:
  """(one-line message, exit code) for a backend limit the user can act on; None otherwise."""
  if isinstance(exc, AssertionError) and _in_jax_backend_setup(exc):
    # jax 0.10 asserts, with no message, when JAX_PLATFORMS names a backend whose plugin is not installed
    text = f"Unable to initialize backend '{os.environ.get('JAX_PLATFORMS') or 'default'}'"
  elif isinstance(exc, (RuntimeError, ValueError, MemoryError, OSError)):
    # the exception and those it was raised from or while handling (orbax wraps the OSError of a full disk)
    text = " <- ".join(f"{type(e).__name__}: {e}" for e in _chain(exc))
  else:
    return None
  if isinstance(exc, MemoryError):
    text += " out of memory"
  for pattern, limit in _LIMITS:
    match = pattern.search(text)
    if match:
      what = limit.what.format(*match.groups())
      return f"{what}: {limit.fix}", limit.exit_code
  return None


def _chain(exc: BaseException) -> list[BaseException]:
  found = []
  while exc is not None and exc not in found and len(found) < 8:
    found.append(exc)
    exc = exc.__cause__ or exc.__context__
  return found


def _in_jax_backend_setup(exc: BaseException) -> bool:
  frames = traceback.extract_tb(exc.__traceback__)
  return bool(frames) and frames[-1].filename.endswith("xla_bridge.py")
