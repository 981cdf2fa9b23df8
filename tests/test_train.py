"""Learner step (pinned numbers, sharding invariance, non-finite skip) and the OPD loop end to end."""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from configs import common
from opd_jax.experiments.sweep import set_field
from opd_jax.models import load_pretrained
from opd_jax.models import sharding as shard_lib
from opd_jax.objectives import losses
from opd_jax.objectives.logprobs import response_logits, token_logprobs
from opd_jax.objectives.losses import ObjectiveConfig
from opd_jax.rollout.config import RolloutConfig
from opd_jax.rollout.sampler import Sampler, SamplingConfig, left_pad
from opd_jax.errors import InputError, TrainingStopped
from opd_jax.spec import RunSpec
from opd_jax.train.loop import train
from opd_jax.train.optimizer import make_optimizer, make_schedule
from opd_jax.objectives.logprobs import score
from opd_jax.train.rollouts import RolloutProducer
from opd_jax.train.step import RolloutBatch, TrainState, train_step
from opd_jax.train.workdir_lock import WorkdirLock


def _batch(pair, batch_size=8, seed=0):
  student, teacher = load_pretrained(pair["student"]), load_pretrained(pair["teacher"])
  graphdef, params = nnx.split(student)
  t_graphdef, t_state = nnx.split(teacher)
  rng = np.random.RandomState(seed)
  prompts, valid = left_pad([list(rng.randint(2, 18, rng.randint(3, 9))) for _ in range(batch_size)], 0)
  out = Sampler(graphdef, SamplingConfig(max_new_tokens=10, eos_ids=(1,), logits_top_k=32))(
      params, prompts, valid, jax.random.key(seed))
  teacher = score(t_graphdef, t_state, prompts, valid, out.tokens_BxN, out.mask_BxN, temperature=1.0,
                  return_hidden=True, top_k=16)
  batch = RolloutBatch(jnp.asarray(prompts), jnp.asarray(valid), out.tokens_BxN, out.mask_BxN, out.logprobs_BxN,
                       teacher.logp_BxR, teacher_hidden_BxRxD=teacher.hidden_BxRxD,
                       teacher_top_logprobs_BxRxK=teacher.top_logp_BxRxK, teacher_top_ids_BxRxK=teacher.top_ids_BxRxK,
                       sampler_top_logprobs_BxRxK=out.top_logprobs_BxNxK, sampler_top_ids_BxRxK=out.top_ids_BxNxK)
  return graphdef, params, batch


_TEACHER = {}


def _teacher(pair):
  if pair["teacher"] not in _TEACHER:
    _TEACHER[pair["teacher"]] = nnx.split(load_pretrained(pair["teacher"]))
  return _TEACHER[pair["teacher"]]


def _step(graphdef, params, batch, mesh, objective=ObjectiveConfig(), optimizer=None, teacher=(None, None),
          **options):
  optimizer = optimizer or make_optimizer(make_schedule(learning_rate=1e-2, warmup_steps=0, total_steps=10),
                                          weight_decay=0.0, grad_clip_norm=1.0)
  state = TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))
  shardings = shard_lib.state_shardings(state, mesh)
  t_graphdef, t_state = teacher
  t_shardings = None if t_state is None else shard_lib.state_shardings(t_state, mesh)
  fn = jax.jit(functools.partial(train_step, graphdef, optimizer, objective, 1.0, 2.0, teacher_graphdef=t_graphdef,
                                 **options),
               in_shardings=(shardings, shard_lib.batch_sharding(mesh), t_shardings), out_shardings=(shardings, None))
  return fn(jax.device_put(state, shardings), batch, t_state)


def test_one_step_pinned_numbers(tiny_pair):
  """Loss and gradient norm of one reverse_kl_pg step on the seeded tiny pair.

  Update the pinned values only when a change is meant to alter the numbers (model init, sampler, loss or
  metric definitions) -- never to make a refactor pass. Pinned with the versions in constraints.txt (jax /
  jaxlib 0.10.2, flax 0.12.8, numpy 2.4.6); a version upgrade may move them in the last digits.
  """
  graphdef, params, batch = _batch(tiny_pair)
  _, metrics = _step(graphdef, params, batch, shard_lib.make_mesh(1, 1, 1, devices=jax.devices()[:1]))
  assert float(metrics["skipped"]) == 0.0
  np.testing.assert_allclose(float(metrics["loss"]), PINNED_LOSS, rtol=1e-4)
  np.testing.assert_allclose(float(metrics["grad_norm"]), PINNED_GRAD_NORM, rtol=1e-4)
  assert abs(float(metrics["mismatch/k3"])) < 1e-6  # no knobs: sampler == learner


