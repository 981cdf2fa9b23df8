"""The metrics interval: the steps since the last metrics row, averaged into one row with throughput, the learning
rate, prompt truncation, device and host memory and each served teacher's wire traffic."""

from __future__ import annotations

import time

import jax
import numpy as np

from opd_jax.train import device_memory
from opd_jax.train import process_memory
from opd_jax.train.rollouts import Produced


class Interval:

  def __init__(self, run, writer, pending: list):
    """run: the opd_jax.train.setup.Run; pending: metric rows restored from a checkpoint (a resumed interval
    averages the same)."""
    self._run, self._writer = run, writer
    self.pending = list(pending)
    self._start, self._tokens, self._steps = time.time(), 0.0, 0
    self._warned_truncation = False

  def add(self, metrics: dict, produced: Produced) -> None:
    self.pending.append(metrics)
    self._tokens += produced.batch.mask_BxR.sum()
    self._steps += 1

  def pause(self, seconds: float) -> None:
    """Time outside training (an evaluation) is not throughput."""
    self._start += seconds

  def row(self, state, data_state: dict) -> dict:
    """The interval's row; starts the next interval."""
    row = _average(jax.device_get(self.pending))
    elapsed = time.time() - self._start
    row["perf/step_s"] = elapsed / max(self._steps, 1)
    row["perf/tokens_per_s"] = float(self._tokens) / elapsed
    row["learning_rate"] = float(self._run.schedule(int(state.step) - 1))  # what the interval's last update used
    row["data/prompts_truncated"] = data_state["truncated"]  # cut to data.max_prompt_tokens so far
    row.update(device_memory.peak_gib())  # accelerators only: the process's peak so far
    row.update(process_memory.host_gb())  # host RSS now and the peak so far (saves and evaluations included)
    teachers = self._run.teachers
    for teacher in teachers.served:  # request + response bytes per scored token so far, outages survived
      row[teachers.prefix(teacher) + "wire_bytes_per_token"] = teacher.served.wire_bytes_per_token()
      row[teachers.prefix(teacher) + "outages"] = teacher.served.outages
    if data_state["truncated"] and not self._warned_truncation:
      self._warned_truncation = True
      self._writer.warn(f"{data_state['truncated']} of {data_state['prompts_drawn']} prompts so far were longer "
                        f"than data.max_prompt_tokens={self._run.spec.data.max_prompt_tokens} and lost their start "
                        "(data/prompts_truncated)")
    self.pending, self._start, self._tokens, self._steps = [], time.time(), 0.0, 0
    return row


def _average(rows: list[dict]) -> dict:
  """Mean of each metric over the rows that report it."""
  keys = dict.fromkeys(k for r in rows for k in r)
  return {k: float(np.mean([float(r[k]) for r in rows if k in r])) for k in keys}
