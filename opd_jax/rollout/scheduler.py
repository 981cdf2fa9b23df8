"""Host side of the paged engine (rollout.engine): which requests wait, which rows run, which pages each holds, and
the outputs collected so far.

Legend: Q requests, N max new tokens, K top-k log-probs kept, Z tokens per page, D decode steps per round.

Requests come in units: a group of `group_size` consecutive requests with one prompt (samples_per_prompt), or a
single request. A unit is admitted whole. Its rows share the prompt's full pages (reference counted, freed when the
last row lets go); each row owns the pages from the prompt's partial last page on, so only the first row is
prefilled and the partial page is copied to the others (copy on write). A preempted row comes back as a unit of
its own and is prefilled alone.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from opd_jax.errors import InputError
from opd_jax.rollout.paged_cache import TRASH_PAGE


@dataclasses.dataclass
class Row:
  request: int
  pages: list[int]  # page ids of slots [m * Z, (m + 1) * Z), shared prompt pages first
  admitted_round: int
  length: int = 0  # tokens cached
  generated: int = 0  # tokens drawn (the last one not cached yet)
  last_token: int = 0


@dataclasses.dataclass
class Admitted:
  """One admitted unit: its rows (the first is prefilled) and the partial prompt page each other row copies."""
  rows: list[int]
  copies: list[tuple[int, int]]  # (source page, destination page)


class PagePool:
  """Free page ids (page 0, the trash page, never among them) with a reference count per page in use."""

  def __init__(self, num_pages: int):
    self.total = num_pages - 1
    self.free = list(range(num_pages - 1, TRASH_PAGE, -1))  # pop() hands out low ids first
    self.refs = collections.Counter()

  def take(self, n: int) -> list[int]:
    pages = [self.free.pop() for _ in range(n)]
    self.refs.update(pages)
    return pages

  def share(self, pages: list[int]) -> None:
    self.refs.update(pages)

  def release(self, pages: list[int]) -> None:
    for page in pages:
      self.refs[page] -= 1
      if not self.refs[page]:
        del self.refs[page]
        self.free.append(page)

  @property
  def in_use(self) -> int:
    return self.total - len(self.free)


class Outputs:
  """[Q, N] tokens, log-probs, mask and the weight version that drew each token (-1: none), and [Q, N, K] top-k
  log-probs and ids, filled as rows draw tokens; `version` is the weights drawing now."""

  def __init__(self, Q: int, N: int, K: int, pad_id: int, version: int = 0):
    self.pad_id, self.version = pad_id, version
    self.tokens, self.logps, self.mask = (np.full((Q, N), pad_id, np.int32), np.zeros((Q, N), np.float32),
                                          np.zeros((Q, N), np.float32))
    self.versions = np.full((Q, N), -1, np.int32)
    self.top = (np.zeros((Q, N, K), np.float32), np.zeros((Q, N, K), np.int32)) if K else None

  def put(self, q: int, start: int, tokens, logps, top=None) -> None:
    n = len(tokens)
    self.tokens[q, start:start + n], self.logps[q, start:start + n], self.mask[q, start:start + n] = tokens, logps, 1
    self.versions[q, start:start + n] = self.version
    if self.top is not None:
      self.top[0][q, start:start + n], self.top[1][q, start:start + n] = top

  def reset(self, q: int) -> None:
    self.tokens[q], self.logps[q], self.mask[q], self.versions[q] = self.pad_id, 0.0, 0.0, -1
    if self.top is not None:
      self.top[0][q], self.top[1][q] = 0.0, 0


def units_of(prompts: list[list[int]], group_size: int) -> list[list[int]]:
  """Requests in units of `group_size` consecutive ones, which must share one prompt."""
  if len(prompts) % group_size:
    raise InputError(f"{len(prompts)} requests are not a whole number of groups of {group_size}")
  units = [list(range(i, i + group_size)) for i in range(0, len(prompts), group_size)]
  for unit in units:
    if any(prompts[q] != prompts[unit[0]] for q in unit):
      raise InputError(f"requests {unit[0]}..{unit[-1]} form a group (samples_per_prompt={group_size}) but their "
                       "prompts differ; repeat each prompt group_size times in a row")
  return units


class Scheduler:
  """Rows, pages and the queue of one `PagedEngine.generate` call."""

  def __init__(self, prompts: list[list[int]], group_size: int, *, rows: int, page_size: int, decode_steps: int,
               num_pages: int, headroom: int = 0):
    if group_size > rows:
      raise InputError(f"a group of samples_per_prompt={group_size} rows is admitted whole, but the engine decodes "
                       f"{rows} rows at once; raise the engine's rows to >= {group_size}")
    self.prompts, self.Z, self.D = prompts, page_size, decode_steps
    self.queue = collections.deque(units_of(prompts, group_size))
    self.rows: list[Row | None] = [None] * rows
    self.pool = PagePool(num_pages)
    self.headroom = headroom  # pages an admission leaves free while other rows run (room for them to grow)
    self.round = 0

  def pages_for(self, slots: int) -> int:
    return -(-slots // self.Z)

  def live(self) -> list[int]:
    return [r for r, row in enumerate(self.rows) if row is not None]

  def admit(self) -> list[Admitted]:
    """Whole units into free rows while the pool has pages for their prompt and one round of decoding, leaving
    `headroom` pages free (unless nothing runs: a lone unit needs only its pages)."""
    self.round += 1
    admitted = []
    while self.queue:
      unit = self.queue[0]
      free_rows = [r for r, row in enumerate(self.rows) if row is None]
      P = len(self.prompts[unit[0]])
      shared = P // self.Z if len(unit) > 1 else 0  # full prompt pages the unit's rows share
      own = self.pages_for(P + self.D) - shared
      alone = not self.live() and not admitted
      reserve = 0 if alone else self.headroom
      if len(free_rows) < len(unit) or len(self.pool.free) < shared + own * len(unit) + reserve:
        if alone:  # nothing will ever free a page: it cannot fit at all
          raise InputError(f"the KV pool's {self.pool.total} pages cannot hold a group of {len(unit)} requests with "
                           f"{P}-token prompts ({shared + own * len(unit)} pages); raise the engine's num_pages")
        break
      self.queue.popleft()
      common = self.pool.take(shared)
      rows, copies = free_rows[:len(unit)], []
      for i, (r, q) in enumerate(zip(rows, unit)):
        if i:
          self.pool.share(common)
        self.rows[r] = Row(q, common + self.pool.take(own), self.round)
        if i and P % self.Z:  # the prompt's partial last page, written by the first row's prefill
          copies.append((self.rows[rows[0]].pages[shared], self.rows[r].pages[shared]))
      admitted.append(Admitted(rows, copies))
    return admitted

  def release(self, r: int) -> None:
    self.pool.release(self.rows[r].pages)
    self.rows[r] = None

  def grow(self, outputs: Outputs, stats: collections.Counter) -> None:
    """Pages for every live row's next round; while the pool is short, the newest row is preempted (its request
    queued again, alone, at the front; its tokens discarded)."""
    while True:
      want = {r: self.pages_for(self.rows[r].length + self.D) - len(self.rows[r].pages) for r in self.live()}
      if sum(max(0, n) for n in want.values()) <= len(self.pool.free):
        for r, n in want.items():
          if n > 0:
            self.rows[r].pages += self.pool.take(n)
        return
      newest = max(self.live(), key=lambda r: (self.rows[r].admitted_round, r))
      q = self.rows[newest].request
      stats["discarded_tokens"] += self.rows[newest].generated
      stats["preempted"] += 1
      outputs.reset(q)
      self.queue.appendleft([q])
      self.release(newest)