PINNED_LOSS = -1.7150646448135376
PINNED_GRAD_NORM = 2.0531272888183594


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["reverse_kl_pg"])  # other objectives: tests/test_chunked.py (1 device)
def test_eight_devices_match_one(tiny_pair, objective):
  graphdef, params, batch = _batch(tiny_pair)
  config = ObjectiveConfig(name=objective)
  sgd = optax.sgd(1.0)  # plain SGD, so parameters differ by exactly the gradient differences
  teacher = _teacher(tiny_pair)
  one_state, one = _step(graphdef, params, batch, shard_lib.make_mesh(1, 1, 1, devices=jax.devices()[:1]), config,
                         sgd, teacher)
  for shape in ((8, 1, 1), (2, 2, 2)):  # pure data parallel; data x fsdp x tensor together
    mesh = shard_lib.make_mesh(*shape)
    state, many = _step(graphdef, params, batch, mesh, config, sgd, teacher, logits_chunk=4, micro_batch_size=4)
    for key in ("loss", "grad_norm", "mismatch/k3", "opd/reverse_kl"):
      np.testing.assert_allclose(float(many[key]), float(one[key]), rtol=1e-5, atol=1e-6, err_msg=(shape, key))
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(one_state.params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
  kernel = state.params["layers"]["mlp"]["up_proj"]["kernel"].get_value()  # stacked [L, D, F]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")


def test_non_finite_step_is_skipped(tiny_pair):
  graphdef, params, batch = _batch(tiny_pair)
  batch.teacher_logp_BxR = batch.teacher_logp_BxR.at[0, 0].set(jnp.nan)
  mesh = shard_lib.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  state, metrics = _step(graphdef, params, batch, mesh)
  assert float(metrics["skipped"]) == 1.0 and int(state.step) == 0
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _config(pair, **overrides):
  config = common.base_config("tiny")
  common.shrink_for_local_run(config)
  config.teacher, config.student = pair["teacher"], pair["student"]
  config.rollout.max_new_tokens = 12
  config.train.progress_bar = False
  # The loop tests exercise the loop; fused attention and scanned layers (2x the compile time of a tiny
  # train step on XLA:CPU) are covered by test_models and by the _step tests above.
  config.model.attention = "reference"
  config.model.scan_layers = False
  config.train.eval_sampled = False  # one eval sampler to compile (the sampled one: test_export, test_multihost)
  config.train.export_dtype = ""  # the export at the end of training: tests/test_export.py
  for key, value in overrides.items():
    set_field(config, key, value)
  return config


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _damage_arrays(checkpoints_dir: str, step: int) -> None:
  """Truncates every array data file of checkpoint `step` to half, as a copy cut short would."""
  for root, _, names in os.walk(os.path.join(checkpoints_dir, str(step), "arrays")):
    for name in names:
      if os.sep + "d" in root:  # ocdbt data files (the metadata files stay intact)
        path = os.path.join(root, name)
        with open(path, "r+b") as f:
          f.truncate(os.path.getsize(path) // 2)


def test_evaluations_do_not_change_the_training_trajectory(tiny_pair, tmp_path):
  """A run evaluated after every update trains exactly as one evaluated only at its start and end: evaluation draws
  no training randomness and changes no state, so a recipe run evaluated at the ends can take a main run evaluated
  every 75 steps as its same-seed baseline (issue 35)."""
  trained = {}
  for every in (1, 4):
    workdir = str(tmp_path / f"every{every}")
    train(_config(tiny_pair, **{"train.steps": 4, "train.log_every": 1, "train.eval_every": every,
                                "train.checkpoint_every": 4}), workdir)
    trained[every] = [(r["step"], r["loss"], r["grad_norm"], r["response_tokens"]) for r in _rows(workdir)
                      if "loss" in r]
    assert sum("eval/accuracy" in r for r in _rows(workdir)) == (5 if every == 1 else 2)
  assert len(trained[1]) == 4 and trained[1] == trained[4]


def test_memory_is_trimmed_after_each_finished_save_and_evaluation(tiny_pair, tmp_path, monkeypatch):
  """train.malloc_trim: malloc_trim runs after each evaluation and after each checkpoint save has finished (its
  step directory is final), so a heap that keeps freed memory does not keep theirs; off, it never runs. With
  train.malloc_trim_growth_gb, also after a step whose resident size rose that much above the level of the first step
  since the last trim (here every read grows 2 GB: steps 2 and 4, the steps after a settling step)."""
  from opd_jax.train import malloc, process_memory
  grows = iter(range(10**9, 10**12, 2 * 10**9))
  monkeypatch.setattr(process_memory, "rss_bytes", lambda: (next(grows), 0))
  saves_and_evals = [[], ["2"], ["2"], ["2", "4"]]
  for on, growth, expected in ((True, 0.0, saves_and_evals), (False, 0.0, []),
                               (True, 1.5, [[], [], ["2"], ["2"], ["2"], ["2", "4"]])):
    calls, workdir = [], str(tmp_path / f"trim_{on}_{growth}")
    checkpoints = os.path.join(workdir, "checkpoints")
    monkeypatch.setattr(malloc, "trim", lambda: calls.append(sorted(n for n in os.listdir(checkpoints)
                                                                    if n.isdigit())) or True)
    train(_config(tiny_pair, **{"train.steps": 4, "train.log_every": 2, "train.eval_every": 2,
                                "train.checkpoint_every": 2, "train.malloc_trim": on,
                                "train.malloc_trim_growth_gb": growth}), workdir)
    assert calls == expected
  with pytest.raises(InputError, match="train.malloc_trim must be True or False, got 'yes'"):
    config = _config(tiny_pair)
    del config.train.malloc_trim
    config.train.malloc_trim = "yes"  # as a config file could set it
    RunSpec.from_config(config)
  with pytest.raises(InputError, match=r"train.malloc_trim_growth_gb must be a number >= 0 \(GB; 0 = off\), got -1"):
    RunSpec.from_config(_config(tiny_pair, **{"train.malloc_trim_growth_gb": -1.0}))


def test_second_trainer_on_a_live_workdir_is_refused(tiny_pair, tmp_path):
  with WorkdirLock(str(tmp_path)):
    with pytest.raises(InputError, match=f"in use by pid {os.getpid()}"):
      train(_config(tiny_pair), str(tmp_path))
  assert sorted(os.listdir(tmp_path)) == [".lock"]  # nothing else written


@pytest.mark.slow
def test_run_stops_after_max_skipped_steps(tiny_pair, tmp_path, capfd):
  # A huge learning rate makes the first update blow the weights up; every later step is non-finite.
  config = _config(tiny_pair, **{"optimizer.learning_rate": 1e30, "optimizer.warmup_steps": 0,
                                 "train.max_skipped_steps": 2})
  with pytest.raises(TrainingStopped, match="2 consecutive steps"):
    train(config, str(tmp_path))
  err = capfd.readouterr().err
  assert err.count("non-finite loss or gradient") == 2
  assert not os.path.exists(tmp_path / "export")


@pytest.mark.slow
def test_grpo_producer_groups_prompts_and_a_step_follows_the_advantage(tiny_pair):
  student, teacher = load_pretrained(tiny_pair["student"]), load_pretrained(tiny_pair["teacher"])
  graphdef, params = nnx.split(student)
  t_graphdef, t_state = nnx.split(teacher)
  rollout = RolloutConfig(max_new_tokens=8)
  even_first_token = lambda index_B, tokens, mask: (tokens[:, 0] % 2 == 0).astype(np.float32)
  producer = RolloutProducer(student_graphdef=graphdef, teacher_graphdef=t_graphdef, teacher_state=t_state,
                             rollout=rollout,
                             sampler=Sampler(graphdef, rollout.sampling(eos_ids=(1,), pad_id=0, samples_per_prompt=4)),
                             objective=ObjectiveConfig(name="grpo", group_size=4), put_batch=jnp.asarray, seed=0,
                             reward_fn=even_first_token, group_size=4)
  prompts, valid = left_pad([[5, 6, 7], [8, 9]], 0)
  batch = producer.produce(0, 0, {"sampler": params}, {"prompt_BxP": prompts, "prompt_valid_BxP": valid,
                                          "index_B": np.array([7, 9])})
  np.testing.assert_array_equal(batch.prompt_BxP, np.repeat(prompts, 4, axis=0))
  reward = (np.asarray(batch.response_BxR[:, 0]) % 2 == 0).astype(np.float32)
  np.testing.assert_array_equal(batch.reward_B, reward)
  advantage = np.asarray(losses.group_advantages(jnp.asarray(reward), 4))  # what the train step computes
  assert np.abs(advantage).max() > 0  # this seed has mixed rewards in a group

  def response_logp(p):
    logits = response_logits(nnx.merge(graphdef, p), batch.prompt_BxP, batch.prompt_valid_BxP,
                             batch.response_BxR, batch.mask_BxR)
    return np.asarray((token_logprobs(logits, batch.response_BxR) * batch.mask_BxR).sum(1))

  state, _ = _step(graphdef, params, batch, shard_lib.make_mesh(1, 1, 1, devices=jax.devices()[:1]),
                   ObjectiveConfig(name="grpo", group_size=4))
  # One update raises the log-probability of above-average responses relative to below-average ones.
  assert float(np.sum(advantage * (response_logp(state.params) - response_logp(params)))) > 0


@pytest.mark.slow
def test_grpo_baseline_trains_on_graded_groups(tiny_pair, tmp_path):
  overrides = {"objective.name": "grpo", "objective.group_size": 4, "rollout.weights": "int8"}
  train(_config(tiny_pair, **overrides), str(tmp_path))
  rows = [r for r in _rows(tmp_path) if "loss" in r]
  assert [r["step"] for r in rows] == [2, 4, 6]
  for r in rows:
    assert 0.0 <= r["rollout/reward"] <= 1.0 and 0.0 <= r["opd/zero_advantage_fraction"] <= 1.0
    assert r["mismatch/k3"] > 0 and np.isfinite(r["opd/reverse_kl"])  # same rollouts, same KL-to-teacher scale


@pytest.mark.parametrize("override,message", [
    ({"objective.name": "grpo", "objective.group_size": 3}, "not divisible by the 3 responses per prompt"),
    ({"objective.name": "grpo", "objective.group_size": 4, "rollout.samples_per_prompt": 2},
     "rollout.samples_per_prompt=2 disagrees"),
    ({"rollout.placement": "disaggregated", "rollout.devices": 8}, r"needs 1 <= rollout.devices < 8"),
    ({"rollout.devices": 4}, "only applies to rollout.placement='disaggregated'"),
    ({"rollout.tensor_parallel": 3}, "rollout.tensor_parallel=3 does not divide the sampler's 8 devices"),
    ({"rollout.snapshots_on": "disk"}, "rollout.snapshots_on"),
    ({"objective.name": "kl"}, "objective.name 'kl' is unknown"),
    ({"train.batch_size": 12}, r"train.batch_size=12 is not divisible by the mesh's batch ways data\*fsdp=8\*1"),
    ({"rollout.kv_cache": "int2"}, "kv cache dtype 'int2'"),
    ({"train.mode": "eager"}, "train.mode"),
    ({"train.eval_weights": "teacher"}, "train.eval_weights must be one of"),
    ({"train.eval_weights": "sampler", "rollout.placement": "disaggregated", "rollout.devices": 5,
      "train.batch_size": 15, "train.eval_batch_size": 6},
     r"train.eval_batch_size=6 is not divisible by the sampler's batch ways 5"),
    ({"data.source": "jsonl"}, "data.train_file=''"),
    ({"student": "/nonexistent/student"}, "'/nonexistent/student' does not exist"),
    ({"train.steps": -1}, "train.steps must be an integer >= 0"),
    ({"train.max_skipped_steps": 0}, "train.max_skipped_steps"),
    ({"train.malloc_arena_max": -1}, "train.malloc_arena_max must be an integer >= 0"),
    ({"train.micro_batch_size": 3}, "train.micro_batch_size=3 does not divide"),
    ({"optimizer.end_lr_fraction": 2.0}, "optimizer.end_lr_fraction"),
    ({"optimizer.weight_decay": -1.0}, "optimizer.weight_decay"),
    ({"data.max_prompt_tokens": 0}, "data.max_prompt_tokens"),
    ({"data.source": "csv"}, "data.source"),
    ({"rollout.max_new_tokens": 40000}, "exceeds the teacher.s max_position_embeddings 32768"),
    ({"train.export_dtype": "float16"}, "train.export_dtype"),
])
def test_config_mistakes_fail_before_compilation(tiny_pair, override, message):
  with pytest.raises(ValueError, match=message):
    RunSpec.from_config(_config(tiny_pair, **override))


def test_checkpoint_meta_is_captured_at_save_time(tmp_path):
  """Orbax writes meta on a background thread; the loop keeps appending jax arrays to the list it passed."""
  from opd_jax.train.checkpoint.manager import Checkpointer
  checkpointer = Checkpointer(str(tmp_path), keep=2)
  pending = []
  checkpointer.save(1, {"w": jnp.zeros(3)}, {"step": 1, "pending_metrics": pending})
  pending.append({"loss": jnp.ones(())})  # not JSON: a late serialization of `pending` would fail
  checkpointer.wait()
  assert checkpointer.restore_meta(1) == {"step": 1, "pending_metrics": []}
  with pytest.raises(TypeError, match="JSON serializable"):
    checkpointer.save(2, {"w": jnp.zeros(3)}, {"step": 2, "bad": jnp.ones(())})
  checkpointer.close()


def test_a_second_signal_falls_through_to_the_previous_handler():
  """The first SIGINT is only recorded; a second one does what the process did before (here: KeyboardInterrupt);
  leaving the context restores the handler."""
  import signal
  from opd_jax.train.preemption import Preemption
  outer = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    with Preemption() as preemption:
      signal.raise_signal(signal.SIGINT)
      assert preemption.requested() and preemption.stopped(7, "W").status == 130
      with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
  finally:
    signal.signal(signal.SIGINT, outer)
