"""Our JAX teacher behind the logprob API subset of opd_jax/serving/protocol.py (the embedded default server).

Legend: B rows, R tokens scored per row (all but the first), K top-k, V vocab.

`build_app(scorer, ...)` is a Starlette (ASGI) app with the routes a vLLM OpenAI server has for this use:
POST /v1/completions (prompt log-probs of token-id prompts), POST /tokenize, GET /v1/models and GET /health.
`serve(app, host, port)` runs it under uvicorn, which parses HTTP, runs the event loop and shuts down gracefully on
SIGTERM / SIGINT (in-flight requests finish, then the process exits). It binds 127.0.0.1 unless told otherwise.

Scoring (`Scorer`): each request's rows are scored in one jitted call of the package's one scoring function
(opd_jax.objectives.logprobs.score: hidden states, then the LM head chunk by chunk, never [B, R, V]), with the
row's first token as the "prompt" and the rest as the "response". Shapes are bucketed, rows to a power of two and
tokens to a multiple of `length_bucket`, so requests of any size reuse a handful of compiled programs; requests
run one at a time (a lock), so the server's memory is one program's. Log-probs are at temperature 1, as vLLM's
prompt log-probs are (the raw logits).
"""

from __future__ import annotations

import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from opd_jax.errors import InputError
from opd_jax.objectives.logprobs import score
from opd_jax.serving import protocol


