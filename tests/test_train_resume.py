"""Whole training runs that stop and resume: preemption (SIGTERM) past a damaged checkpoint, the disaggregated
async run, and evaluation on the sampler's mesh. Their own file, so the test runner can run them beside
tests/test_train.py's (both files are long)."""

import os
import sys

import jax
import pytest

from opd_jax.errors import InputError
from opd_jax.train.loop import train
from opd_jax.train.rollouts import RolloutProducer
from tests.test_train import _config, _damage_arrays, _rows


@pytest.mark.slow
def test_preempted_run_resumes_past_a_damaged_checkpoint_and_reproduces_the_run(tiny_pair, tmp_path, capfd,
                                                                                monkeypatch):
  """A SIGTERM during step 4's rollout ends the run after step 4 with a checkpoint there (status 143, handlers
  restored); that checkpoint is then damaged, and the rerun falls back to step 3 and reproduces the
  uninterrupted run's rows. Snapshots in host memory: checkpointed from there and restored into it."""
  import signal
  from opd_jax.train.preemption import Preempted
  overrides = {"rollout.staleness_steps": 1, "rollout.weights": "int8", "rollout.snapshots_on": "host",
               "data.max_prompt_tokens": 12}  # some prompts are cut: data/prompts_truncated counts on over resume
  final = train(_config(tiny_pair, **overrides), str(tmp_path / "full"))
  # The uninterrupted run: metrics rows, evaluations, checkpoints, TensorBoard, mismatch split by source.
  rows = _rows(tmp_path / "full")
  evals = [r for r in rows if "eval/accuracy" in r]
  assert [r["step"] for r in evals] == [0, 3, 6] and final["eval/accuracy"] == evals[-1]["eval/accuracy"]
  train_rows = [r for r in rows if "loss" in r]
  assert [r["step"] for r in train_rows] == [2, 4, 6]
  assert {"mismatch_vocab/kl_sampler_learner", "opd/reverse_kl", "perf/tokens_per_s"} <= set(train_rows[0])
  for r in train_rows:  # where the step's time went: sampling, scoring and the update, each inside the step
    assert 0 < r["perf/sample_s"] and 0 < r["perf/score_s"] and 0 < r["perf/update_s"], r
    assert r["perf/sample_s"] + r["perf/score_s"] + r["perf/update_s"] <= r["perf/step_s"], r
  if sys.platform == "linux":  # host memory: resident now <= the peak so far, which never falls
    assert all(0 < r["perf/host_rss_gb"] <= r["perf/host_peak_rss_gb"] < 1e3 for r in train_rows)
    assert [r["perf/host_peak_rss_gb"] for r in train_rows] == sorted(r["perf/host_peak_rss_gb"] for r in train_rows)
  assert all(r["mismatch/k3"] > 0 for r in train_rows) and train_rows[-1]["rollout/version_lag"] == 1
  assert train_rows[-1]["mismatch_split/precision_k3"] > 0 and train_rows[-1]["mismatch_split/staleness_k3"] > 0
  truncated = [r["data/prompts_truncated"] for r in train_rows]
  assert 0 < truncated[0] < truncated[1] < truncated[2], truncated
  assert sorted(os.listdir(tmp_path / "full" / "checkpoints")) == ["3", "6"]
  assert os.listdir(tmp_path / "full" / "tensorboard")
  resumed_dir = tmp_path / "resumed"
  produce, signalled = RolloutProducer.produce, []

  def preempting_produce(self, index, version, snapshot, prompts):
    if index == 3 and not signalled:
      signalled.append(index)
      os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler would; the handler only records it
    return produce(self, index, version, snapshot, prompts)

  monkeypatch.setattr(RolloutProducer, "produce", preempting_produce)
  previous = signal.getsignal(signal.SIGTERM)
  with pytest.raises(Preempted, match="SIGTERM received; stopped after step 4") as stopped:
    train(_config(tiny_pair, **overrides), str(resumed_dir))
  monkeypatch.setattr(RolloutProducer, "produce", produce)
  assert stopped.value.status == 143 and signal.getsignal(signal.SIGTERM) == previous
  assert sorted(os.listdir(resumed_dir / "checkpoints")) == ["3", "4"]
  assert max(r["step"] for r in _rows(resumed_dir)) == 4
  _damage_arrays(str(resumed_dir / "checkpoints"), 4)
  capfd.readouterr()
  train(_config(tiny_pair, **overrides), str(resumed_dir))  # falls back to step 3 and reruns 4..6
  warnings = [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning: checkpoint step 4")]
  assert len(warnings) == 1 and "falling back to step 3" in warnings[0], warnings
  full, resumed = _rows(tmp_path / "full"), _rows(resumed_dir)
  assert [r["step"] for r in full] == [r["step"] for r in resumed]
  assert [set(r) for r in full] == [set(r) for r in resumed]
  train_s = [r["time/train_s"] for r in resumed if "time/train_s" in r]  # steps 3 (first try), 6 (resumed)
  assert len(train_s) == 2 and 0 < train_s[0] < train_s[1]  # the resumed run counts on from the checkpoint
  for a, b in zip(full, resumed):
    for key in a:  # every key, counters included, but wall-clock ones
      if not key.startswith(("perf/", "eval/seconds", "time/")):
        assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), (a["step"], key)
  # The workdir holds pair "tiny": another pair's config is refused in one line, before any restore.
  other = _config(tiny_pair, **overrides)
  other.pair = "pair2"
  with pytest.raises(InputError, match="holds a run of pair 'tiny', but this config is pair 'pair2'"):
    train(other, str(resumed_dir))


