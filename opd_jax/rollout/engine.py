"""Paged rollout engine: continuous batching over a paged KV cache, with per-request determinism.

Legend: R engine rows (sequences decoded at once), Q requests, M pages a row's page table holds, Z tokens per page,
C prompt tokens per prefill call, D decode steps per host round trip, N max new tokens.

`PagedEngine(graphdef, sampling, engine_config).generate(state, prompts, keys)` returns the static sampler's
SampleOutput for the Q requests, in request order, and the run's statistics. The host keeps a queue of requests, a
free list of pages and R rows. Each round it:
  1. admits waiting requests into free rows while the pool has pages for their prompt and one round of decoding,
     and prefills them (C prompt tokens per call, rows bucketed to powers of two, so shapes come from a fixed set);
     the last prompt position's logits give the request's first token;
  2. gives every running row the pages its next D tokens need; when the pool runs dry, the newest row is
     preempted (its pages freed, the request queued again at the front, its tokens discarded: with per-request
     keys its rerun draws the same tokens);
  3. runs D decode steps over all R rows in one jitted program (finished and empty rows write to the trash page);
  4. retires rows that ended (EOS or their cap) and frees their pages.

Per-request determinism: token t of request q is drawn under fold_in(keys[q], t) (sampler.choose_tokens_per_row),
so its tokens do not depend on which requests share the batch, and they equal the static sampler's called with
the same per-row keys (float summation order aside: attention reads M * Z slots here, the static cache its own
width; tests/test_engine.py holds both to the same tokens).
"""