class Scorer:
  """Prompt log-probs and top-k of token-id rows under one model (bucketed, jitted, one call at a time)."""

  def __init__(self, model, *, max_top_k: int = 64, logits_chunk: int = 512, length_bucket: int = 32,
               max_rows: int = 64, max_tokens: int = 8192):
    self.graphdef, self.state = nnx.split(model)
    self.vocab_size = model.config.vocab_size
    self.max_top_k, self.logits_chunk, self.length_bucket = min(max_top_k, self.vocab_size), logits_chunk, length_bucket
    self.max_rows, self.max_tokens = max_rows, max_tokens
    self._lock = threading.Lock()
    self._programs: dict[int, object] = {}  # top-k -> jitted scoring (jit keeps one executable per bucket)
    self.compiled_shapes: set[tuple[int, int, int]] = set()

  def _program(self, top_k: int):
    if top_k not in self._programs:
      def program(state, first_Bx1, rest_BxR, mask_BxR):
        out = score(self.graphdef, state, first_Bx1, jnp.ones_like(first_Bx1, bool), rest_BxR, mask_BxR,
                    temperature=1.0, logits_chunk=self.logits_chunk, top_k=top_k)
        return out.logp_BxR, out.top_logp_BxRxK, out.top_ids_BxRxK
      self._programs[top_k] = jax.jit(program)
    return self._programs[top_k]

  def check(self, rows, top_k) -> None:
    """InputError (HTTP 400) for a request this server does not take, naming the field."""
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) and r for r in rows):
      raise InputError("field 'prompt' must be a non-empty list of non-empty token-id lists")
    if len(rows) > self.max_rows:
      raise InputError(f"field 'prompt' has {len(rows)} prompts; this server takes at most {self.max_rows} per request")
    for i, row in enumerate(rows):
      if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in row):
        raise InputError(f"field 'prompt'[{i}] holds a token id outside 0..{self.vocab_size - 1}")
      if len(row) > self.max_tokens:
        raise InputError(f"field 'prompt'[{i}] has {len(row)} tokens; this server takes at most {self.max_tokens}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 0 <= top_k <= self.max_top_k:
      raise InputError(f"field 'prompt_logprobs' must be an integer in 0..{self.max_top_k} (this server's "
                       f"--max_top_k), got {top_k!r}")

  def __call__(self, rows: list[list[int]], top_k: int):
    """Per row: (logp [n-1], top_logp [n-1, K], top_ids [n-1, K], rank of the row's own token [n-1], 0 = not in
    the top-k)."""
    B = 1 << max(len(rows) - 1, 0).bit_length()
    R = max(self.length_bucket, -(-(max(len(r) for r in rows) - 1) // self.length_bucket) * self.length_bucket)
    first, rest, mask = np.zeros((B, 1), np.int32), np.zeros((B, R), np.int32), np.zeros((B, R), np.float32)
    for b, row in enumerate(rows):
      first[b, 0] = row[0]
      rest[b, :len(row) - 1] = row[1:]
      mask[b, :len(row) - 1] = 1.0
    with self._lock:
      self.compiled_shapes.add((B, R, top_k))
      logp, top_logp, top_ids = jax.device_get(self._program(max(top_k, 1))(self.state, first, rest, mask))
    out = []
    for b, row in enumerate(rows):
      n = len(row) - 1
      tl, ti = top_logp[b, :n, :top_k], top_ids[b, :n, :top_k]
      hit = ti == np.asarray(row[1:])[:, None]
      rank = np.where(hit.any(-1), hit.argmax(-1) + 1, 0) if top_k else np.zeros(n, np.int64)
      out.append((logp[b, :n], tl, ti, rank))
    return out


def build_app(scorer: Scorer, *, model_name: str, tokenizer=None, decoded_tokens: bool = False):
  """The Starlette app (module docstring). decoded_tokens: fill each entry's decoded_token as vLLM does (costs a
  tokenizer call per entry and ~10% more bytes; the client never reads it), else null."""
  from starlette.applications import Starlette
  from starlette.concurrency import run_in_threadpool
  from starlette.responses import JSONResponse
  from starlette.routing import Route

  def error(status: int, message: str, kind: str = "BadRequestError"):
    return JSONResponse({"object": "error", "message": message, "type": kind, "code": status}, status_code=status)

  async def completions(request):
    try:
      body = await request.json()
    except ValueError:
      return error(400, "the request body is not JSON")
    if not isinstance(body, dict):
      return error(400, "the request body must be a JSON object")
    if body.get("model", model_name) != model_name:
      return error(404, f"The model `{body.get('model')}` does not exist; this server serves `{model_name}`",
                   "NotFoundError")
    if body.get("stream"):
      return error(400, "prompt_logprobs is not available with stream=true")
    rows, top_k = body.get("prompt"), body.get("prompt_logprobs")
    try:
      scorer.check(rows, top_k)
    except InputError as e:
      return error(400, str(e))
    scored = await run_in_threadpool(scorer, rows, top_k)
    decode = tokenizer.convert_ids_to_tokens if decoded_tokens and tokenizer is not None else None
    return JSONResponse(protocol.completions_response(model_name, rows, *map(list, zip(*scored)), decode=decode))

  async def tokenize(request):
    if tokenizer is None:
      return error(501, "this server was started without a tokenizer (--tokenizer)", "NotImplementedError")
    body = await request.json()
    if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
      return error(400, "field 'prompt' must be a string")
    tokens = tokenizer.encode(body["prompt"], add_special_tokens=bool(body.get("add_special_tokens", True)))
    return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": scorer.max_tokens})

  async def models(request):
    return JSONResponse({"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "opd_jax",
                                                     "max_model_len": scorer.max_tokens}]})

  async def health(request):
    return JSONResponse({})

  return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                           Route("/tokenize", tokenize, methods=["POST"]),
                           Route("/v1/models", models, methods=["GET"]),
                           Route("/health", health, methods=["GET"])])


def serve(app, host: str = "127.0.0.1", port: int = 8000, announce: str = "") -> None:
  """Runs `app` under uvicorn until SIGTERM / SIGINT (graceful), or until the process that started it with
  processes.start is gone. port 0 picks a free port; the line "serving {announce} at http://HOST:PORT/v1" goes to
  stderr once the socket listens."""
  import socket

  import uvicorn

  from opd_jax.serving.processes import exit_with_parent
  sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind((host, port))
  except socket.gaierror as e:  # the address, not the port
    sock.close()
    raise InputError(f"cannot listen on --host={host} ({e.strerror}); give an address of this machine, e.g. "
                     "127.0.0.1") from None
  except OSError as e:
    sock.close()
    raise InputError(f"cannot listen on {host}:{port} ({e.strerror}); choose another --port") from None
  sock.listen(128)
  bound = sock.getsockname()[1]
  print(f"serving {announce} at http://{host}:{bound}/v1", file=sys.stderr, flush=True)
  config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=30, lifespan="off")
  exit_with_parent()
  uvicorn.Server(config).run(sockets=[sock])