def test_a_workdir_holding_another_run_is_refused_before_anything_is_written(tiny_pair, tmp_path):
  """An evaluation-only run (train.steps=0: a record and no checkpoint) keeps it: another pair, another student or
  another rollout knob run into its workdir is refused in one line, every file left as it was; the same config
  (a finished run asked again) and a moved checkout of the same models still run."""
  workdir = str(tmp_path / "run")
  train(_config(tiny_pair, **{"train.steps": 0}), workdir)

  def files():
    return {os.path.relpath(os.path.join(root, f), workdir): open(os.path.join(root, f), "rb").read()
            for root, _, names in os.walk(workdir) for f in names}

  before = files()
  other_pair = _config(tiny_pair, **{"train.steps": 0})
  other_pair.pair = "pair2"
  other_student = _config(tiny_pair, **{"train.steps": 0, "student": tiny_pair["teacher"]})
  for config, message in ((other_pair, "holds a run of pair 'tiny', but this config is pair 'pair2'"),
                          (other_student, "holds a run with student 'student', but this config's is 'teacher'"),
                          (_config(tiny_pair, **{"train.steps": 0, "rollout.weights": "fp8"}),
                           "holds a run with rollout.weights='none', but this config has 'fp8'")):
    with pytest.raises(InputError, match=message):
      train(config, workdir)
    assert files() == before
  moved = str(tmp_path / "moved")
  os.symlink(os.path.dirname(tiny_pair["student"]), moved)
  train(_config({role: os.path.join(moved, os.path.basename(tiny_pair[role])) for role in ("teacher", "student")},
                **{"train.steps": 0}), workdir)  # the same run: evaluated again


