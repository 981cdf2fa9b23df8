"""Graceful preemption: SIGTERM / SIGINT end a run at the next step boundary with a checkpoint, not mid-step.

Preemptible TPU slices, spot GPUs, SLURM and Kubernetes announce preemption with SIGTERM and kill the process a
grace period later. While a `Preemption` is active the first SIGTERM or SIGINT only records the signal; the loop
asks `requested()` after each step, saves a checkpoint at the step it reached, and raises `Preempted`, which
launch/train.py turns into one line and exit status 128 + the signal's number (143 for SIGTERM, 130 for SIGINT,
what a process killed by that signal reports, so schedulers still see a preemption). A second signal while the
step finishes falls through to the previous handler (the default: end at once).

Single process only: in a multi-process run the hosts would have to agree on the step they stop at (JAX's
preemption sync point), which is not wired yet, so there the handlers are not installed and a signal ends the
process as before (a resumed run restarts from the last periodic checkpoint).
"""

from __future__ import annotations

import signal

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(RuntimeError):
  """The run stopped on a signal after checkpointing; `status` is the exit status to report (128 + signal)."""

  def __init__(self, message: str, status: int):
    super().__init__(message)
    self.status = status


class Preemption:
  """Context manager: records the first SIGTERM / SIGINT while active; restores the previous handlers on exit."""

  def __init__(self, enabled: bool = True):
    self.enabled = enabled
    self.signum: int | None = None
    self._previous: dict[int, object] = {}

  def _handle(self, signum, frame):
    del frame
    if self.signum is not None:  # a second signal: do what the process would have done without us
      previous = self._previous.get(signum)
      signal.signal(signum, previous if callable(previous) or previous in (signal.SIG_DFL, signal.SIG_IGN)
                    else signal.SIG_DFL)
      signal.raise_signal(signum)
      return
    self.signum = signum

  def __enter__(self) -> "Preemption":
    if self.enabled:
      try:
        for s in SIGNALS:
          self._previous[s] = signal.signal(s, self._handle)
      except ValueError:  # not the main thread: signals cannot be caught here, leave them as they are
        self._restore()
    return self

  def _restore(self) -> None:
    for s, previous in self._previous.items():
      signal.signal(s, signal.SIG_DFL if previous is None else previous)  # None: a handler set outside Python
    self._previous = {}

  def __exit__(self, *exc) -> None:
    self._restore()

  def requested(self) -> bool:
    return self.signum is not None

  def stopped(self, step: int, workdir: str) -> Preempted:
    """The exception to raise once the checkpoint at `step` is written."""
    name = signal.Signals(self.signum).name
    return Preempted(f"preempted: {name} received; stopped after step {step} with a checkpoint in {workdir}; run "
                     "the same command again to resume from it", 128 + self.signum)
