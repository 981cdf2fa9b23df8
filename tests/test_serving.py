"""A served teacher: the vLLM-format client, our JAX server, a run scored over the wire, and outages."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from flax import nnx

from configs import common
from opd_jax.errors import InputError, TrainingStopped
from opd_jax.models import load_pretrained, load_tokenizer
from opd_jax.objectives.logprobs import score
from opd_jax.objectives.losses import ObjectiveConfig
from opd_jax.rollout.config import RolloutConfig
from opd_jax.rollout.sampler import left_pad
from opd_jax.serving import protocol
from opd_jax.serving.client import ServedTeacher
from opd_jax.serving.protocol import TeacherResponseError
from opd_jax.spec import ServedSpec, Teachers
from opd_jax.spec.run_spec import served_objective
from tests import servers

RECORDED = os.path.join(os.path.dirname(__file__), "data", "vllm_completions.json")


def _recorded_batch():
  """The two rows of the recorded response: prompt [1, 5] + response [9, 3], and prompt [2] + response [7]."""
  prompt, valid = left_pad([[1, 5], [2]], 0)
  return prompt, valid, np.array([[9, 3], [7, 0]]), np.array([[1, 1], [1, 0]], np.float32)


def _replay(tmp_path, table: dict):
  path = tmp_path / "responses.json"
  path.write_text(json.dumps(table))
  return servers.running(["tests/replay_server.py", f"--responses={path}"])


def test_a_recorded_vllm_response_scores_through_the_client():
  """vLLM's completions response with prompt_logprobs (K + 1 entries where the row's own token is not in the top
  K, decoded tokens, ranks, null first entry) gives the sampled tokens' log-probs and the top-k, in rank order."""
  with servers.running(["tests/replay_server.py", f"--responses={RECORDED}"]) as (_, url):
    client = ServedTeacher(url, vocab_size=16, top_k=2, retry_for_s=5)
    assert client.model == "Qwen/Qwen3-0.6B"  # from GET /v1/models
    logp, top_logp, top_ids = client.score(*_recorded_batch())
    client.close()
  np.testing.assert_array_equal(logp, [[-0.125, -1.5], [-3.0625, 0.0]])
  np.testing.assert_array_equal(top_ids, [[[9, 6], [11, 3]], [[1, 2], [0, 0]]])
  np.testing.assert_array_equal(top_logp, [[[-0.125, -2.75], [-0.375, -1.5]], [[-0.25, -1.75], [0, 0]]])
  assert client.bytes_received > 0 and client.tokens_scored == 3


def _body():
  with open(RECORDED) as f:
    return json.load(f)["POST /v1/completions"]["body"]


ROWS = [[1, 5, 9, 3], [2, 7]]


@pytest.mark.parametrize("break_it,field", [
    (lambda b: b["choices"].pop(), "'choices' has 1 entries for 2 prompts"),
    (lambda b: b["choices"][0]["prompt_logprobs"].pop(), r"choices\[0\].prompt_logprobs has 3 entries"),
    (lambda b: b["choices"][0]["prompt_logprobs"][2]["9"].update(logprob=float("nan")),
     r"choices\[0\].prompt_logprobs\[2\]\['9'\].logprob is nan"),
    (lambda b: b["choices"][1]["prompt_logprobs"][1].update({"99": {"logprob": -9.0}}),
     r"names token id 99, outside the student's vocabulary of 16"),
    (lambda b: b["choices"][0]["prompt_logprobs"][3].pop("3"), r"has no entry for the prompt's own token 3"),
    (lambda b: b["choices"][0]["prompt_logprobs"][2].pop("6"), r"fewer than the 2 top log-probs"),
    (lambda b: b["choices"][1].update(index=0), r"choices\[1\].index is 0"),
    (lambda b: b.pop("choices"), "'choices' is missing")])
def test_a_malformed_response_is_refused_naming_the_field(break_it, field):
  body = _body()
  assert len(protocol.parse_completions(body, ROWS, 2, 16, "URL")) == 2
  break_it(body)
  with pytest.raises(TeacherResponseError, match=field):
    protocol.parse_completions(body, ROWS, 2, 16, "URL")


def test_a_server_that_tokenizes_differently_or_refuses_is_one_error(tmp_path):
  tokenizer = load_tokenizer(os.path.join(common.ASSETS, "pair1", "student"))
  models = {"body": {"data": [{"id": "t"}]}}
  table = {"GET /v1/models": models, "POST /tokenize": {"body": {"tokens": [1, 2, 3]}},
           "POST /v1/completions": {"status": 400, "body": {"object": "error", "message": "Requested prompt "
                                                             "logprobs of 32, which is greater than max allowed: 20"}}}
  with _replay(tmp_path, table) as (_, url):
    client = ServedTeacher(url, vocab_size=32, top_k=32, retry_for_s=5)
    with pytest.raises(TeacherResponseError, match=r"tokenizes '12\+34=46' as \[1, 2, 3\] but the student's"):
      client.check_tokenizer(tokenizer)
    with pytest.raises(TeacherResponseError,
                       match="refused the request: HTTP 400: Requested prompt logprobs of 32, which is greater than "
                             "max allowed: 20$"):
      client.score(*_recorded_batch())
    client.close()


