"""The non-finite guard of the training loop: skipped updates counted, warned about, and a stop after too many."""

from __future__ import annotations

import jax

from opd_jax.errors import TrainingStopped


class SkipGuard:
  """Counts consecutive skipped (non-finite) updates, warns on each, and stops the run at `limit` in a row.

  A skipped update leaves the state as it was. Each step's flag is read one step late, after the next step was
  dispatched, so the host never waits on the step it just launched.
  """

  def __init__(self, limit: int, warn, checkpoint_dir: str):
    self.limit, self.warn, self.checkpoint_dir = limit, warn, checkpoint_dir
    self.in_a_row, self._pending = 0, None

  def observe(self, step: int, skipped: jax.Array) -> None:
    self.flush()
    self._pending = (step, skipped)

  def flush(self) -> None:
    if self._pending is None:
      return
    (step, skipped), self._pending = self._pending, None
    if not float(skipped):
      self.in_a_row = 0
      return
    self.in_a_row += 1
    self.warn(f"step {step} skipped: non-finite loss or gradient ({self.in_a_row} in a row; the run stops at "
              f"train.max_skipped_steps={self.limit})")
    if self.in_a_row >= self.limit:
      raise TrainingStopped(f"{self.in_a_row} consecutive steps (up to step {step}) had a non-finite loss or "
                            f"gradient and were skipped; the last good checkpoint is kept in {self.checkpoint_dir}. "
                            "Lower optimizer.learning_rate or check the data")
