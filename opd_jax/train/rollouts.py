"""Rollout production: sample with the configured mismatch knobs, score with the teacher; sync or async.

`RolloutProducer.produce(index, version, snapshot, prompts)` turns one prompt batch into a `RolloutBatch`:
the sampler's weights of learner version `version` (`snapshot["sampler"]`, made by rollout.weight_sync: noise
+ precision recipe, on the sampler's own mesh), KV-cache dtype, sampling, teacher scoring (per-token
log-probs, plus what the objective needs of the teacher: its final hidden states for the exact vocabulary
objectives, its top-k for the *_topk ones; never [B, R, V]; in this process, or by a served teacher over HTTP),
and -- when lag and precision/noise/KV knobs can coexist -- the same-version dense learner log-probs
(`snapshot["dense"]`) that split the mismatch into its two factors. Sampler outputs move to the learner's
batch layout before the teacher (on the learner's devices) scores them. With group_size > 1 every prompt is answered group_size times (the sampler prefills it once);
with a reward function (the GRPO baseline) responses are graded and the train step standardizes rewards
within each group. The teacher scores every batch, so OPD and GRPO runs report their KL to the teacher on one
scale. The PRNG key of batch `index` is fold_in(key(seed), index), so a resumed run draws the same samples.

`AsyncRollouts` runs the producer in a background thread ahead of the learner: batch i may use any learner
version v >= i - max_staleness (it waits until one is published; the learner publishes each version's
snapshot right after its update), and at most max_staleness batches wait in
the queue. JAX releases the GIL while XLA runs, so sampling and learning overlap where the hardware allows.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Callable

import jax
import numpy as np

from opd_jax.errors import InputError
from opd_jax.objectives.losses import ObjectiveConfig
from opd_jax.rollout.config import RolloutConfig
from opd_jax.rollout.sampler import Sampler
from opd_jax.train import distributed, programs
from opd_jax.train.step import RolloutBatch


# The paged engine's per-batch statistics logged as rollout/engine_<name>: host rounds, decode row-steps (rows x
# steps computed, finished rows included), preemptions, most sequences live at once, peak KV bytes in use, and new
# weight versions taken mid-batch (rollout.inflight_updates).
ENGINE_METRICS = ("rounds", "decode_row_steps", "preempted", "peak_rows", "peak_kv_bytes", "weight_updates")


@dataclasses.dataclass
class Produced:
  index: int  # batch number (= the learner step that will consume it)
  version: int  # learner version the sampler used
  batch: RolloutBatch
  data_state: dict  # prompt iterator state after this batch was drawn
  engine: dict = dataclasses.field(default_factory=dict)  # the paged engine's statistics of this batch (logged)


class RolloutProducer:

  def __init__(self, *, student_graphdef, teacher_graphdef, teacher_state, rollout: RolloutConfig, sampler: Sampler,
               objective: ObjectiveConfig, put_batch, put_sampler_batch=None, learner_rows=None, seed: int,
               logits_chunk: int = 0, reward_fn: Callable | None = None, group_size: int = 1,
               teacher_score=None, student_score=None, teachers=None, routes=None, cross=None):
    """put_batch / put_sampler_batch: host batch -> the learner's / the sampler's batch layout (default: the
    learner's); learner_rows: the learner's batch sharding, which sampler outputs are moved to when the
    sampler has a layout of its own. logits_chunk: tokens (rows x positions) per vocabulary chunk when
    scoring (0 = all at once).
    group_size: responses per prompt (the sampler's samples_per_prompt must equal it).
    reward_fn(index_B, tokens_BxR, mask_BxR) -> float reward_B (numpy, on the host): attach rewards (GRPO).
    teacher_score / student_score: the scoring programs when already built (opd_jax.train.programs builds them
    either way). teachers / routes: the run's opd_jax.train.teachers.TeacherSet (in process or served) and each
    training problem's teacher (int [problems]; None with one teacher); they score instead of teacher_score.
    cross: an opd_jax.crosstok.scoring.CrossTokenizerScorer (a teacher of another tokenizer), which scores instead
    of both: each token gets its span's teacher log-prob and the batch its spans (tokens of no span leave the
    mask)."""
    if sampler.config.samples_per_prompt != group_size:
      raise InputError(f"the sampler prefills groups of {sampler.config.samples_per_prompt} rows but batches "
                       f"come in groups of {group_size}")
    self.rollout, self.sampler, self.put_batch = rollout, sampler, put_batch
    self.put_sampler_batch, self.learner_rows = put_sampler_batch or put_batch, learner_rows
    self.reward_fn, self.group_size = reward_fn, group_size
    self.teacher_state = teacher_state
    self.teachers, self.routes, self.cross = teachers, routes, cross
    self._seconds: dict[str, float] = {}  # the latest batch's sampling and scoring wall time (engine_stats)
    self._routed_cross = cross is not None and teachers is not None and teachers.multi
    self.key = jax.random.fold_in(jax.random.key(seed), 1)
    self._teacher = teacher_score or programs.teacher_score_program(teacher_graphdef, objective,
                                                                    rollout.temperature, logits_chunk)
    self._student = student_score or programs.student_score_program(student_graphdef, rollout.temperature,
                                                                    logits_chunk)

  def engine_stats(self) -> dict:
    """The latest batch's metrics: the paged engine's statistics (none with the static engine), a cross-tokenizer
    teacher's span counts, and the wall time of its sampling and of its scoring (perf/sample_s, perf/score_s)."""
    stats = getattr(self.sampler, "last_stats", None) or {}
    out = {f"rollout/engine_{k}": float(stats.get(k, 0)) for k in ENGINE_METRICS} if stats else {}
    if self.cross is not None:
      out.update(self.teachers.cross_metrics() if self._routed_cross else self.cross.metrics())
    return {**out, **self._seconds}

  def produce(self, index: int, version: int, snapshot: dict, prompts: dict, latest=None) -> RolloutBatch:
    """snapshot: {"sampler": the sampler's weights of `version`, "dense": that version's learner parameters
    (only when the mismatch split is on)}. latest: with rollout.inflight_updates, () -> (newest version, its
    sampler weights), which the paged engine asks between rounds; the batch then records each token's lag."""
    if self.group_size > 1:  # rows g*G .. g*G + G - 1 answer the same prompt
      prompts = {k: np.repeat(v, self.group_size, axis=0) for k, v in prompts.items()}
    inflight = {"version": version, "weights": latest} if latest is not None else {}
    start = time.perf_counter()
    out = self.sampler(snapshot["sampler"], self.put_sampler_batch(prompts["prompt_BxP"]),
                       self.put_sampler_batch(prompts["prompt_valid_BxP"]), jax.random.fold_in(self.key, index),
                       **inflight)
    jax.block_until_ready(out.tokens_BxN)
    sampled = time.perf_counter()
    if self.learner_rows is not None:  # the sampler's rows -> the learner's (on its own devices, if it has any)
      out = jax.device_put(out, jax.tree.map(lambda _: self.learner_rows, out))
    prompt_BxP = self.put_batch(prompts["prompt_BxP"])
    valid_BxP = self.put_batch(prompts["prompt_valid_BxP"])
    route_BxN = span_BxR = after_prefix_BxR = span_cover_BxRx4 = marginal_cover_BxRx6 = None
    mask_BxN = out.mask_BxN
    if self._routed_cross:  # teachers of their own tokenizers, each row scored by its own
      teacher, span_BxR, route_BxN = self.teachers.cross_score(prompts["index_B"], out.tokens_BxN, mask_BxN,
                                                               np.asarray(self.routes[prompts["index_B"]]))
      mask_BxN = mask_BxN * (span_BxR >= 0)
    elif self.cross is not None:  # a teacher of another tokenizer: span scores (opd_jax/crosstok)
      teacher, span_BxR = self.cross.score(self.teacher_state, prompts["index_B"], out.tokens_BxN, mask_BxN)
      mask_BxN = mask_BxN * (span_BxR >= 0)
      after_prefix_BxR = self.cross.after_prefix()
      span_cover_BxRx4 = self.cross.student_cover()
      marginal_cover_BxRx6 = self.cross.marginal_cover()
    elif self.teachers is not None:  # each row by its own teacher, in this process or over the wire
      routes = self.routes[prompts["index_B"]] if self.routes is not None else None
      teacher, route_BxN = self.teachers.score(prompts, prompt_BxP, valid_BxP, out.tokens_BxN, out.mask_BxN, routes)
    else:
      teacher = self._teacher(self.teacher_state, prompt_BxP, valid_BxP, out.tokens_BxN, out.mask_BxN)
    jax.block_until_ready(teacher.logp_BxR)  # the wall times are what each phase took, not its dispatch
    self._seconds = {"perf/sample_s": sampled - start, "perf/score_s": time.perf_counter() - sampled}
    snapshot_logp = None
    if "dense" in snapshot:
      snapshot_logp = self._student(snapshot["dense"], prompt_BxP, valid_BxP, out.tokens_BxN, out.mask_BxN).logp_BxR
    reward = None
    if self.reward_fn is not None:
      tokens, mask = distributed.to_host((out.tokens_BxN, out.mask_BxN))
      reward = self.put_batch(np.asarray(self.reward_fn(prompts["index_B"], tokens, mask), np.float32))
    return RolloutBatch(prompt_BxP, valid_BxP, out.tokens_BxN, mask_BxN, out.logprobs_BxN, teacher.logp_BxR,
                        teacher_hidden_BxRxD=teacher.hidden_BxRxD, teacher_top_logprobs_BxRxK=teacher.top_logp_BxRxK,
                        teacher_top_ids_BxRxK=teacher.top_ids_BxRxK, sampler_top_logprobs_BxRxK=out.top_logprobs_BxNxK,
                        sampler_top_ids_BxRxK=out.top_ids_BxNxK, snapshot_logp_BxR=snapshot_logp, reward_B=reward,
                        teacher_route_BxN=route_BxN,
                        version_lag_BxR=None if latest is None else (index - out.version_BxN).astype(np.float32),
                        span_BxR=span_BxR, after_prefix_BxR=after_prefix_BxR, span_cover_BxRx4=span_cover_BxRx4,
                        marginal_cover_BxRx6=marginal_cover_BxRx6,
                        teacher_prev_hidden_BxRxD=None if marginal_cover_BxRx6 is None else teacher.prev_hidden_BxRxD)


class AsyncRollouts:
  """Background producer thread with bounded staleness; `get()` returns the next `Produced` in order."""

  def __init__(self, producer: RolloutProducer, prompts, *, start_index: int, max_staleness: int,
               initial_version: int, initial_snapshot: dict):
    if max_staleness < 1:
      raise InputError(f"train.max_staleness must be >= 1 in async mode, got {max_staleness}")
    self._producer, self._prompts, self._max_staleness = producer, prompts, max_staleness
    self._queue: queue.Queue = queue.Queue(maxsize=max_staleness)
    self._latest = (initial_version, initial_snapshot)
    self._cond = threading.Condition()
    self._stop = threading.Event()
    self._error: BaseException | None = None
    self._next_index = start_index
    self._thread = threading.Thread(target=self._run, name="opd-rollouts", daemon=True)
    self._thread.start()

  def publish(self, version: int, snapshot: dict) -> None:
    """The learner's newest version, as produce() takes it (buffers the learner will not donate)."""
    with self._cond:
      self._latest = (version, snapshot)
      self._cond.notify_all()

  def _latest_sampler(self) -> tuple[int, object]:
    """(newest published version, its sampler weights): what the paged engine asks between rounds."""
    with self._cond:
      return self._latest[0], self._latest[1]["sampler"]

  def _run(self) -> None:
    try:
      while not self._stop.is_set():
        index = self._next_index
        with self._cond:
          while self._latest[0] < index - self._max_staleness and not self._stop.is_set():
            self._cond.wait(timeout=0.1)
          version, snapshot = self._latest
        if self._stop.is_set():
          return
        prompts = next(self._prompts)
        batch = self._producer.produce(index, version, snapshot, prompts,
                                       self._latest_sampler if self._producer.rollout.inflight_updates else None)
        jax.block_until_ready(batch)
        item = Produced(index, version, batch, self._prompts.get_state(), self._producer.engine_stats())
        while not self._stop.is_set():
          try:
            self._queue.put(item, timeout=0.1)
            break
          except queue.Full:
            continue
        self._next_index += 1
    except BaseException as e:  # surfaced to the learner by get()
      self._error = e

  def get(self) -> Produced:
    while True:
      try:
        return self._queue.get(timeout=0.5)
      except queue.Empty:
        if self._error is not None:
          raise RuntimeError(f"rollout producer failed: {self._error}") from self._error
        if not self._thread.is_alive():
          raise RuntimeError("rollout producer stopped without producing the next batch")

  def close(self) -> None:
    self._stop.set()
    self._thread.join(timeout=30)