def test_our_server_scores_as_the_process_does(tiny_pair):
  """launch/serve_teacher.py (bucketed shapes, one jitted scoring call per request) against in-process scoring
  of the same rows: log-probs and top-k to float32 noise, the same top-k ids; a top-k above --max_top_k is a 400."""
  teacher = load_pretrained(tiny_pair["teacher"])
  rng = np.random.RandomState(0)
  prompt, valid = left_pad([list(rng.randint(3, 20, rng.randint(2, 9))) for _ in range(11)], 0)
  response = rng.randint(3, 20, (11, 13))
  mask = (np.arange(13)[None] < rng.randint(0, 14, (11, 1))).astype(np.float32)
  graphdef, state = nnx.split(teacher)
  want = score(graphdef, state, prompt, valid, response, mask, temperature=1.0, top_k=5)
  with servers.teacher(f"--checkpoint={tiny_pair['teacher']}", "--max_top_k=8") as (_, url):
    client = ServedTeacher(url, vocab_size=teacher.config.vocab_size, top_k=5, rows_per_request=4, retry_for_s=5)
    client.check_tokenizer(load_tokenizer(tiny_pair["student"]))
    logp, top_logp, top_ids = client.score(prompt, valid, response, mask)
    client.top_k = 9
    with pytest.raises(TeacherResponseError, match=r"HTTP 400: field 'prompt_logprobs' must be an integer in 0\.\.8"):
      client.score(prompt, valid, response, mask)
    client.close()
  live = mask[..., None] > 0
  np.testing.assert_allclose(logp, np.asarray(want.logp_BxR), atol=1e-4, rtol=0)
  np.testing.assert_allclose(np.where(live, top_logp, 0), np.asarray(want.top_logp_BxRxK) * live, atol=1e-4, rtol=0)
  live_ids = np.broadcast_to(live, top_ids.shape)  # the scored positions only (masked ones are zero on both sides)
  assert (top_ids[live_ids] == np.asarray(want.top_ids_BxRxK)[live_ids]).mean() > 0.99  # ties may swap


def test_served_teacher_config_checks():
  config = common.base_config("tiny")
  rollout, objective = RolloutConfig(), ObjectiveConfig(name="reverse_kl")

  def check(rollout, objective, vocab_size):
    return served_objective(Teachers.from_config(config), ServedSpec.from_section(config.served_teacher), rollout,
                            objective, vocab_size)

  assert check(rollout, objective, 32) is objective  # no endpoint: in-process
  config.teacher_endpoint = "127.0.0.1:8000"
  with pytest.raises(InputError, match="teacher_endpoint='127.0.0.1:8000' is not an http"):
    check(rollout, objective, 32)
  config.teacher_endpoint = "http://127.0.0.1:8000/v1"
  served = check(rollout, objective, 32)  # exact over the wire: the whole vocabulary
  assert (served.name, served.top_k) == ("reverse_kl_topk", 32)
  with pytest.raises(InputError, match="would send as 151936 log-probs per token"):
    check(rollout, objective, 151936)
  with pytest.raises(InputError, match="rollout.temperature=0.7 .* set both to 1"):
    check(RolloutConfig(temperature=0.7), ObjectiveConfig(), 32)
  config.served_teacher.rows_per_request = 0
  with pytest.raises(InputError, match="served_teacher.rows_per_request must be a positive integer"):
    check(rollout, ObjectiveConfig(), 32)


def test_an_outage_waits_and_one_past_retry_for_s_stops(tmp_path):
  """A refused connection is retried (one warning per outage) until served_teacher.retry_for_s, then the run stops
  with TrainingStopped (exit 1 in launch/train.py)."""
  warnings = []
  with servers.running(["tests/replay_server.py", f"--responses={RECORDED}"]) as (proc, url):
    client = ServedTeacher(url, vocab_size=16, top_k=2, retry_for_s=1.5, warn=warnings.append)
  servers.stop(proc)  # nothing listens there any more
  with pytest.raises(TrainingStopped, match="has not answered for [12] s .*retry_for_s=1.5; start it again"):
    client.score(*_recorded_batch())
  client.close()
  assert len(warnings) == 1 and "is not answering" in warnings[0] and client.outages == 1


def test_a_response_cut_short_is_an_outage_retried(tmp_path):
  """A server killed while writing its answer leaves a body shorter than it announced (IncompleteRead): the request
  is retried like a refused connection, and the batch is scored from the next answer."""
  with open(RECORDED) as f:
    table = json.load(f)
  body = table["POST /v1/completions"]["body"]
  table["POST /v1/completions"] = [{"cut": True, "body": body}, {"body": body}]
  warnings = []
  with _replay(tmp_path, table) as (_, url):
    client = ServedTeacher(url, vocab_size=16, top_k=2, retry_for_s=5, warn=warnings.append)
    logp, _, _ = client.score(*_recorded_batch())
    client.close()
  np.testing.assert_array_equal(logp, [[-0.125, -1.5], [-3.0625, 0.0]])
  assert client.outages == 1 and len(warnings) == 1 and "IncompleteRead" in warnings[0]


def _alive(pid: int) -> bool:
  """Whether `pid` runs (a zombie nobody reaped has exited)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
  except FileNotFoundError:
    return False


def test_a_server_does_not_outlive_the_process_that_started_it():
  """A server started with processes.start stops itself once its starter is gone, even when the starter dies
  without stopping it (here os._exit; in CI a crashed pytest worker), so no orphan keeps its memory and port."""
  starter = ("import os, sys; from opd_jax.serving import processes; "
             "proc, url = processes.start(['tests/replay_server.py', '--responses=' + sys.argv[1]], cwd='.'); "
             "print(proc.pid, flush=True); os._exit(0)")
  out = subprocess.run([sys.executable, "-c", starter, RECORDED], cwd=servers.REPO, env=servers.ENV,
                       capture_output=True, text=True, timeout=120)
  pid = int(out.stdout.split()[0])
  deadline = time.time() + 30
  while _alive(pid) and time.time() < deadline:
    time.sleep(0.1)
  if _alive(pid):
    os.kill(pid, 9)
    pytest.fail(f"the server {pid} outlived the process that started it")
