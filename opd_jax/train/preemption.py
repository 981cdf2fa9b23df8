"""Graceful preemption: SIGTERM / SIGINT end a run at the next step boundary with a checkpoint, not mid-step.

Preemptible TPU slices, spot GPUs, SLURM and Kubernetes announce preemption with SIGTERM and kill the process a
grace period later. While a `Preemption` is active the loop asks `reached(step)` after every step; once it says
so, the loop saves a checkpoint at that step and raises `Preempted`, which launch/train.py turns into one line
and exit status 128 + the signal's number (143 for SIGTERM, 130 for SIGINT, what a process killed by that
signal reports, so schedulers still see a preemption).

One process: the first SIGTERM or SIGINT only records the signal, and `reached` is true after the step in
flight. A second signal while that step finishes falls through to the previous handler (the default: end at
once).

Several processes (jax.distributed): the hosts must stop at the same step, or their collectives would hang.
JAX's preemption service does that: jax.distributed.initialize installs its SIGTERM notifier, a notice on any
host reaches all of them, and `multihost_utils.reached_preemption_sync_point(step)`, asked at every step by every
host, is true on all of them at the same step (the largest step any host had reached when the notice spread,
plus one; it takes about a second). Every process then saves and exits with 143. Only SIGTERM is a notice
there: SIGINT keeps Python's default (KeyboardInterrupt on that process alone), and with the service turned off
(jax_enable_preemption_service=False) a signal ends the process as before.
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
  """Context manager: records the first SIGTERM / SIGINT while active (one process) or asks JAX's preemption
  service (several); restores the previous handlers on exit."""

  def __init__(self, processes: int = 1):
    self.multi_process = processes > 1
    self.signum: int | None = None
    self._previous: dict[int, object] = {}
    self._service = True  # several processes: JAX's preemption service answers (off when it is disabled)

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
    if not self.multi_process:  # several processes: JAX's notifier owns SIGTERM (module docstring)
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

  def reached(self, step: int) -> bool:
    """Whether the run stops (with a checkpoint) after `step`; call it after every step, on every process."""
    if not self.multi_process:
      return self.signum is not None
    if not self._service:
      return False
    from jax.experimental import multihost_utils
    try:
      reached = multihost_utils.reached_preemption_sync_point(step)
    except RuntimeError:  # jax_enable_preemption_service=False: no notices
      self._service = False
      return False
    if reached:
      self.signum = signal.SIGTERM
    return reached

  def requested(self) -> bool:
    return self.signum is not None

  def stopped(self, step: int, workdir: str) -> Preempted:
    """The exception to raise once the checkpoint at `step` is written."""
    name = signal.Signals(self.signum).name
    what = (f"{name} received; stopped" if not self.multi_process else
            f"a preemption notice ({name}) reached this run; every process stopped")
    return Preempted(f"preempted: {what} after step {step} with a checkpoint in {workdir}; run the same command "
                     "again to resume from it", 128 + self.signum)
