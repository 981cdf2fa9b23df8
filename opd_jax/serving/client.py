"""Scoring rollouts with a served teacher: a vLLM-compatible logprob API over HTTP (opd_jax/serving/protocol.py).

Legend: B rows (responses), P prompt length, R response length, K top-k.

`ServedTeacher(...).score(prompt_BxP, valid_BxP, response_BxR, mask_BxR)` returns what in-process teacher scoring
returns of a batch (the sampled tokens' log-probs [B, R], and the top-k [B, R, K] when the objective needs it;
0 where the mask is 0), as numpy arrays. Only those numbers cross the wire.

Requests: the batch is cut into requests of `rows_per_request` rows, at most `max_in_flight` of them at once
(threads; the server batches each request's rows into one jitted call). Each request has a `timeout_s`.

Failures: a refused connection, a timeout, a response cut short, HTTP 429 or 5xx is an outage: the request is
retried with exponential backoff (0.25 s doubling to 8 s) and the batch waits, so no step and no rollout is lost.
The first failure of an outage prints one warning line (`warn`); if the server has not answered for `retry_for_s`, the
run stops with `TrainingStopped` (launch/train.py: one `error:` line, exit 1, the last checkpoint kept). Any other
HTTP error (a request the server refuses: 4xx) and any malformed response are refused at once with one line
naming the field (`TeacherResponseError`, exit 2): a retry would get the same answer.

`check_tokenizer` asks the server to tokenize probe texts (POST /tokenize) and refuses a server whose ids differ
from the student tokenizer's: scores of another vocabulary would silently train on the wrong tokens.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Callable

import numpy as np

from opd_jax.errors import InputError, TrainingStopped
from opd_jax.serving import protocol
from opd_jax.serving.protocol import TeacherResponseError

_BACKOFF_S = (0.25, 8.0)  # first retry delay, largest delay
PROBE_TEXTS = ("12+34=46", "The capital of France is Paris.", " hello\nworld ")


def check_endpoint(endpoint: str) -> str:
  """An http(s) URL, without a trailing slash (e.g. http://127.0.0.1:8000/v1)."""
  if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
    raise InputError(f"teacher_endpoint={endpoint!r} is not an http(s) URL; give the server's OpenAI-compatible "
                     "base, e.g. http://127.0.0.1:8000/v1 (python launch/serve_teacher.py, vLLM or SGLang)")
  return endpoint.rstrip("/")


class ServedTeacher:

  def __init__(self, endpoint: str, *, vocab_size: int, top_k: int = 0, model: str = "", rows_per_request: int = 8,
               max_in_flight: int = 4, timeout_s: float = 120.0, retry_for_s: float = 300.0,
               warn: Callable[[str], None] | None = None):
    self.endpoint = check_endpoint(endpoint)
    if rows_per_request < 1 or max_in_flight < 1 or timeout_s <= 0 or retry_for_s < 0:
      raise InputError(f"served_teacher: need rows_per_request >= 1, max_in_flight >= 1, timeout_s > 0 and "
                       f"retry_for_s >= 0; got {rows_per_request}, {max_in_flight}, {timeout_s}, {retry_for_s}")
    self.vocab_size, self.top_k, self.rows_per_request = vocab_size, top_k, rows_per_request
    self.timeout_s, self.retry_for_s = timeout_s, retry_for_s
    self.warn = warn or (lambda message: None)
    self._pool = concurrent.futures.ThreadPoolExecutor(max_in_flight, thread_name_prefix="opd-teacher")
    self._lock = threading.Lock()
    self._outage_since: float | None = None  # when the current outage began (None: the server answers)
    self.bytes_sent = self.bytes_received = self.tokens_scored = 0
    self.outages = 0
    self.model = model or self._first_model()

  # --- HTTP ----------------------------------------------------------------------------------------------------

  def _post(self, url: str, body: dict) -> dict:
    """POST JSON with the outage policy (module docstring); the parsed JSON response."""
    data = json.dumps(body, separators=(",", ":")).encode()
    return self._with_retries(url, lambda: urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"}, method="POST"), len(data))

  def _get(self, url: str) -> dict:
    return self._with_retries(url, lambda: urllib.request.Request(url, method="GET"), 0)

  def _with_retries(self, url: str, make_request, sent: int) -> dict:
    delay = _BACKOFF_S[0]
    while True:
      try:
        with urllib.request.urlopen(make_request(), timeout=self.timeout_s) as response:
          raw = response.read()
        self._answered(sent, len(raw))
        try:
          return json.loads(raw)
        except ValueError:
          raise TeacherResponseError(f"served teacher at {url} answered with {len(raw)} bytes that are not JSON "
                                     f"(starting {raw[:60]!r})") from None
      except urllib.error.HTTPError as e:
        if e.code != 429 and e.code < 500:
          raise TeacherResponseError(f"served teacher at {url} refused the request: HTTP {e.code}: "
                                     f"{_error_message(e.read())}") from None
        reason = f"HTTP {e.code}"
      except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError, OSError) as e:
        reason = str(getattr(e, "reason", e)) or type(e).__name__
      except http.client.HTTPException as e:  # a response cut short (the server died mid-answer): an outage too
        reason = f"{type(e).__name__}: {e}"
      since = self._failed(url, reason)
      if time.time() - since > self.retry_for_s:
        raise TrainingStopped(f"served teacher at {url} has not answered for {time.time() - since:.0f} s "
                              f"(last: {reason}), more than served_teacher.retry_for_s={self.retry_for_s:g}; start "
                              "it again and rerun the same command to resume from the last checkpoint")
      time.sleep(delay)
      delay = min(2 * delay, _BACKOFF_S[1])

  def _failed(self, url: str, reason: str) -> float:
    with self._lock:
      if self._outage_since is None:
        self._outage_since = time.time()
        self.outages += 1
        self.warn(f"served teacher at {url} is not answering ({reason}); retrying for up to "
                  f"{self.retry_for_s:g} s (served_teacher.retry_for_s); the batch waits, no step is lost")
      return self._outage_since

  def _answered(self, sent: int, received: int) -> None:
    with self._lock:
      self._outage_since = None
      self.bytes_sent += sent
      self.bytes_received += received

  def _first_model(self) -> str:
    body = self._get(f"{self.endpoint}/models")
    data = body.get("data") if isinstance(body, dict) else None
    if not data or not isinstance(data[0], dict) or not isinstance(data[0].get("id"), str):
      raise TeacherResponseError(f"served teacher at {self.endpoint}/models: response field 'data' lists no model "
                                 "id; set served_teacher.model to the name the server serves the teacher under")
    return data[0]["id"]

  # --- checks and scoring --------------------------------------------------------------------------------------

  def check_tokenizer(self, tokenizer) -> None:
    """Refuses a server whose tokenizer gives other ids than `tokenizer` (the student's) on the probe texts."""
    root = self.endpoint[:-len("/v1")] if self.endpoint.endswith("/v1") else self.endpoint
    size = len(tokenizer.get_vocab()) if hasattr(tokenizer, "get_vocab") else 0
    vocabulary = tokenizer.decode(list(range(min(size, 256))), skip_special_tokens=True) if size else ""
    for text in (*PROBE_TEXTS, vocabulary):  # fixed texts, and the student's first 256 tokens as text
      body = self._post(f"{root}/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False})
      served = body.get("tokens") if isinstance(body, dict) else None
      ours = tokenizer.encode(text, add_special_tokens=False)
      if served != ours:
        raise TeacherResponseError(f"served teacher at {self.endpoint} tokenizes {text!r} as {served} but the "
                                   f"student's tokenizer gives {ours}: the teacher must share the student's "
                                   "tokenizer (serve a teacher of the same tokenizer family)")

  def score(self, prompt_BxP, valid_BxP, response_BxR, mask_BxR):
    """(logp_BxR, top_logp_BxRxK or None, top_ids_BxRxK or None), numpy, 0 where mask_BxR is 0."""
    prompt_BxP, valid_BxP = np.asarray(prompt_BxP), np.asarray(valid_BxP).astype(bool)
    response_BxR, mask_BxR = np.asarray(response_BxR), np.asarray(mask_BxR)
    B, R = response_BxR.shape
    K = self.top_k
    rows = [protocol.row_tokens(prompt_BxP[b], valid_BxP[b], response_BxR[b], mask_BxR[b]) for b in range(B)]
    starts = [int(np.count_nonzero(valid_BxP[b])) for b in range(B)]  # the first response token's index in its row
    logp_BxR = np.zeros((B, R), np.float32)
    top_logp_BxRxK, top_ids_BxRxK = np.zeros((B, R, K), np.float32), np.zeros((B, R, K), np.int32)
    chunks = [list(range(i, min(i + self.rows_per_request, B))) for i in range(0, B, self.rows_per_request)]
    futures = [self._pool.submit(self._score_rows, [rows[b] for b in chunk]) for chunk in chunks]
    for chunk, future in zip(chunks, futures):
      for b, (logp, top_logp, top_ids) in zip(chunk, future.result()):
        n = len(rows[b]) - starts[b]  # response tokens scored (up to the end of the mask)
        first = starts[b] - 1  # parsed arrays start at token 1 of the row
        logp_BxR[b, :n] = logp[first:first + n]
        if K:
          top_logp_BxRxK[b, :n], top_ids_BxRxK[b, :n] = top_logp[first:first + n], top_ids[first:first + n]
    with self._lock:
      self.tokens_scored += int(np.count_nonzero(mask_BxR))
    return logp_BxR, (top_logp_BxRxK if K else None), (top_ids_BxRxK if K else None)

  def _score_rows(self, rows: list[list[int]]):
    url = f"{self.endpoint}/completions"
    body = self._post(url, protocol.completions_request(self.model, rows, self.top_k))
    return protocol.parse_completions(body, rows, self.top_k, self.vocab_size, url)

  def wire_bytes_per_token(self) -> float:
    """Request + response bytes per scored response token so far."""
    return (self.bytes_sent + self.bytes_received) / max(self.tokens_scored, 1)

  def close(self) -> None:
    self._pool.shutdown(wait=False, cancel_futures=True)


def _error_message(raw: bytes) -> str:
  """The message of an error body (vLLM: {"message": ...}; OpenAI: {"error": {"message": ...}}), else its text."""
  try:
    body = json.loads(raw)
    message = body.get("message") or (body.get("error") or {}).get("message")
  except (ValueError, AttributeError):
    message = None
  text = str(message) if message else raw[:300].decode(errors="replace")
  return " ".join(text.split())
