"""Paged rollout engine: the static sampler's tokens (greedy and sampled, every KV dtype, every family), per-request
determinism, preemption, a fixed set of compiled programs, and its input errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from opd_jax.errors import InputError
from opd_jax.models import load_pretrained
from opd_jax.rollout.engine import EngineConfig, PagedEngine, check_engine
from opd_jax.rollout.paged_cache import PagedKVCache
from opd_jax.rollout.sampler import Sampler, SamplingConfig, left_pad
from tests import checkpoints

EOS, PAD, N = 2, 0, 20
# Eleven requests of 1..19 prompt tokens through 4 rows and a 30-page pool of 4 tokens: rows are admitted as others
# end, prompts span several prefill chunks, and the pool runs dry (preemption).
SMALL = EngineConfig(page_size=4, max_rows=4, decode_steps=3, prefill_chunk=8, max_prompt_tokens=24, num_pages=30)


def _prompts(count=11, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(3, checkpoints.VOCAB, size=int(n)).tolist() for n in rng.integers(1, 20, size=count)]


def _keys(count, seed=7):
  return jax.vmap(lambda q: jax.random.fold_in(jax.random.key(seed), q))(jnp.arange(count))


def _both(path, sampling, engine=SMALL, prompts=None):
  graphdef, state = nnx.split(load_pretrained(path))
  prompts = prompts or _prompts()
  keys = _keys(len(prompts))
  tokens, valid = left_pad(prompts, PAD)
  static = Sampler(graphdef, sampling)(state, tokens, valid, keys)
  paged, stats = PagedEngine(graphdef, sampling, engine).generate(state, prompts, keys)
  return static, paged, stats


def _assert_same(static, paged, logp_tol):
  """Equal tokens and masks; log-probs within `logp_tol` everywhere and within 1e-5 at the median token."""
  np.testing.assert_array_equal(np.asarray(paged.tokens_BxN), np.asarray(static.tokens_BxN))
  np.testing.assert_array_equal(np.asarray(paged.mask_BxN), np.asarray(static.mask_BxN))
  diff = np.abs(np.asarray(paged.logprobs_BxN) - np.asarray(static.logprobs_BxN))[np.asarray(static.mask_BxN) > 0]
  assert diff.max() <= logp_tol and np.median(diff) <= 1e-5, (diff.max(), np.median(diff))


CASES = [("llama", 0.0, "native"), ("qwen3", 1.0, "int4")]
# Every family with every KV dtype, greedy and sampled alternating (each family sees both with each dtype group).
SLOW_CASES = [(f, float((i + j) % 2), kv) for i, f in enumerate(checkpoints.FAMILIES)
              for j, kv in enumerate(("native", "bf16", "int8", "fp8_e4m3", "fp8_e5m2", "int4"))
              if (f, float((i + j) % 2), kv) not in CASES] + [("llama", 1.0, "fp8_e4m3_bf16scale")]


@pytest.mark.parametrize("family,temperature,kv", CASES + [pytest.param(*c, marks=pytest.mark.slow) for c in SLOW_CASES])
def test_paged_engine_draws_the_static_samplers_tokens(tiny_checkpoints, family, temperature, kv):
  """Same per-request keys, same tokens and mask. Log-probs agree to float summation order (attention reads 32
  paged slots here, the static cache its own width, and prompts are prefilled in chunks of 8): 2e-5 with native
  keys / values. A stored KV dtype rounds each key and value, and a last-ulp difference can move one across a
  rounding boundary: one bf16 step (2^-8 relative) moved a log-prob by up to 1.2e-4 here, one int8 / fp8 / int4
  step by up to 5.3e-3; the largest difference is held to a few of those steps, the median to 1e-5."""
  sampling = SamplingConfig(max_new_tokens=N, temperature=temperature, eos_ids=(EOS,), pad_id=PAD, kv_dtype=kv,
                            logits_top_k=5)
  static, paged, stats = _both(tiny_checkpoints[family], sampling)
  tolerance = {"native": 2e-5, "bf16": 5e-4}.get(kv, 2e-2)
  _assert_same(static, paged, tolerance)
  real = np.asarray(static.mask_BxN) > 0  # the top-k log-probs of every drawn token (after EOS: static's only)
  np.testing.assert_array_equal(np.asarray(paged.top_ids_BxNxK)[real], np.asarray(static.top_ids_BxNxK)[real])
  top_diff = np.abs(np.asarray(paged.top_logprobs_BxNxK) - np.asarray(static.top_logprobs_BxNxK))[real]
  assert top_diff.max() <= tolerance, top_diff.max()
  assert stats["useful_tokens"] == int(np.asarray(static.mask_BxN).sum())


def test_greedy_paged_tokens_equal_transformers_generate(tiny_checkpoints):
  sampling = SamplingConfig(max_new_tokens=N, temperature=0.0, eos_ids=(EOS,), pad_id=PAD)
  prompts = _prompts(5, seed=1)
  graphdef, state = nnx.split(load_pretrained(tiny_checkpoints["qwen3"]))
  out, _ = PagedEngine(graphdef, sampling, SMALL).generate(state, prompts)
  torch_model = checkpoints.load_torch(tiny_checkpoints["qwen3"])
  for q, prompt in enumerate(prompts):
    with torch.no_grad():
      ref = torch_model.generate(torch.tensor([prompt]), max_new_tokens=N, do_sample=False, eos_token_id=EOS,
                                 pad_token_id=PAD)[0, len(prompt):].tolist()
    n = int(out.mask_BxN[q].sum())
    assert np.asarray(out.tokens_BxN[q, :n]).tolist() == ref


def test_a_requests_tokens_do_not_depend_on_its_batch_and_the_programs_do_not_recompile(tiny_checkpoints):
  """Request 0 alone, among 11 through 4 rows, and among 11 through 2 rows with a pool so small that rows are
  preempted and rerun: the same tokens. After the first call, new mixes of requests compile nothing."""
  sampling = SamplingConfig(max_new_tokens=N, temperature=1.0, eos_ids=(EOS,), pad_id=PAD)
  graphdef, state = nnx.split(load_pretrained(tiny_checkpoints["llama"]))
  prompts, keys = _prompts(), _keys(11)
  engine = PagedEngine(graphdef, sampling, SMALL)
  rows, widths = engine.shapes()
  assert (rows, widths) == ([1, 2, 4], [1, 2, 4, 8, 10, 12])  # 12 pages: 24 prompt + 20 new + 3 decode tokens
  # Prompts of up to one chunk (8 tokens) prefill at their length rounded to a page, reading those pages only.
  assert engine.prefill_shapes() == [(4, 1), (8, 2), (8, 12)]
  warm = engine.warmup(state)
  # Decode rounds run on R, R / 2 or R / 4 rows (the live ones packed first), at least 4: R = 4 here has one.
  assert engine.decode_rows() == [4]
  assert PagedEngine(graphdef, sampling, dataclasses.replace(SMALL, max_rows=16)).decode_rows() == [4, 8, 16]
  # prefill per row bucket and shape, first token per row bucket, the page copy, decode per row count and width
  assert warm == len(rows) * 3 + len(rows) + 1 + len(widths)
  crowded, stats = engine.generate(state, prompts, keys)
  alone, _ = engine.generate(state, prompts[:1], keys[:1])
  shuffled, _ = engine.generate(state, prompts[::-1], keys[::-1])
  assert sum(engine.traces.values()) == warm  # nothing compiles after the warm-up
  assert stats["preempted"] > 0
  tight = EngineConfig(page_size=4, max_rows=2, decode_steps=3, prefill_chunk=8, max_prompt_tokens=24, num_pages=14)
  narrow, narrow_stats = PagedEngine(graphdef, sampling, tight).generate(state, prompts, keys)
  assert narrow_stats["preempted"] > 0
  # Headroom at admission: rows are admitted only while a third of the pool stays free, so fewer are preempted.
  roomy, roomy_stats = PagedEngine(graphdef, sampling, dataclasses.replace(tight, admit_headroom=0.34)).generate(
      state, prompts, keys)
  assert roomy_stats.get("preempted", 0) < narrow_stats["preempted"]
  row = lambda out, q: np.asarray(out.tokens_BxN[q]).tolist()
  assert row(alone, 0) == row(crowded, 0) == row(narrow, 0) == row(shuffled, 10)
  np.testing.assert_array_equal(np.asarray(narrow.tokens_BxN), np.asarray(crowded.tokens_BxN))
  np.testing.assert_array_equal(np.asarray(roomy.tokens_BxN), np.asarray(crowded.tokens_BxN))


def test_inflight_weight_update_switches_running_rows_and_records_each_tokens_version(tiny_checkpoints):
  """Version 5 arrives before the third round: the tokens drawn before it are version 4's (equal to a run on
  version 4 alone), every later token is version 5's, running rows switch mid-response, and a request admitted
  after the switch draws exactly what a run on version 5 alone draws for it (per-request keys)."""
  sampling = SamplingConfig(max_new_tokens=N, temperature=1.0, eos_ids=(EOS,), pad_id=PAD)
  graphdef, old = nnx.split(load_pretrained(tiny_checkpoints["llama"]))
  new = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(1), x.shape, x.dtype), old)
  prompts, keys = _prompts(), _keys(11)
  roomy = dataclasses.replace(SMALL, num_pages=80)  # no preemption: a rerun would redraw under the new version
  engine = PagedEngine(graphdef, sampling, roomy)
  rounds = iter(range(1000))
  weights = lambda: (5, new) if next(rounds) >= 2 else (4, old)
  out, stats = engine.generate(old, prompts, keys, version=4, weights=weights)
  only_old, _ = engine.generate(old, prompts, keys)
  only_new, _ = engine.generate(new, prompts, keys)
  version, mask = np.asarray(out.version_BxN), np.asarray(out.mask_BxN) > 0
  assert stats["weight_updates"] == 1 and set(np.unique(version[mask])) == {4, 5} and (version[~mask] == -1).all()
  assert (np.diff(np.where(mask, version, 5), axis=1) >= 0).all()  # a response never goes back to older weights
  switched = [q for q in range(11) if {4, 5} <= set(version[q][mask[q]])]
  assert switched  # rows running at the update continued on the new weights
  tokens = np.asarray(out.tokens_BxN)
  assert any((version[q][mask[q]] == 5).all() for q in range(11))
  for q in range(11):
    first = int(np.argmax(version[q] == 5)) if (version[q] == 5).any() else N
    assert tokens[q, :first].tolist() == np.asarray(only_old.tokens_BxN)[q, :first].tolist()
    if (version[q][mask[q]] == 5).all():  # admitted after the switch: version 1's own response
      assert tokens[q].tolist() == np.asarray(only_new.tokens_BxN)[q].tolist()


@pytest.mark.parametrize("prompt_len", [11, 8, 3])  # a partial last page; whole pages only; one partial page
def test_a_group_shares_its_prompt_pages_and_draws_the_static_samplers_tokens(tiny_checkpoints, prompt_len):
  """samples_per_prompt=4: each group's prompt is prefilled once, its rows share the full prompt pages and copy
  the partial one; the tokens are the static sampler's (which also prefills once per group), and the group holds
  fewer pages than four separate requests."""
  sampling = SamplingConfig(max_new_tokens=N, temperature=1.0, eos_ids=(EOS,), pad_id=PAD, samples_per_prompt=4,
                            kv_dtype="int8")
  rng = np.random.default_rng(prompt_len)
  prompts = [p for p in rng.integers(3, checkpoints.VOCAB, size=(3, prompt_len)).tolist() for _ in range(4)]
  grouped = EngineConfig(page_size=4, max_rows=8, decode_steps=3, prefill_chunk=8, max_prompt_tokens=24)
  static, paged, stats = _both(tiny_checkpoints["qwen2"], sampling, engine=grouped, prompts=prompts)
  _assert_same(static, paged, 2e-2)
  assert stats["prefill_calls"] == 2 * -(-prompt_len // 8)  # two admissions of groups, one prefill row each
  graphdef, state = nnx.split(load_pretrained(tiny_checkpoints["qwen2"]))
  alone = PagedEngine(graphdef, dataclasses.replace(sampling, samples_per_prompt=1), grouped)
  separate = alone.generate(state, prompts, _keys(len(prompts)))
  _assert_same(separate[0], paged, 2e-2)
  if prompt_len >= grouped.page_size:  # a full prompt page is shared by the group's four rows
    assert stats["peak_pages"] < separate[1]["peak_pages"]
  else:  # a prompt inside one page: no full page to share (each row gets its own copy of the partial one)
    assert stats["peak_pages"] <= separate[1]["peak_pages"]
  with pytest.raises(InputError, match="their prompts differ"):
    PagedEngine(graphdef, sampling, grouped).generate(state, prompts[:3] + prompts[4:5])


def test_paged_cache_writes_each_row_at_its_own_length():
  """Two rows at lengths 0 and 5 write 3 tokens (the second row's last one padding): the real ones land in their
  pages at their slots, the padding in the trash page, and each token sees exactly the slots up to its own."""
  cache = PagedKVCache.init(num_pages=6, page_size=4, num_layers=1, num_kv_heads=1, head_dim=2,
                            compute_dtype=jnp.float32).with_rows(jnp.array([[1, 2, 0], [3, 4, 5]]), jnp.array([0, 5]))
  valid = jnp.array([[True, True, True], [True, True, False]])
  cache, mask = cache.begin(valid)
  k = jnp.arange(12, dtype=jnp.float32).reshape(2, 3, 1, 2) + 1
  cache = cache.write(0, k, -k).end()
  keys, values = cache.read(0, jnp.float32)  # [B, K, H, S], [B, K, S, H]
  np.testing.assert_array_equal(np.asarray(cache.lengths_B), [3, 7])
  np.testing.assert_array_equal(np.asarray(keys[0, 0, :, :3]).T, np.asarray(k[0, :, 0]))
  np.testing.assert_array_equal(np.asarray(keys[1, 0, :, 5:7]).T, np.asarray(k[1, :2, 0]))
  np.testing.assert_array_equal(np.asarray(values[1, 0, 5:7]), -np.asarray(k[1, :2, 0]))
  assert float(jnp.abs(cache.k_LxNxKxHxZ[0, 0]).sum()) > 0  # the padded token went to the trash page
  assert mask.shape == (2, 3, 12)
  np.testing.assert_array_equal(np.asarray(mask[0, 1, :4]), [True, True, False, False])
  np.testing.assert_array_equal(np.nonzero(np.asarray(mask[1, 1]))[0], np.arange(7))


def test_engine_input_errors():
  with pytest.raises(InputError, match="page_size=6 does not divide prefill_chunk=64"):
    EngineConfig(page_size=6)
  with pytest.raises(InputError, match="does not exist; choose one of static, paged"):
    check_engine("vllm")
  with pytest.raises(InputError, match="decode_steps=0 must be >= 1"):
    EngineConfig(decode_steps=0)
  with pytest.raises(InputError, match="admit_headroom=1.0 must be in"):
    EngineConfig(admit_headroom=1.0)


def test_engine_refuses_a_pool_too_small_and_a_prompt_too_long(tiny_checkpoints):
  sampling = SamplingConfig(max_new_tokens=4, temperature=0.0, eos_ids=(EOS,), pad_id=PAD)
  graphdef, state = nnx.split(load_pretrained(tiny_checkpoints["llama"]))
  small = EngineConfig(page_size=4, max_rows=2, decode_steps=3, prefill_chunk=8, max_prompt_tokens=24, num_pages=4)
  with pytest.raises(InputError, match="num_pages=4 is too small for one request"):
    PagedEngine(graphdef, sampling, small).generate(state, [[5, 6]])
  with pytest.raises(InputError, match="request 1 has 25 prompt tokens"):
    PagedEngine(graphdef, sampling, SMALL).generate(state, [[5], [5] * 25])
  grouped = dataclasses.replace(sampling, samples_per_prompt=8)
  with pytest.raises(InputError, match="raise the engine's rows to >= 8"):
    PagedEngine(graphdef, grouped, SMALL).generate(state, [[5, 6]] * 8)
  narrow = EngineConfig(page_size=4, max_rows=8, decode_steps=3, prefill_chunk=8, max_prompt_tokens=24, num_pages=9)
  with pytest.raises(InputError, match="cannot hold a group of 8 requests"):
    PagedEngine(graphdef, grouped, narrow).generate(state, [[5, 6]] * 8)



@pytest.mark.slow
def test_engine_benchmark_runs_both_engines_on_the_same_requests(tmp_path):
  """launch/bench/engine.py at toy size: both engines draw the same tokens (per-request keys), so they count the
  same useful tokens; the paged engine steps only live rows; capacity rows grow as the KV dtype shrinks."""
  import json
  import os
  import subprocess
  import sys
  out = tmp_path / "bench" / "engine.json"
  out.parent.mkdir()
  # One device, as a user runs it; pages of 32 tokens (two prefill shapes, not four) and two KV dtypes: the
  # programs it compiles are most of its time (68 -> 37 s here).
  env = {**os.environ, "XLA_FLAGS": os.environ["OPD_JAX_TEST_XLA_FLAGS"]}
  subprocess.run([sys.executable, "launch/bench/engine.py", "--checkpoint=opd_jax/assets/pair1/student",
                  "--requests=8", "--rows=4", "--new_tokens=16", "--repeats=1", "--kv_budget_mib=0.04",
                  "--capacity_requests=24", "--kv_dtypes=bf16,int4", "--page_size=32", f"--out={out}"],
                 check=True, capture_output=True, text=True, env=env)
  result = json.loads(out.read_text())
  for workload in ("equal", "longtail"):
    row = result[workload]
    assert row["static"]["useful_tokens"] == row["paged"]["useful_tokens"] > 0 and row["paged"]["same_tokens"] == 1.0
    assert row["paged"]["row_steps"] <= row["static"]["row_steps"] + 4 * 8  # at most a round of overshoot per row
  same_memory = result["longtail"]["paged_same_memory"]  # twice the rows in the static batches' KV bytes
  assert same_memory["same_tokens"] == 1.0 and same_memory["rows"] == 8
  from launch.bench._inputs import chat_prompts
  longest = max(map(len, chat_prompts("opd_jax/assets/pair1/student", 8)))
  assert same_memory["pool_pages"] == 1 + 4 * (longest + 16) // 32
  capacity = {r["kv_dtype"]: r for r in result["capacity"]}
  assert capacity["bf16"]["static_rows"] < capacity["int4"]["static_rows"]  # more rows as the KV dtype shrinks
  for r in capacity.values():  # full while requests wait: the mean live rows lie between 1 and the peak
    assert r["requests"] == 24  # the 8 long-tail prompts, cycled
    assert r["saturated_rounds"] > 0 and 1 <= r["paged_mean_rows"] <= r["paged_peak_rows"]
  from study.tables import bench  # what docs render from results/bench/engine.json
  rendered = bench.tables(str(tmp_path))
  assert rendered["rollout engines: static vs paged"].count("\n| longtail | ") == 3
  assert "| int4 | 120 |" in rendered["rollout engines: sequences in one KV budget"]


def test_concurrent_sequences_in_a_kv_budget():
  """The static engine reserves prompt + cap per row; the paged one holds whole pages of the mean length."""
  from opd_jax.rollout.memory import concurrent_sequences
  fits = concurrent_sequences(16_000, prompt_tokens=64, max_new_tokens=256, mean_tokens=150, page_size=16)
  assert fits == {"static": 50, "paged": 1000 // 10}


def test_the_engines_sweep_points_are_valid_main_pair1_runs():
  """configs/sweeps/engines.py: the main command's 700 steps for each engine; the in-flight point is async."""
  from configs import pair1
  from configs.sweeps import engines
  from opd_jax.experiments.sweep import set_field
  from opd_jax.spec.run_spec import RunSpec
  sweep = engines.get_config("seed=2")
  specs = {}
  for name, overrides in sweep.points:
    config = pair1.get_config()
    for field, value in {**dict(sweep.base_overrides), **dict(overrides)}.items():
      set_field(config, field, value)
    specs[name] = RunSpec.from_config(config, device_count=1)
  assert {n: (s.rollout.engine, s.train.mode, s.rollout.inflight_updates) for n, s in specs.items()} == {
      "baseline": ("static", "sync", False), "paged": ("paged", "sync", False),
      "paged_async_inflight": ("paged", "async", True), "paged_async": ("paged", "async", False)}
  assert all(s.train.steps == pair1.get_config().train.steps == 700 and s.seed == 2 for s in specs.values())


def test_paged_sampling_over_four_devices_draws_the_one_device_tokens(tiny_checkpoints):
  """A sampler mesh of 4 devices: each runs its own engine on its block of rows (whole groups) with its replica of
  the weights; every request keeps its key, so the tokens and log-probs are the one-device engine's, and the
  output is sharded over the mesh's rows. A batch that does not split into whole groups per device is refused."""
  from opd_jax.rollout import placement
  from opd_jax.rollout.paged_sampler import PagedSampler
  sampling = SamplingConfig(max_new_tokens=N, temperature=1.0, eos_ids=(EOS,), pad_id=PAD, samples_per_prompt=2,
                            kv_dtype="fp8_e4m3")
  graphdef, state = nnx.split(load_pretrained(tiny_checkpoints["qwen3"]))
  prompts = [p for p in _prompts(count=8, seed=3) for _ in range(2)]  # 8 groups of 2: 2 groups per device
  tokens, valid = left_pad(prompts, PAD)
  mesh = placement.sampler_mesh(jax.devices()[:4], 1)
  replicated = jax.device_put(state, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  config = dataclasses.replace(SMALL, max_rows=4)
  one = PagedSampler(graphdef, sampling, config)(state, tokens, valid, jax.random.key(5))
  four_sampler = PagedSampler(graphdef, sampling, config, mesh=mesh)
  four = four_sampler(replicated, tokens, valid, jax.random.key(5))
  _assert_same(one, four, 1e-6)
  assert four.tokens_BxN.sharding.is_equivalent_to(placement.batch_sharding(mesh), 2)
  assert four_sampler.last_stats["useful_tokens"] == int(np.asarray(one.mask_BxN).sum())
  with pytest.raises(InputError, match="make the batch a multiple of 8"):
    four_sampler(replicated, tokens[:12], valid[:12], jax.random.key(5))
