"""Multi-teacher OPD (opd_jax/train/teachers.py): routing, every row scored by its own teacher (in process and
served), a run with two teachers against the one-teacher run, and config mistakes."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from configs import common
from opd_jax.data.problems import load_jsonl
from opd_jax.data.task import Problem
from opd_jax.errors import InputError
from opd_jax.experiments.sweep import set_field
from opd_jax.models import load_pretrained, load_tokenizer
from opd_jax.objectives.losses import ObjectiveConfig
from opd_jax.rollout.sampler import left_pad
from opd_jax.serving.client import ServedTeacher
from opd_jax.spec import RunSpec, Teachers
from opd_jax.train import programs, teachers
from opd_jax.train.loop import train
from tests import servers

PAIR1_TEACHER, PAIR3_TEACHER = (os.path.join(common.ASSETS, p, "teacher") for p in ("pair1", "pair3"))
LONG_CHAINS = r"([+-]\d+){4}"  # 5 or more terms


def _config(**overrides):
  """pair1's smoke run, with pair3's teacher taking the long chains."""
  config = common.pair_config("pair1", "runlocal")
  config.teachers.pair3 = {"checkpoint": PAIR3_TEACHER, "endpoint": ""}
  config.routing.rules = ((LONG_CHAINS, "pair3"),)
  config.train.progress_bar, config.train.export_dtype, config.train.eval_sampled = False, "", True
  config.rollout.max_new_tokens = 32
  for key, value in overrides.items():
    set_field(config, key, value)
  return config


def test_routes_follow_the_row_then_the_rules_then_config_teacher(tmp_path):
  path = tmp_path / "prompts.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in (
      {"prompt": "1+2+3+4+5\n", "teacher": "teacher"},  # named: wins over the rule that matches it
      {"prompt": "1+2+3+4+5\n"},  # the rule
      {"prompt": "1+2\n"},  # no rule: config.teacher
      {"prompt": "7-1\n", "teacher": "pair3"})))
  config = _config()
  assert list(Teachers.from_config(config).route(load_jsonl(str(path)), "training")) == [0, 1, 0, 1]
  with pytest.raises(InputError, match=r"held-out problem 1 names teacher 'pair9', which is not one of "
                                        r"\['teacher', 'pair3'\]"):
    Teachers.from_config(config).route([Problem("1+2\n", "3"), Problem("1+2\n", "3", teacher="pair9")], "held-out")
  path.write_text(json.dumps({"prompt": "1+2\n", "teacher": 3}))
  with pytest.raises(InputError, match=r"prompts.jsonl:1: 'teacher' must be a teacher's name"):
    load_jsonl(str(path))


def _teacher(path, objective):
  graphdef, state = nnx.split(load_pretrained(path))
  return graphdef, state, programs.teacher_score_program(graphdef, objective, 1.0, 0)


def test_every_row_is_scored_by_its_own_teacher_in_process_or_served():
  """Routed scores equal each teacher's own scores of its rows (log-probs and top-k); with pair3's teacher served
  by launch/serve_teacher.py, only its rows go over the wire and come back to float32 noise."""
  objective = ObjectiveConfig(name="reverse_kl_topk", top_k=32)
  rng = np.random.RandomState(0)
  prompt, valid = left_pad([list(rng.randint(3, 20, rng.randint(2, 9))) for _ in range(8)], 0)
  response = rng.randint(3, 20, (8, 10))
  mask = (np.arange(10)[None] < rng.randint(1, 11, (8, 1))).astype(np.float32)
  route = np.array([0, 1, 1, 0, 1, 0, 0, 1])
  one, three = (_teacher(path, objective) for path in (PAIR1_TEACHER, PAIR3_TEACHER))
  want = [score(state, prompt, valid, response, mask) for _, state, score in (one, three)]
  host = {"prompt_BxP": prompt, "prompt_valid_BxP": valid}

  def routed(served=None):
    scoring = teachers.TeacherSet([teachers.RoutedTeacher("pair1", *one), teachers.RoutedTeacher(
        "pair3", *three, served=served)], put_batch=jax.numpy.asarray)
    return scoring.score(host, prompt, valid, response, mask, route)

  got, route_BxN = routed()
  np.testing.assert_array_equal(np.asarray(route_BxN), np.eye(2)[route])
  for n in range(2):
    rows = route == n
    np.testing.assert_allclose(np.asarray(got.logp_BxR)[rows], np.asarray(want[n].logp_BxR)[rows], atol=1e-6)
    np.testing.assert_allclose(np.asarray(got.top_logp_BxRxK)[rows], np.asarray(want[n].top_logp_BxRxK)[rows],
                               atol=1e-6)
  with servers.teacher(f"--checkpoint={PAIR3_TEACHER}") as (_, url):
    client = ServedTeacher(url, vocab_size=32, top_k=32, retry_for_s=5)
    client.check_tokenizer(load_tokenizer(PAIR1_TEACHER))
    got, _ = routed(client)
    rows_sent, tokens = client.tokens_scored, int(mask[route == 1].sum())
    client.close()
  assert rows_sent == tokens  # only pair3's rows crossed the wire
  for n in range(2):
    rows = (route == n)[:, None] & (mask > 0)
    np.testing.assert_allclose(np.asarray(got.logp_BxR)[rows], np.asarray(want[n].logp_BxR)[rows], atol=1e-4)
    np.testing.assert_allclose(np.asarray(got.top_logp_BxRxK)[rows], np.asarray(want[n].top_logp_BxRxK)[rows],
                               atol=1e-4)


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow  # a long end-to-end run: CI's full suite, not the fast tier
def test_a_routed_run_logs_per_teacher_metrics_and_two_copies_of_one_teacher_train_as_that_teacher(tmp_path):
  """Routing between two copies of pair1's teacher logs what the one-teacher run logs (same objective), to 1e-5
  (relative above 1: two programs that sum in different orders, e.g. grad_norm 13.385161 vs 13.385220 at step 4),
  plus per-teacher tokens (adding up to the batch's), KL estimates and each held-out prompt's KL to its own
  teacher, which average to the run's. (Two different teachers: the scoring test above.)"""
  short = {"train.steps": 4, "train.eval_every": 4, "train.checkpoint_every": 4, "train.log_every": 1}
  train(_config(**short, **{"teachers.pair3.checkpoint": PAIR1_TEACHER}), str(tmp_path / "copies"))
  train(_config(**short, **{"teachers": {}, "routing.rules": (), "objective.name": "reverse_kl_topk",
                            "objective.top_k": 32}), str(tmp_path / "one"))
  copies, one = _rows(tmp_path / "copies"), _rows(tmp_path / "one")
  assert [r["step"] for r in copies] == [r["step"] for r in one]
  compared = 0
  for want, got in zip(one, copies):
    for key, value in want.items():
      if not key.startswith(("time/", "perf/", "eval/seconds")):
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-5), (want["step"], key)
        compared += 1
  assert compared > 50
  for r in (r for r in copies if "loss" in r):
    assert r["teachers/teacher/tokens"] + r["teachers/pair3/tokens"] == pytest.approx(r["response_tokens"] * 16)
    assert r["teachers/teacher/tokens"] > 0 and r["teachers/pair3/tokens"] > 0
    assert all(r[f"teachers/{n}/k3"] > 0 and r[f"teachers/{n}/reverse_kl"] != 0 for n in ("teacher", "pair3"))
  for r in (r for r in copies if "eval/reverse_kl" in r):
    by_teacher = [r[f"eval/teachers/{n}/reverse_kl"] for n in ("teacher", "pair3")]
    assert min(by_teacher) <= r["eval/reverse_kl"] <= max(by_teacher) and min(by_teacher) > 0


