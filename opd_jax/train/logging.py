"""Run logging: metrics.jsonl (one JSON object per line, with "step"), TensorBoard events, a progress bar."""

from __future__ import annotations

import json
import math
import os
import sys

from tqdm.auto import tqdm

from opd_jax.files import write_text


def _plain(value):
  value = float(value)
  return value if math.isfinite(value) else str(value)


def _truncate_after(path: str, resume_step: int | None) -> None:
  """On resume, drop the JSONL rows logged after the checkpoint (they will be logged again); atomic rewrite."""
  if not os.path.exists(path):
    return
  with open(path, encoding="utf-8") as f:
    rows = [line for line in f if line.strip()]
  keep = []
  for line in rows:
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      continue  # a line cut by a crash
    if resume_step is not None and row.get("step", 0) <= resume_step:
      keep.append(json.dumps(row, ensure_ascii=False) + "\n")
  write_text(path, "".join(keep))


class MetricsWriter:
  """Appends rows to workdir/metrics.jsonl (each line written and flushed whole) and to TensorBoard, and
  evaluation responses to workdir/samples.jsonl."""

  def __init__(self, workdir: str, *, resume_step: int | None, total_steps: int, progress_bar: bool,
               enabled: bool = True):
    """enabled=False: every method is a no-op (processes other than 0 of a multi-process run)."""
    self.enabled = enabled
    if not enabled:
      return
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.samples_path = os.path.join(workdir, "samples.jsonl")
    for path in (self.path, self.samples_path):
      _truncate_after(path, resume_step)
    self._file = open(self.path, "a")
    self._samples = None
    from tensorboardX import SummaryWriter
    self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
    self._bar = tqdm(total=total_steps, initial=resume_step or 0, dynamic_ncols=True, file=sys.stderr,
                     disable=not progress_bar, desc="opd")
    self._postfix = {}

  def write(self, step: int, metrics: dict) -> None:
    if not self.enabled:
      return
    row = {"step": int(step), **{k: _plain(v) if not isinstance(v, str) else v for k, v in metrics.items()}}
    self._file.write(json.dumps(row) + "\n")
    self._file.flush()
    for key, value in row.items():
      if key != "step" and isinstance(value, float):
        self._tb.add_scalar(key, value, step)
    self._tb.flush()
    for key, short in (("loss", "loss"), ("eval/accuracy", "acc"), ("mismatch/k3", "k3"),
                       ("perf/tokens_per_s", "tok/s")):
      if key in row and isinstance(row[key], float):
        self._postfix[short] = f"{row[key]:.3g}"
    self._bar.set_postfix(self._postfix, refresh=False)

  def write_samples(self, step: int, rows: list[dict]) -> None:
    """Rows (e.g. {"model", "prompt", "response"}) to samples.jsonl, each with "step"."""
    if not self.enabled or not rows:
      return
    if self._samples is None:
      self._samples = open(self.samples_path, "a", encoding="utf-8")
    self._samples.writelines(json.dumps({"step": int(step), **row}, ensure_ascii=False) + "\n" for row in rows)
    self._samples.flush()

  def warn(self, message: str) -> None:
    """One `warning:` line on stderr, printed above the progress bar."""
    if self.enabled:
      self._bar.write(f"warning: {message}", file=sys.stderr)

  def advance(self, steps: int = 1) -> None:
    if self.enabled:
      self._bar.update(steps)

  def close(self) -> None:
    if not self.enabled:
      return
    self._bar.close()
    self._file.close()
    if self._samples is not None:
      self._samples.close()
    self._tb.close()