@pytest.mark.slow
def test_disaggregated_async_on_four_plus_four_devices_logs_and_resumes(tiny_pair, tmp_path, monkeypatch):
  """The sampler on devices 0-3 (fp8 weights, fp8 KV, 4 samples per prompt), the learner on 4-7, rollouts
  produced ahead with bounded staleness. A SIGTERM sent from the producer's thread stops the run at a step
  boundary with a checkpoint and the producer thread ended; the resumed run logs the same bookkeeping."""
  import signal
  import threading
  from opd_jax.train.preemption import Preempted
  seen = []
  produce = RolloutProducer.produce

  def recording_produce(self, index, version, snapshot, prompts, latest=None):
    devices = frozenset(d.id for leaf in jax.tree.leaves(snapshot["sampler"]) for d in leaf.devices())
    seen.append((index, version, devices))
    if index == 3 and len(seen) == 4:  # the first run only
      os.kill(os.getpid(), signal.SIGTERM)
    return produce(self, index, version, snapshot, prompts, latest)

  monkeypatch.setattr(RolloutProducer, "produce", recording_produce)
  overrides = {"train.mode": "async", "train.max_staleness": 2, "rollout.placement": "disaggregated",
               "rollout.devices": 4, "rollout.weights": "fp8", "rollout.kv_cache": "fp8",
               "rollout.samples_per_prompt": 4}
  with pytest.raises(Preempted, match=r"SIGTERM received; stopped after step \d") as stopped:
    train(_config(tiny_pair, **overrides), str(tmp_path))
  step = int(str(stopped.value).split("after step ")[1].split()[0])
  assert 1 <= step < 6 and max(r["step"] for r in _rows(tmp_path)) == step
  assert str(step) in os.listdir(tmp_path / "checkpoints")
  assert not any(t.name == "opd-rollouts" for t in threading.enumerate())  # the producer thread has ended
  train(_config(tiny_pair, **overrides), str(tmp_path))  # resumes there
  rows = _rows(tmp_path)
  train_rows = [r for r in rows if "loss" in r]
  assert [r["step"] for r in train_rows] == [2, 4, 6]
  assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 3, 6]
  assert all(0 <= r["rollout/version_lag"] <= 2 and r["mismatch/k3"] > 0 for r in train_rows)
  assert train_rows[-1]["mismatch_split/precision_k3"] > 0  # the dense copy of each version scored the batch
  assert {devices for _, _, devices in seen} == {frozenset({0, 1, 2, 3})}
  assert all(index - 2 <= version <= index for index, version, _ in seen)  # bounded staleness, as consumed
  assert {index for index, _, _ in seen} >= {0, 1, 2, 3, 4, 5}  # the resumed producer starts where it stopped


@pytest.mark.slow
def test_evaluation_on_the_sampler_mesh_equals_the_learners(tiny_pair, tmp_path, monkeypatch):
  """train.eval_weights='sampler' decodes on the rollout engine's devices (0-3 of a 4 + 4 disaggregated run)
  with its synced weights; with no recipe those are the learner's (float32), so every evaluation number equals
  the learner-mesh evaluation's (greedy and sampled tokens alike; the reverse KL to float32 rounding)."""
  from opd_jax.train import evaluation
  seen, evaluate = [], evaluation.evaluate

  def recording(sampler, state, *args, sampler_state=None, **kwargs):
    if sampler_state is not None:
      seen.append(frozenset(d.id for leaf in jax.tree.leaves(sampler_state) for d in leaf.devices()))
    return evaluate(sampler, state, *args, sampler_state=sampler_state, **kwargs)

  monkeypatch.setattr(evaluation, "evaluate", recording)
  base = {"rollout.placement": "disaggregated", "rollout.devices": 4, "train.steps": 0, "train.eval_sampled": True,
          "train.eval_size": 16, "train.eval_batch_size": 8}
  train(_config(tiny_pair, **base), str(tmp_path / "learner"))
  assert not seen
  train(_config(tiny_pair, **base, **{"train.eval_weights": "sampler"}), str(tmp_path / "sampler"))
  assert seen and set(seen) == {frozenset({0, 1, 2, 3})}
  learner, sampler = (next(r for r in _rows(tmp_path / name) if "eval/accuracy" in r) for name in ("learner", "sampler"))
  for key in ("eval/accuracy", "eval/response_tokens", "eval/accuracy_sampled", "eval/response_tokens_sampled"):
    assert sampler[key] == learner[key], key
  assert sampler["eval/reverse_kl"] == pytest.approx(learner["eval/reverse_kl"], rel=1e-5)