@pytest.mark.parametrize("override,message", [
    ({"routing.teacher_name": "pair3"}, r"teacher names must differ; got \['pair3', 'pair3'\]"),
    ({"routing.teacher_name": "my teacher"}, "teacher name 'my teacher'"),
    ({"routing.rules": ((LONG_CHAINS, "pair9"),)}, r"routing.rules\[0\] routes to teacher 'pair9'"),
    ({"routing.rules": (("([", "pair3"),)}, r"routing.rules\[0\]: '\(\[' is not a regular expression"),
    ({"routing.rules": ("pair3",)}, r"routing.rules\[0\] must be a \(regex, teacher name\) pair"),
    ({"train.eval_teacher_forced": True}, "train.eval_teacher_forced is single-teacher for now"),
    ({"teachers.pair3.checkpoint": "/nonexistent/teacher"}, "'/nonexistent/teacher' does not exist"),
    ({"teachers.pair3.endpoint": "localhost:8001"}, "is not an http"),
    ({"teachers": {}, "routing.rules": ((LONG_CHAINS, "teacher"),)}, "config.teachers names no second teacher"),
])
def test_multi_teacher_config_mistakes(override, message):
  with pytest.raises(InputError, match=message):
    RunSpec.from_config(_config(**override))


def test_an_exact_objective_trains_as_top_k_over_a_small_vocabulary():
  objective = RunSpec.from_config(_config()).objective
  assert (objective.name, objective.top_k) == ("reverse_kl_topk", 32)
