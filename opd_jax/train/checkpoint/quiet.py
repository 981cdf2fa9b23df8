"""Quieting the tracebacks orbax's abandoned reads leave after a failed restore (a damaged step that the manager
falls back from), and orbax's own log line about a damaged step's missing metadata. Installed by the commands
(launch/_cli.py), not by the library: it wraps the process's sys.excepthook and sys.unraisablehook and filters the
asyncio and absl loggers, which a library should not do to its host process. Imports nothing heavy, so it can be
installed before jax starts."""

from __future__ import annotations

import logging
import sys


def install() -> None:
  """Silences the tracebacks that orbax's abandoned reads leave after a failed restore; installed before the
  first restore attempt, as some arrive while the failure is still propagating.

  When one array read fails, orbax abandons the concurrent reads of the other arrays and closes its event loop.
  Then, in other threads, tensorstore callbacks find the loop closed (a bare "RuntimeError: Event loop is
  closed" traceback from asyncio's call_soon_threadsafe, through sys.excepthook, or an "Exception ignored"
  one), each abandoned read raises again when it is garbage collected ("Exception ignored in <coroutine
  _read_array_index_and_device_put>" with a tensorstore spec dump), and asyncio logs each abandoned read's task
  or gather ("Task exception was never retrieved", "_GatheringFuture exception was never retrieved"). The
  reason is already in the warning, so the process's excepthook and unraisable hook drop exactly those (passing
  everything else to the hooks they wrap), and a filter on the asyncio logger drops the records whose exception
  orbax's reads raised. A filter on the absl logger drops orbax's "Metadata file does not exist" line for a step
  missing its _CHECKPOINT_METADATA, which the manager reports itself.
  """
  asyncio_logger = logging.getLogger("asyncio")
  if not any(isinstance(f, _AbandonedReadTasks) for f in asyncio_logger.filters):
    asyncio_logger.addFilter(_AbandonedReadTasks())
  absl_logger = logging.getLogger("absl")  # where orbax logs
  if not any(isinstance(f, _MissingStepMetadata) for f in absl_logger.filters):
    absl_logger.addFilter(_MissingStepMetadata())
  if getattr(sys.unraisablehook, "drops_abandoned_reads", False):
    return
  previous_unraisable, previous_except = sys.unraisablehook, sys.excepthook

  def unraisable_hook(unraisable):
    abandoned_read = "_read_array_index" in getattr(unraisable.object, "__qualname__", "")
    if not (abandoned_read or _closed_loop(unraisable.exc_value)):
      previous_unraisable(unraisable)

  def except_hook(kind, value, traceback):
    if not _closed_loop(value):
      previous_except(kind, value, traceback)
  unraisable_hook.drops_abandoned_reads = True
  sys.unraisablehook, sys.excepthook = unraisable_hook, except_hook


def _closed_loop(error) -> bool:
  """asyncio's "Event loop is closed", raised by a call into a closed loop (what abandoned reads' callbacks do)."""
  if not isinstance(error, RuntimeError) or str(error) != "Event loop is closed":
    return False
  traceback, names = error.__traceback__, set()
  while traceback is not None:
    names.add(traceback.tb_frame.f_code.co_name)
    traceback = traceback.tb_next
  return not names or "_check_closed" in names  # no traceback: an unraisable hook's report


# orbax's array-read coroutines (orbax/checkpoint/_src/serialization/serialization.py)
_ORBAX_READS = ("async_deserialize", "_read_and_create_array", "_read_array_index_and_device_put", "_read_shard")


class _MissingStepMetadata(logging.Filter):
  """Drops orbax's "Metadata file does not exist: <step>/_CHECKPOINT_METADATA" warning, which it logs for a damaged
  step while listing the steps; the manager names that step and its missing file itself (one warning or error)."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.getMessage().startswith("Metadata file does not exist:")
                and record.getMessage().endswith("_CHECKPOINT_METADATA"))


class _AbandonedReadTasks(logging.Filter):
  """Drops asyncio's "... exception was never retrieved" records (of a Task or a gather) whose exception was
  raised in one of orbax's array reads; every other record passes."""

  def filter(self, record: logging.LogRecord) -> bool:
    if "exception was never retrieved" not in record.getMessage() or not record.exc_info:
      return True
    error, seen = record.exc_info[1], set()
    while error is not None and id(error) not in seen:
      seen.add(id(error))
      traceback = error.__traceback__
      while traceback is not None:
        if traceback.tb_frame.f_code.co_name in _ORBAX_READS:
          return False
        traceback = traceback.tb_next
      error = error.__cause__ or error.__context__
    return True