from __future__ import annotations

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from opd_jax.errors import InputError
from opd_jax.models import layer_stack
from opd_jax.rollout.kv_cache import check_kv_dtype
from opd_jax.rollout.paged_cache import PagedKVCache, TRASH_PAGE, pool_bytes
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

  def __post_init__(self):
    for name in ("page_size", "max_rows", "decode_steps", "prefill_chunk", "max_prompt_tokens"):
      if getattr(self, name) < 1:
        raise InputError(f"engine {name}={getattr(self, name)} must be >= 1")
    if self.prefill_chunk % self.page_size:
      raise InputError(f"engine page_size={self.page_size} does not divide prefill_chunk={self.prefill_chunk}; "
                       "make prefill_chunk a multiple of page_size")

  def pages_per_row(self, max_new_tokens: int) -> int:
    """M: pages the longest request holds (its prompt, its new tokens, and one round of decoding past its cap)."""
    return -(-(self.max_prompt_tokens + max_new_tokens + self.decode_steps) // self.page_size)


@dataclasses.dataclass
class _Row:
  request: int
  pages: list[int]
  length: int  # tokens cached
  generated: int  # tokens drawn (the last one not cached yet)
  last_token: int
  admitted_round: int


def _bucket(n: int, limit: int) -> int:
  """The smallest power of two >= n (at most `limit`): prefill row counts and page-table widths come from a
  fixed set, so the programs compile a bounded number of times."""
  size = 1
  while size < n:
    size *= 2
  return min(size, limit)


class PagedEngine:
  """Continuous batching over a paged KV cache for one model graph; call `generate` with any parameter state."""

  def __init__(self, graphdef, sampling: SamplingConfig, engine: EngineConfig = EngineConfig()):
    if sampling.samples_per_prompt != 1:
      raise InputError("the paged engine does not share prompt pages across a group yet (samples_per_prompt > 1); "
                       "pass each row's prompt, or use engine=static")
    self.graphdef, self.sampling, self.engine = graphdef, sampling, engine
    self.kv_dtype = check_kv_dtype(sampling.kv_dtype)
    self.pages_per_row = engine.pages_per_row(sampling.max_new_tokens)
    self.traces = collections.Counter()  # compiled programs, by name (a trace is a compile under jit)
    self._prefill = jax.jit(self._prefill_fn, donate_argnums=(1,))
    self._decode = jax.jit(self._decode_fn, donate_argnums=(1,))
    self._dense = jax.jit(lambda state: layer_stack.unstack(dequantized(state)))

  # ---- device programs ----

  def _model(self, state):
    return nnx.merge(self.graphdef, state)

  def _prefill_fn(self, state, pools, tokens_BxC, valid_BxC, page_table_BxM, lengths_B, keys_B, last_B):
    """C prompt tokens per row into their pages; for rows whose prompt ends in this chunk (last_B), the first
    new token and its log-prob (token index 0)."""
    self.traces["prefill"] += 1
    model = self._model(state)
    cache = PagedKVCache(*pools, page_table_BxM, lengths_B, jnp.zeros(valid_BxC.shape, bool), self.kv_dtype)
    positions_BxC = lengths_B[:, None] + jnp.arange(tokens_BxC.shape[1], dtype=jnp.int32)[None]
    hidden_BxCxD, cache = model.hidden_states(tokens_BxC, positions_BxC, valid_BxC, cache=cache)
    last_index_B = jnp.maximum(jnp.sum(valid_BxC, axis=1) - 1, 0)
    hidden_Bx1xD = jnp.take_along_axis(hidden_BxCxD, last_index_B[:, None, None], axis=1)
    logits_BxV = model.logits(hidden_Bx1xD)[:, 0]
    token_B, logp_B = choose_tokens_per_row(logits_BxV, keys_B, 0, self.sampling)
    return (cache.pools(), jnp.where(last_B, token_B, self.sampling.pad_id), jnp.where(last_B, logp_B, 0.0),
            self._top(logits_BxV))

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

    K = min(self.sampling.logits_top_k, self._model(state).config.vocab_size)

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

  def shapes(self) -> tuple[list[int], list[int]]:
    """(prefill row buckets, decode page-table widths): every shape the programs are called with."""
    pow2 = lambda limit: sorted({_bucket(n, limit) for n in range(1, limit + 1)})
    return pow2(self.engine.max_rows), pow2(self.pages_per_row)

  def warmup(self, state) -> int:
    """Compile every program shape `generate` can call, running each once on rows that write only to the trash
    page; returns the number of compiled programs. After it, no mix of requests compiles anything."""
    engine, sampling = self.engine, self.sampling
    if sampling.weight_layout == "dense_layers":
      state = self._dense(state)
    pools = self._init_pools(state).pools()
    key = jax.random.key(0)
    rows, widths = self.shapes()
    for B in rows:
      zeros = lambda dtype, *shape: jnp.zeros(shape, dtype)
      pools = self._prefill(state, pools, zeros(jnp.int32, B, engine.prefill_chunk),
                            zeros(bool, B, engine.prefill_chunk), zeros(jnp.int32, B, self.pages_per_row),
                            zeros(jnp.int32, B), jax.random.split(key, B), zeros(bool, B))[0]
    R = engine.max_rows
    for width in widths:
      pools = self._decode(state, pools, jnp.zeros(R, jnp.int32), jnp.zeros((R, width), jnp.int32),
                           jnp.zeros(R, jnp.int32), jnp.zeros(R, jnp.int32), jnp.ones(R, jnp.int32),
                           jnp.zeros(R, bool), jax.random.split(key, R))[0]
    jax.block_until_ready(pools)
    return sum(self.traces.values())

  def _init_pools(self, state):
    mc = self._model(state).config
    engine = self.engine
    num_pages = engine.num_pages or 1 + engine.max_rows * self.pages_per_row
    need = -(-(engine.max_prompt_tokens + engine.decode_steps) // engine.page_size)
    if num_pages - 1 < need:
      raise InputError(f"engine num_pages={num_pages} is too small for one request: a {engine.max_prompt_tokens}-"
                       f"token prompt and a round of {engine.decode_steps} decode steps need {need} pages of "
                       f"{engine.page_size} tokens, plus the trash page")
    return PagedKVCache.init(num_pages=num_pages, page_size=engine.page_size, num_layers=mc.num_hidden_layers,
                             num_kv_heads=mc.num_key_value_heads, head_dim=mc.head_dim,
                             compute_dtype=self._model(state).dtype, kv_dtype=self.kv_dtype)

  def generate(self, state, prompts: list[list[int]], keys=None) -> tuple[SampleOutput, dict]:
    """SampleOutput [Q, N] for the prompts (token-id lists, no padding), in order; keys: [Q] keys (one per request;
    default fold_in(key(0), q)). Returns (output, stats)."""
    engine, sampling = self.engine, self.sampling
    Q, N, Z, M = len(prompts), sampling.max_new_tokens, engine.page_size, self.pages_per_row
    for q, prompt in enumerate(prompts):
      if not 1 <= len(prompt) <= engine.max_prompt_tokens:
        raise InputError(f"request {q} has {len(prompt)} prompt tokens; the engine takes 1..{engine.max_prompt_tokens}"
                         " (engine max_prompt_tokens)")
    if keys is None:
      keys = jax.vmap(lambda q: jax.random.fold_in(jax.random.key(0), q))(jnp.arange(Q))
    if sampling.weight_layout == "dense_layers":
      state = self._dense(state)
    cache = self._init_pools(state)
    pools = cache.pools()
    free = list(range(cache.num_pages - 1, TRASH_PAGE, -1))  # pop() hands out low page ids first
    queue = collections.deque(range(Q))
    rows: list[_Row | None] = [None] * engine.max_rows
    K = min(sampling.logits_top_k, self._model(state).config.vocab_size)
    tokens, logps, mask = (np.full((Q, N), sampling.pad_id, np.int32), np.zeros((Q, N), np.float32),
                           np.zeros((Q, N), np.float32))
    top = (np.zeros((Q, N, K), np.float32), np.zeros((Q, N, K), np.int32)) if K else None
    stats = collections.Counter()
    peak_pages, peak_rows, rounds = 0, 0, 0

    def pages_for(slots: int) -> int:
      return -(-slots // Z)

    def release(r: int) -> None:
      free.extend(rows[r].pages)
      rows[r] = None

    while queue or any(rows):
      rounds += 1
      # 1. admit and prefill
      admitted = []
      for r in range(engine.max_rows):
        if rows[r] is not None or not queue:
          continue
        q = queue[0]
        need = pages_for(len(prompts[q]) + engine.decode_steps)
        if len(free) < need:
          break
        queue.popleft()
        rows[r] = _Row(q, [free.pop() for _ in range(need)], 0, 0, sampling.pad_id, rounds)
        admitted.append(r)
      if admitted:
        pools, ended = self._prefill_rows(state, pools, rows, admitted, prompts, keys, (tokens, logps, mask, top),
                                          stats)
        for r in ended:
          release(r)
      # 2. pages for the next round; preempt the newest rows while the pool is short
      while True:
        short = [r for r, row in enumerate(rows) if row is not None
                 and pages_for(row.length + engine.decode_steps) > len(row.pages)]
        want = sum(pages_for(rows[r].length + engine.decode_steps) - len(rows[r].pages) for r in short)
        if want <= len(free):
          for r in short:
            while len(rows[r].pages) < pages_for(rows[r].length + engine.decode_steps):
              rows[r].pages.append(free.pop())
          break
        newest = max((r for r, row in enumerate(rows) if row is not None), key=lambda r: rows[r].admitted_round)
        q = rows[newest].request
        tokens[q], logps[q], mask[q] = sampling.pad_id, 0.0, 0.0
        if top is not None:
          top[0][q], top[1][q] = 0.0, 0
        stats["discarded_tokens"] += rows[newest].generated
        queue.appendleft(q)
        release(newest)
        stats["preempted"] += 1
      peak_pages = max(peak_pages, cache.num_pages - 1 - len(free))
      live = [r for r, row in enumerate(rows) if row is not None]
      peak_rows = max(peak_rows, len(live))
      if not live:
        continue
      # 3. decode D steps over every row
      # Attention reads a page table's width of slots: the live rows' longest, bucketed to a power of two pages.
      table = np.zeros((engine.max_rows, _bucket(max(len(rows[r].pages) for r in live), M)), np.int32)
      lengths, generated, caps = (np.zeros(engine.max_rows, np.int32) for _ in range(3))
      last, alive = np.full(engine.max_rows, sampling.pad_id, np.int32), np.zeros(engine.max_rows, bool)
      request = np.zeros(engine.max_rows, np.int32)
      for r in live:
        row = rows[r]
        table[r, :len(row.pages)] = row.pages
        lengths[r], generated[r], caps[r], last[r], alive[r] = row.length, row.generated, N, row.last_token, True
        request[r] = row.request
      pools, out, new_lengths, still = self._decode(
          state, pools, jnp.asarray(last), jnp.asarray(table), jnp.asarray(lengths), jnp.asarray(generated),
          jnp.asarray(caps), jnp.asarray(alive), keys[jnp.asarray(request)])
      out = {k: np.asarray(v) for k, v in out.items()}
      out_tokens, out_logps, out_mask = out["tokens"], out["logps"], out["mask"]
      new_lengths, still = np.asarray(new_lengths), np.asarray(still)
      stats["decode_calls"] += 1
      stats["decode_row_steps"] += engine.max_rows * engine.decode_steps
      # 4. collect, retire
      for r in live:
        row, n = rows[r], int(out_mask[r].sum())
        tokens[row.request, row.generated:row.generated + n] = out_tokens[r, :n]
        logps[row.request, row.generated:row.generated + n] = out_logps[r, :n]
        mask[row.request, row.generated:row.generated + n] = 1.0
        if top is not None:
          top[0][row.request, row.generated:row.generated + n] = out["top_vals"][r, :n]
          top[1][row.request, row.generated:row.generated + n] = out["top_ids"][r, :n]
        row.generated += n
        row.length = int(new_lengths[r])
        row.last_token = int(out_tokens[r, n - 1]) if n else row.last_token
        if not still[r]:
          release(r)
    stats.update(useful_tokens=int(mask.sum()), rounds=rounds, peak_rows=peak_rows, peak_pages=peak_pages, pool_pages=cache.num_pages, page_size=Z,
                 peak_kv_bytes=peak_pages * pool_bytes(cache) // cache.num_pages, pool_bytes=pool_bytes(cache),
                 compiles=sum(self.traces.values()))
    return SampleOutput(jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(logps),
                        *((jnp.asarray(top[0]), jnp.asarray(top[1])) if top is not None else ())), dict(stats)

  def _prefill_rows(self, state, pools, rows, admitted, prompts, keys, outputs, stats):
    """Prefill the admitted rows' prompts, C tokens per call; their first tokens go into the outputs. Returns
    (pools, rows that ended on their first token)."""
    engine, C, M = self.engine, self.engine.prefill_chunk, self.pages_per_row
    tokens, logps, mask, top = outputs
    B, ended = _bucket(len(admitted), engine.max_rows), []
    for start in range(0, len(admitted), B):
      group = admitted[start:start + B]
      longest = max(len(prompts[rows[r].request]) for r in group)
      table = np.zeros((B, M), np.int32)  # prefill reads the full width: one program per row bucket
      request = np.zeros(B, np.int32)
      for i, r in enumerate(group):
        table[i, :len(rows[r].pages)] = rows[r].pages
        request[i] = rows[r].request
      row_keys = keys[jnp.asarray(request)]
      for offset in range(0, longest, C):
        chunk, valid, lengths, last = (np.zeros((B, C), np.int32), np.zeros((B, C), bool), np.zeros(B, np.int32),
                                       np.zeros(B, bool))
        for i, r in enumerate(group):
          prompt = prompts[rows[r].request]
          piece = prompt[offset:offset + C]
          chunk[i, :len(piece)], valid[i, :len(piece)] = piece, True
          lengths[i] = min(offset, len(prompt))
          last[i] = offset < len(prompt) <= offset + C
        pools, first, first_logp, first_top = self._prefill(state, pools, jnp.asarray(chunk), jnp.asarray(valid),
                                                            jnp.asarray(table), jnp.asarray(lengths), row_keys,
                                                            jnp.asarray(last))
        stats["prefill_calls"] += 1
        first, first_logp = np.asarray(first), np.asarray(first_logp)
        first_top = None if first_top is None else (np.asarray(first_top[0]), np.asarray(first_top[1]))
        for i, r in enumerate(group):
          if last[i]:
            row, q = rows[r], rows[r].request
            row.length, row.generated, row.last_token = len(prompts[q]), 1, int(first[i])
            tokens[q, 0], logps[q, 0], mask[q, 0] = first[i], first_logp[i], 1.0
            if top is not None:
              top[0][q, 0], top[1][q, 0] = first_top[0][i], first_top[1][i]
            if int(first[i]) in self.sampling.eos_ids or self.sampling.max_new_tokens == 1:
              ended.append(r)
    return pools, ended


def check_engine(name: str) -> str:
  if name not in ENGINES:
    raise InputError(f"rollout engine {name!r} does not exist; choose one of {', '.join(ENGINES)}")
  return name


class PagedSampler:
  """The static `Sampler`'s call over the paged engine: `(state, prompt_BxP, prompt_valid_BxP, key)` ->
  SampleOutput, so the training loop, evaluation and launch/sample.py take either engine. Row b is request b,
  drawn under fold_in(key, b) (or under key[b] when `key` holds one key per row); the rows of a group
  (samples_per_prompt > 1) each prefill their prompt (shared prompt pages are not built yet). `last_stats`: the
  engine's statistics of the latest call."""

  def __init__(self, graphdef, config: SamplingConfig, engine: EngineConfig):
    self.config = config
    self.engine = PagedEngine(graphdef, dataclasses.replace(config, samples_per_prompt=1), engine)
    self.last_stats: dict = {}

  def __call__(self, state, prompt_BxP, prompt_valid_BxP, key) -> SampleOutput:
    tokens_BxP, valid_BxP = np.asarray(prompt_BxP), np.asarray(prompt_valid_BxP).astype(bool)
    prompts = [row[valid].tolist() for row, valid in zip(tokens_BxP, valid_BxP)]
    keys_B = key if key.ndim == 1 else jax.vmap(lambda b: jax.random.fold_in(key, b))(jnp.arange(len(prompts)))
    out, self.last_stats = self.engine.generate(state, prompts, keys_B)
    return out


def engine_config(rollout, max_prompt_tokens: int, batch_rows: int) -> EngineConfig:
  """The paged engine's settings from a RolloutConfig: rows default to the batch's, pages to room for every row
  at its longest."""
  return EngineConfig(page_size=rollout.page_size, num_pages=rollout.kv_pages,
                      max_rows=rollout.engine_rows or batch_rows, decode_steps=rollout.decode_steps,
                      prefill_chunk=rollout.page_size * max(1, -(-64 // rollout.page_size)),
                      max_prompt_tokens=max_prompt_tokens)
