"""The logprob API subset a served teacher speaks: vLLM's OpenAI-compatible completions with prompt log-probs.

Legend: B rows (responses), P prompt length, R response length, K top-k.

What crosses the wire per row and position, and nothing else (never [V] log-probs):

request   POST {endpoint}/completions   (endpoint ends in /v1, as vLLM's and SGLang's OpenAI servers do)
          {"model": NAME, "prompt": [[id, ...], ...], "max_tokens": 1, "temperature": 1.0,
           "prompt_logprobs": K, "echo": false}
          One prompt per row: the row's real prompt tokens followed by its response tokens (no padding).
          max_tokens = 1 because vLLM generates at least one token; the generated token is ignored.
response  {"choices": [{"index": i, "prompt_logprobs": [null, {"<id>": {"logprob": x, "rank": r,
           "decoded_token": s}, ...}, ...], ...}, ...]}
          prompt_logprobs[j] (j >= 1) holds log p(token_j | tokens_<j) for the row's own token_j plus the K most
          likely tokens at that position (so K or K + 1 entries; vLLM's Logprob objects serialized by pydantic,
          token ids as JSON object keys); entry 0 is null (nothing predicts the first token).
tokenize  POST {server root}/tokenize {"model": NAME, "prompt": TEXT, "add_special_tokens": false}
          -> {"tokens": [id, ...], ...}: how the client checks that the server's tokenizer is the student's.
models    GET {endpoint}/models -> {"data": [{"id": NAME, ...}, ...]}

vLLM notes: it caps K at its --max-logprobs (default 20: start vLLM with a larger value for K > 20), and its
prompt log-probs are of the raw logits (temperature 1; `logprobs_mode` raw_logprobs), which is why a served
teacher scores at temperature 1 only. SGLang's OpenAI server takes the same completions request; its native
/generate API (return_logprob, logprob_start_len, top_logprobs_num) is not used here.

`parse_completions` turns a response into per-row arrays and refuses a malformed one with one `TeacherResponseError`
line naming the field (wrong length, a token that is not the row's, non-finite values, ids outside the vocabulary,
a top-k that is not sorted or has fewer than K entries).
"""

from __future__ import annotations

import numpy as np

from opd_jax.errors import InputError


class TeacherResponseError(InputError):
  """A served teacher's response that does not fit the request: refused, never retried into the batch."""


def completions_request(model: str, rows: list[list[int]], top_k: int) -> dict:
  """The request body scoring `rows` (each the full token list of one row) with `top_k` log-probs per position."""
  return {"model": model, "prompt": [list(map(int, row)) for row in rows], "max_tokens": 1, "temperature": 1.0,
          "prompt_logprobs": int(top_k), "echo": False}


def row_tokens(prompt_P: np.ndarray, valid_P: np.ndarray, response_R: np.ndarray, mask_R: np.ndarray) -> list[int]:
  """One row's real prompt tokens then its response tokens up to the end of its mask (what the server scores)."""
  prompt = [int(t) for t, v in zip(prompt_P, valid_P) if v]
  length = int(np.count_nonzero(mask_R))
  return prompt + [int(t) for t in response_R[:length]]


