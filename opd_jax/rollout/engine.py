"""Paged rollout engine: continuous batching over a paged KV cache, with per-request determinism.

Legend: R engine rows (sequences decoded at once), Q requests, M pages a row's page table holds, Z tokens per page,
C prompt tokens per prefill call, D decode steps per host round trip, N max new tokens.

`PagedEngine(graphdef, sampling, engine_config).generate(state, prompts, keys)` returns the static sampler's
SampleOutput for the Q requests, in request order, and the run's statistics. The host keeps a queue of requests, a
free list of pages and R rows. Each round it:
  1. admits waiting requests into free rows while the pool has pages for their prompt and one round of decoding,
     and prefills them (C prompt tokens per call, or one call of the longest prompt rounded up to a page when it
     fits one; rows bucketed to powers of two, so shapes come from a fixed set);
     the last prompt position's logits give the request's first token. A group (samples_per_prompt) is admitted
     whole and prefilled once; its rows share the prompt's full pages (rollout.scheduler);
  2. gives every running row the pages its next D tokens need; when the pool runs dry, the newest row is
     preempted (its pages freed, the request queued again at the front, its tokens discarded: with per-request
     keys its rerun draws the same tokens);
  3. runs D decode steps over the running rows in one jitted program (packed into R, R / 2 or R / 4 rows, at least
     4; finished and empty rows write to the trash page);
  4. retires rows that ended (EOS or their cap) and frees their pages.

Per-request determinism: token t of request q is drawn under fold_in(keys[q], t) (sampler.choose_tokens_per_row),
so its tokens do not depend on which requests share the batch, and they equal the static sampler's called with
the same per-row keys (float summation order aside: attention reads M * Z slots here, the static cache its own
width; tests/test_engine.py holds both to the same tokens).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from opd_jax.errors import InputError
from opd_jax.models import layer_stack
from opd_jax.rollout.kv_cache import check_kv_dtype
from opd_jax.rollout.paged_cache import PagedKVCache, pool_bytes
from opd_jax.rollout.scheduler import Outputs, Scheduler
from opd_jax.rollout.precision import dequantized
from opd_jax.rollout.sampler import SampleOutput, SamplingConfig, choose_tokens_per_row

ENGINES = ("static", "paged")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  page_size: int = 16  # Z: tokens per KV page
  num_pages: int = 0  # pages in the pool, the trash page included; 0 = room for every row at its longest
  max_rows: int = 16  # R: sequences decoded at once
  decode_steps: int = 8  # D: decode steps per host round trip (one compiled loop)
  prefill_chunk: int = 64  # C: prompt tokens per prefill call; a multiple of page_size
  max_prompt_tokens: int = 256  # longest prompt a request may have (sets the page table's width)
  # Share of the pool's pages that must stay free after an admission, room for the running rows to grow; 0 admits
  # while a prompt and one round fit (when the pool then runs dry, the newest row is preempted and recomputed).
  admit_headroom: float = 0.0

  def __post_init__(self):
    for name in ("page_size", "max_rows", "decode_steps", "prefill_chunk", "max_prompt_tokens"):
      if getattr(self, name) < 1:
        raise InputError(f"engine {name}={getattr(self, name)} must be >= 1")
    if not 0.0 <= self.admit_headroom < 1.0:
      raise InputError(f"engine admit_headroom={self.admit_headroom} must be in [0, 1): the share of the pool's "
                       "pages kept free after an admission")
    if self.prefill_chunk % self.page_size:
      raise InputError(f"engine page_size={self.page_size} does not divide prefill_chunk={self.prefill_chunk}; "
                       "make prefill_chunk a multiple of page_size")

  def pages_per_row(self, max_new_tokens: int) -> int:
    """M: pages the longest request holds (its prompt, its new tokens, and one round of decoding past its cap)."""
    return -(-(self.max_prompt_tokens + max_new_tokens + self.decode_steps) // self.page_size)


def _bucket(n: int, limit: int) -> int:
  """The smallest power of two >= n (at most `limit`): prefill row counts and page-table widths come from a
  fixed set, so the programs compile a bounded number of times."""
  size = 1
  while size < n:
    size *= 2
  return min(size, limit)


def _width(n: int, limit: int) -> int:
  """The page-table width (pages) a decode round over rows holding up to n pages reads: n rounded up to a power
  of two up to 8 pages, then to steps of a quarter of the power of two below (8, 10, 12, 14, 16, 20, 24, ...),
  at most `limit`. Attention reads width * page_size slots per row; power-of-two widths made long rows read up to
  twice the slots they hold, which cost equal-length decoding most of its gap to the static sampler,
  while short widths cost the same as the weights' reads."""
  if n <= 8:
    return _bucket(n, limit)
  quarter = _bucket(n, 1 << 30) // 8  # n in (4 q, 8 q]: steps of q
  return min(-(-n // quarter) * quarter, limit)


def _decode_rows(n: int, limit: int) -> int:
  """Rows a decode round over n live rows computes: n rounded up to a power of two, at least a quarter of R and at
  least 4 (at most three programs per width), so the long tail's last few rows no longer pay for a full batch;
  below 4 rows a program saves too little to be worth its compile."""
  return min(max(_bucket(n, limit), -(-limit // 4), 4), limit)


class PagedEngine:
  """Continuous batching over a paged KV cache for one model graph; call `generate` with any parameter state.
  With sampling.samples_per_prompt = n, requests come in groups of n consecutive ones sharing a prompt: it is
  prefilled once and the group's rows share its full pages (rollout.scheduler)."""

  def __init__(self, graphdef, sampling: SamplingConfig, engine: EngineConfig = EngineConfig()):
    self.graphdef, self.sampling, self.engine = graphdef, sampling, engine
    self.kv_dtype = check_kv_dtype(sampling.kv_dtype)
    self.pages_per_row = engine.pages_per_row(sampling.max_new_tokens)
    self.traces = collections.Counter()  # compiled programs, by name (a trace is a compile under jit)
    self._prefill = jax.jit(self._prefill_fn, donate_argnums=(1,))
    self._first = jax.jit(self._first_fn)
    self._copy = jax.jit(self._copy_fn, donate_argnums=(0,))
    self._decode = jax.jit(self._decode_fn, donate_argnums=(1,))
    self._dense = jax.jit(lambda state: layer_stack.unstack(dequantized(state)))

  # ---- device programs ----

  def _model(self, state):
    return nnx.merge(self.graphdef, state)

  def _prefill_fn(self, state, pools, tokens_BxC, valid_BxC, page_table_BxM, lengths_B):
    """C prompt tokens per row into their pages; the logits after each row's last real token."""
    self.traces["prefill"] += 1
    model = self._model(state)
    cache = PagedKVCache(*pools, page_table_BxM, lengths_B, jnp.zeros(valid_BxC.shape, bool), self.kv_dtype)
    positions_BxC = lengths_B[:, None] + jnp.arange(tokens_BxC.shape[1], dtype=jnp.int32)[None]
    hidden_BxCxD, cache = model.hidden_states(tokens_BxC, positions_BxC, valid_BxC, cache=cache)
    last_index_B = jnp.maximum(jnp.sum(valid_BxC, axis=1) - 1, 0)
    hidden_Bx1xD = jnp.take_along_axis(hidden_BxCxD, last_index_B[:, None, None], axis=1)
    return cache.pools(), model.logits(hidden_Bx1xD)[:, 0]

  def _first_fn(self, logits_BxV, source_R, keys_R):
    """Token 0 of each of R rows, drawn from the prefilled row `source_R` under fold_in(its key, 0)."""
    self.traces["first"] += 1
    logits_RxV = logits_BxV[source_R]
    token_R, logp_R = choose_tokens_per_row(logits_RxV, keys_R, 0, self.sampling)
    return token_R, logp_R, self._top(logits_RxV)

  def _copy_fn(self, pools, source_R, dest_R):
    """Page dest <- page source in every layer's pools (a group's partial prompt page; trash to trash pads)."""
    self.traces["copy"] += 1
    return tuple(None if pool is None else pool.at[:, dest_R].set(pool[:, source_R]) for pool in pools)

  def _top(self, logits_BxV):
    """The K most likely tokens' log-probs (temperature 1, unfiltered) and ids, as the static sampler returns
    them; K = 0: none."""
    K = min(self.sampling.logits_top_k, logits_BxV.shape[-1])
    if not K:
      return None
    return jax.lax.top_k(jax.nn.log_softmax(logits_BxV, axis=-1), K)

  def _decode_fn(self, state, pools, last_R, page_table_RxM, lengths_R, generated_R, cap_R, live_R, keys_R):
    """D decode steps over every row: feed the last token, draw the next under fold_in(key, its index); a row
    stops at EOS or its cap, and from then on writes to the trash page."""
    self.traces["decode"] += 1
    model = self._model(state)
    eos_E = jnp.asarray(self.sampling.eos_ids or (-1,), jnp.int32)
    D, R = self.engine.decode_steps, last_R.shape[0]
    cache = PagedKVCache(*pools, page_table_RxM, lengths_R, jnp.zeros((R, 1), bool), self.kv_dtype)
    K = min(self.sampling.logits_top_k, model.config.vocab_size)

    def step(d, carry):
      cache, last_R, generated_R, live_R, out = carry
      logits_Rx1xV, cache = model(last_R[:, None], cache.lengths_B[:, None], live_R[:, None], cache=cache)
      token_R, logp_R = choose_tokens_per_row(logits_Rx1xV[:, 0], keys_R, generated_R, self.sampling)
      token_R = jnp.where(live_R, token_R, self.sampling.pad_id)
      out = {**out, "tokens": out["tokens"].at[:, d].set(token_R),
             "logps": out["logps"].at[:, d].set(jnp.where(live_R, logp_R, 0.0)),
             "mask": out["mask"].at[:, d].set(live_R)}
      if K:
        vals_RxK, ids_RxK = self._top(logits_Rx1xV[:, 0])
        out.update(top_vals=out["top_vals"].at[:, d].set(vals_RxK), top_ids=out["top_ids"].at[:, d].set(ids_RxK))
      generated_R = generated_R + live_R
      ended_R = jnp.isin(token_R, eos_E) | (generated_R >= cap_R)
      return cache, jnp.where(live_R, token_R, last_R), generated_R, live_R & ~ended_R, out

    out = {"tokens": jnp.full((R, D), self.sampling.pad_id, jnp.int32), "logps": jnp.zeros((R, D), jnp.float32),
           "mask": jnp.zeros((R, D), bool)}
    if K:
      out.update(top_vals=jnp.zeros((R, D, K), jnp.float32), top_ids=jnp.zeros((R, D, K), jnp.int32))
    cache, last_R, generated_R, live_R, out = jax.lax.fori_loop(0, D, step, (cache, last_R, generated_R, live_R, out))
    return cache.pools(), out, cache.lengths_B, live_R

  # ---- host side ----

  def _init_pools(self, state):
    mc = self._model(state).config
    engine = self.engine
    num_pages = engine.num_pages or 1 + engine.max_rows * self.pages_per_row
    need = self.pages_per_row  # one request at its longest, or a lone row could be preempted forever
    if num_pages - 1 < need:
      raise InputError(f"engine num_pages={num_pages} is too small for one request: a {engine.max_prompt_tokens}-"
                       f"token prompt, {self.sampling.max_new_tokens} new tokens and a round of "
                       f"{engine.decode_steps} decode steps need {need} pages of {engine.page_size} tokens, plus "
                       "the trash page")
    return PagedKVCache.init(num_pages=num_pages, page_size=engine.page_size, num_layers=mc.num_hidden_layers,
                             num_kv_heads=mc.num_key_value_heads, head_dim=mc.head_dim,
                             compute_dtype=self._model(state).dtype, kv_dtype=self.kv_dtype)

  def shapes(self) -> tuple[list[int], list[int]]:
    """(prefill row buckets, decode page-table widths): every shape the programs are called with."""
    rows = sorted({_bucket(n, self.engine.max_rows) for n in range(1, self.engine.max_rows + 1)})
    return rows, sorted({_width(n, self.pages_per_row) for n in range(1, self.pages_per_row + 1)})

  def decode_rows(self) -> list[int]:
    """Every row count a decode round is called with (`_decode_rows`)."""
    R = self.engine.max_rows
    return sorted({_decode_rows(n, R) for n in range(1, R + 1)})

  def prefill_shapes(self) -> list[tuple[int, int]]:
    """(tokens per row, page-table width) of every prefill call (`_prefill_shape`)."""
    Z, C = self.engine.page_size, self.engine.prefill_chunk
    return sorted({self._prefill_shape(n) for n in range(Z, C + 1, Z)} | {(C, self.pages_per_row)})

  def _prefill_shape(self, longest: int) -> tuple[int, int]:
    """(tokens per row, page-table width) of a prefill of prompts whose longest has `longest` tokens. A prompt of
    at most C tokens takes one call of `longest` rounded up to a page and reads its pages only (the table's width
    rounded as decode's, `_width`): SmolLM2's chat prompts (35-57 tokens) were prefilled as 64 tokens each,
    attending over a 33-page table that held at most four pages of them."""
    Z, C, M = self.engine.page_size, self.engine.prefill_chunk, self.pages_per_row
    if longest > C:
      return C, M
    pages = -(-longest // Z)
    return pages * Z, _width(pages, M)

  def warmup(self, state) -> int:
    """Compile every program shape `generate` can call, running each once on rows that write only to the trash
    page; returns the number of compiled programs. After it, no mix of requests compiles anything."""
    R = self.engine.max_rows
    state = self._dense(state) if self.sampling.weight_layout == "dense_layers" else state
    pools = self._init_pools(state).pools()
    keys_R, zeros_R = jax.random.split(jax.random.key(0), R), jnp.zeros(R, jnp.int32)
    rows, widths = self.shapes()
    for B in rows:
      for C, width in self.prefill_shapes():
        pools, logits_BxV = self._prefill(state, pools, jnp.zeros((B, C), jnp.int32), jnp.zeros((B, C), bool),
                                          jnp.zeros((B, width), jnp.int32), jnp.zeros(B, jnp.int32))
      self._first(logits_BxV, zeros_R, keys_R)
    pools = self._copy(pools, zeros_R, zeros_R)
    for n in self.decode_rows():
      zeros_n = jnp.zeros(n, jnp.int32)
      for width in widths:
        pools = self._decode(state, pools, zeros_n, jnp.zeros((n, width), jnp.int32), zeros_n, zeros_n,
                             jnp.ones(n, jnp.int32), jnp.zeros(n, bool), keys_R[:n])[0]
    jax.block_until_ready(pools)
    return sum(self.traces.values())

  def generate(self, state, prompts: list[list[int]], keys=None, *, version: int = 0,
               weights: Callable[[], tuple[int, Any]] | None = None) -> tuple[SampleOutput, dict]:
    """SampleOutput [Q, N] for the prompts (token-id lists, no padding), in order; keys: [Q] keys (one per request;
    default fold_in(key(0), q)). Returns (output, stats).

    In-flight weight updates: `weights()` -> (version, state) is asked before every round; when it has a newer
    version than the one drawing, that version draws every token from then on, running rows included (their KV
    cache stays as the older weights computed it, as in PipelineRL). The output's version_BxN holds each token's
    version (`version` is the first state's)."""
    engine, sampling, N = self.engine, self.sampling, self.sampling.max_new_tokens
    for q, prompt in enumerate(prompts):
      if not 1 <= len(prompt) <= engine.max_prompt_tokens:
        raise InputError(f"request {q} has {len(prompt)} prompt tokens; the engine takes 1..{engine.max_prompt_tokens}"
                         " (engine max_prompt_tokens)")
    if keys is None:
      keys = jax.vmap(lambda q: jax.random.fold_in(jax.random.key(0), q))(jnp.arange(len(prompts)))
    prepare = lambda state: self._dense(state) if sampling.weight_layout == "dense_layers" else state
    state = prepare(state)
    cache = self._init_pools(state)
    pools = cache.pools()
    plan = Scheduler(prompts, sampling.samples_per_prompt, rows=engine.max_rows, page_size=engine.page_size,
                     decode_steps=engine.decode_steps, num_pages=cache.num_pages,
                     headroom=int(engine.admit_headroom * (cache.num_pages - 1)))
    outputs = Outputs(len(prompts), N, min(sampling.logits_top_k, self._model(state).config.vocab_size),
                      sampling.pad_id, version)
    stats = collections.Counter()
    peak_pages = peak_rows = 0
    while plan.queue or plan.live():
      newest, new_state = weights() if weights is not None else (version, None)
      if newest > outputs.version:
        outputs.version, state = newest, prepare(new_state)
        stats["weight_updates"] += 1
      admitted = plan.admit()
      if admitted:
        pools = self._prefill_units(state, pools, plan, admitted, keys, outputs, stats)
      plan.grow(outputs, stats)
      live = plan.live()
      peak_pages, peak_rows = max(peak_pages, plan.pool.in_use), max(peak_rows, len(live))
      if plan.queue:  # requests wait: the rows running now are what the engine holds at once when full
        stats.update(saturated_rounds=1, saturated_row_rounds=len(live))
      if live:
        pools = self._decode_round(state, pools, plan, live, keys, outputs, stats)
    if stats["saturated_rounds"]:
      stats["mean_rows_saturated"] = stats["saturated_row_rounds"] / stats["saturated_rounds"]
    stats.update(useful_tokens=int(outputs.mask.sum()), rounds=plan.round, peak_rows=peak_rows,
                 peak_pages=peak_pages, pool_pages=cache.num_pages, page_size=engine.page_size,
                 peak_kv_bytes=peak_pages * pool_bytes(cache) // cache.num_pages, pool_bytes=pool_bytes(cache),
                 compiles=sum(self.traces.values()))
    top = () if outputs.top is None else tuple(map(jnp.asarray, outputs.top))
    return SampleOutput(jnp.asarray(outputs.tokens), jnp.asarray(outputs.mask), jnp.asarray(outputs.logps),
                        *(top or (None, None)), version_BxN=jnp.asarray(outputs.versions)), dict(stats)

  def _decode_round(self, state, pools, plan: Scheduler, live: list[int], keys, outputs: Outputs, stats):
    """D decode steps over the live rows, packed into the first of `_decode_rows` slots; their tokens into the
    outputs; rows that ended retire."""
    N, M = self.sampling.max_new_tokens, self.pages_per_row
    R = _decode_rows(len(live), self.engine.max_rows)
    # Attention reads a page table's width of slots: the live rows' longest, rounded up (`_width`).
    table = np.zeros((R, _width(max(len(plan.rows[r].pages) for r in live), M)), np.int32)
    lengths, generated, request = (np.zeros(R, np.int32) for _ in range(3))
    last, alive = np.full(R, self.sampling.pad_id, np.int32), np.zeros(R, bool)
    for j, r in enumerate(live):
      row = plan.rows[r]
      table[j, :len(row.pages)] = row.pages
      lengths[j], generated[j], last[j] = row.length, row.generated, row.last_token
      alive[j], request[j] = True, row.request
    pools, out, new_lengths, still = self._decode(
        state, pools, jnp.asarray(last), jnp.asarray(table), jnp.asarray(lengths), jnp.asarray(generated),
        jnp.full(R, N, jnp.int32), jnp.asarray(alive), keys[jnp.asarray(request)])
    out = {k: np.asarray(v) for k, v in out.items()}
    new_lengths, still = np.asarray(new_lengths), np.asarray(still)
    stats["decode_calls"] += 1
    stats["decode_row_steps"] += R * self.engine.decode_steps
    for j, r in enumerate(live):
      row, n = plan.rows[r], int(out["mask"][j].sum())
      top = (out["top_vals"][j, :n], out["top_ids"][j, :n]) if outputs.top is not None else None
      outputs.put(row.request, row.generated, out["tokens"][j, :n], out["logps"][j, :n], top)
      row.generated += n
      row.length = int(new_lengths[j])
      row.last_token = int(out["tokens"][j, n - 1]) if n else row.last_token
      if not still[j]:
        plan.release(r)
    return pools

  def _prefill_units(self, state, pools, plan: Scheduler, admitted, keys, outputs: Outputs, stats):
    """Prefill each admitted unit's first row, C prompt tokens per call (units bucketed to powers of two); copy the
    partial prompt page to the unit's other rows; draw every row's first token from its unit's logits."""
    R = self.engine.max_rows
    B = _bucket(len(admitted), R)
    for start in range(0, len(admitted), B):
      units = admitted[start:start + B]
      prompts = [plan.prompts[plan.rows[unit.rows[0]].request] for unit in units]
      C, M = self._prefill_shape(max(map(len, prompts)))  # C tokens per call, reading M pages
      table = np.zeros((B, M), np.int32)
      for i, unit in enumerate(units):
        pages = plan.rows[unit.rows[0]].pages[:M]  # the prompt's pages are its first ones
        table[i, :len(pages)] = pages
      for offset in range(0, max(map(len, prompts)), C):
        chunk, valid, lengths = np.zeros((B, C), np.int32), np.zeros((B, C), bool), np.zeros(B, np.int32)
        for i, prompt in enumerate(prompts):
          piece = prompt[offset:offset + C]
          chunk[i, :len(piece)], valid[i, :len(piece)], lengths[i] = piece, True, min(offset, len(prompt))
        pools, logits_BxV = self._prefill(state, pools, jnp.asarray(chunk), jnp.asarray(valid), jnp.asarray(table),
                                          jnp.asarray(lengths))
        stats["prefill_calls"] += 1
        ending = [i for i, prompt in enumerate(prompts) if offset < len(prompt) <= offset + C]
        if ending:
          self._first_tokens(logits_BxV, [(i, units[i]) for i in ending], plan, keys, outputs)
      copies = [pair for unit in units for pair in unit.copies]
      if copies:
        source, dest = np.zeros(R, np.int32), np.zeros(R, np.int32)
        source[:len(copies)], dest[:len(copies)] = zip(*copies)
        pools = self._copy(pools, jnp.asarray(source), jnp.asarray(dest))
    return pools

  def _first_tokens(self, logits_BxV, ending, plan: Scheduler, keys, outputs: Outputs) -> None:
    """Every row of the units whose prompt just ended: token 0 from its unit's logits, and its length; a row whose
    first token ends it (EOS, or a cap of one) retires."""
    R = self.engine.max_rows
    rows = [(i, r) for i, unit in ending for r in unit.rows]
    source, request = np.zeros(R, np.int32), np.zeros(R, np.int32)
    for j, (i, r) in enumerate(rows):
      source[j], request[j] = i, plan.rows[r].request
    token, logp, top = self._first(logits_BxV, jnp.asarray(source), keys[jnp.asarray(request)])
    token, logp = np.asarray(token), np.asarray(logp)
    top = None if top is None else (np.asarray(top[0]), np.asarray(top[1]))
    for j, (_, r) in enumerate(rows):
      row = plan.rows[r]
      row.length, row.generated, row.last_token = len(plan.prompts[row.request]), 1, int(token[j])
      outputs.put(row.request, 0, token[j:j + 1], logp[j:j + 1], None if top is None else (top[0][j:j + 1],
                                                                                            top[1][j:j + 1]))
      if int(token[j]) in self.sampling.eos_ids or self.sampling.max_new_tokens == 1:
        plan.release(r)


def engine_config(rollout, max_prompt_tokens: int, batch_rows: int) -> EngineConfig:
  """The paged engine's settings from a RolloutConfig: rows default to the batch's (per device), pages to room for
  every row at its longest."""
  return EngineConfig(page_size=rollout.page_size, num_pages=rollout.kv_pages,
                      max_rows=rollout.engine_rows or batch_rows, decode_steps=rollout.decode_steps,
                      prefill_chunk=rollout.page_size * max(1, -(-64 // rollout.page_size)),
                      max_prompt_tokens=max_prompt_tokens)


def check_engine(name: str) -> str:
  if name not in ENGINES:
    raise InputError(f"rollout engine {name!r} does not exist; choose one of {', '.join(ENGINES)}")
  return name