def parse_completions(body, rows: list[list[int]], top_k: int, vocab_size: int, where: str):
  """Per row: (logp of each token 1..n-1 [n-1], top-k log-probs [n-1, K], top-k ids [n-1, K]) as float32 / int32
  numpy arrays, in `rows`' order. `where` names the request in errors (e.g. the endpoint)."""
  def fail(field: str, problem: str):
    raise TeacherResponseError(f"served teacher at {where}: response field {field} {problem}; the server does not "
                               "speak the vLLM completions prompt_logprobs format this client reads "
                               "(opd_jax/serving/protocol.py)")

  if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
    fail("'choices'", "is missing or not a list")
  choices = body["choices"]
  if len(choices) != len(rows):
    fail("'choices'", f"has {len(choices)} entries for {len(rows)} prompts")
  by_index = {}
  for position, choice in enumerate(choices):
    index = choice.get("index", position) if isinstance(choice, dict) else None
    if not isinstance(index, int) or not 0 <= index < len(rows) or index in by_index:
      fail(f"choices[{position}].index", f"is {index!r}: not a unique prompt index below {len(rows)}")
    by_index[index] = choice
  out = []
  for i, row in enumerate(rows):
    entries = by_index[i].get("prompt_logprobs")
    field = f"choices[{i}].prompt_logprobs"
    if not isinstance(entries, list) or len(entries) != len(row):
      fail(field, f"has {len(entries) if isinstance(entries, list) else type(entries).__name__} entries for a "
                  f"prompt of {len(row)} tokens")
    n = len(row) - 1
    tokens, values, counts = [], [], []
    for j in range(1, len(row)):
      entry = entries[j]
      if not isinstance(entry, dict):
        fail(f"{field}[{j}]", f"is {type(entry).__name__}, not an object of token id -> logprob")
      try:
        tokens.extend(int(key) for key in entry)
        values.extend(float(v["logprob"] if isinstance(v, dict) else v) for v in entry.values())
      except (TypeError, ValueError, KeyError):
        fail(f"{field}[{j}]", "holds an entry that is not a token id with a numeric 'logprob'")
      counts.append(len(entry))
    # Checked and ranked for the whole row at once (numpy): every entry's position, token and log-prob.
    token_E, value_E = np.asarray(tokens, np.int64), np.asarray(values, np.float64)
    position_E = np.repeat(np.arange(n), counts)
    bad = (token_E < 0) | (token_E >= vocab_size)
    if bad.any():
      e = int(bad.argmax())
      fail(f"{field}[{position_E[e] + 1}]", f"names token id {token_E[e]}, outside the student's vocabulary of "
                                            f"{vocab_size}")
    bad = ~np.isfinite(value_E) | (value_E > 1e-4)
    if bad.any():
      e = int(bad.argmax())
      fail(f"{field}[{position_E[e] + 1}][{str(token_E[e])!r}].logprob", f"is {value_E[e]}: not a finite "
                                                                           "log-probability")
    own_E = token_E == np.asarray(row[1:], np.int64)[position_E]
    found = np.zeros(n, bool)
    found[position_E[own_E]] = True
    if not found.all():
      j = int(found.argmin()) + 1
      fail(f"{field}[{j}]", f"has no entry for the prompt's own token {row[j]}")
    logp = np.zeros(n, np.float32)
    logp[position_E[own_E]] = value_E[own_E]
    top_logp, top_ids = np.zeros((n, top_k), np.float32), np.zeros((n, top_k), np.int32)
    if top_k and n:
      counts = np.asarray(counts)
      if (counts < top_k).any():
        j = int((counts < top_k).argmax()) + 1
        fail(f"{field}[{j}]", f"has {counts[j - 1]} entries, fewer than the {top_k} top log-probs asked for")
      order = np.lexsort((-value_E, position_E))  # by position, then most likely first (stable on ties)
      rank_E = np.arange(len(order)) - np.repeat(np.cumsum(counts) - counts, counts)
      keep = rank_E < top_k
      top_ids = token_E[order][keep].reshape(n, top_k).astype(np.int32)
      top_logp = value_E[order][keep].reshape(n, top_k).astype(np.float32)
    out.append((logp, top_logp, top_ids))
  return out


def completions_response(model: str, rows: list[list[int]], logp: list[np.ndarray], top_logp: list[np.ndarray],
                         top_ids: list[np.ndarray], rank: list[np.ndarray], decode=None) -> dict:
  """The response our server returns for `rows`: vLLM's fields; `decode(id)` -> text fills decoded_token (None:
  null, as the client never reads it)."""
  name = (lambda t: None) if decode is None else decode
  choices = []
  for i, row in enumerate(rows):
    entries = [None]
    ids_NxK, values_NxK, own_rank = top_ids[i].tolist(), top_logp[i].tolist(), rank[i].tolist()
    for j, (ids, values, own_value) in enumerate(zip(ids_NxK, values_NxK, logp[i].tolist()), start=1):
      entry = {str(t): {"logprob": v, "rank": r, "decoded_token": name(t)}
               for r, (t, v) in enumerate(zip(ids, values), start=1)}
      own = str(row[j])
      if own not in entry:
        entry[own] = {"logprob": own_value, "rank": own_rank[j - 1] or None, "decoded_token": name(row[j])}
      entries.append(entry)
    choices.append({"index": i, "text": "", "logprobs": None, "finish_reason": "length", "prompt_logprobs": entries,
                    "prompt_token_ids": [int(t) for t in row]})
  tokens = sum(len(r) for r in rows)
  return {"id": "cmpl-opd-jax", "object": "text_completion", "model": model, "choices": choices,
          "usage": {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens}}
