"""Memory planner (opd_jax/planning/memory_plan.py): JSON contract, monotonicity, verdict and micro-batch search,
shipped shapes and errors. One tiny run (the shipped 1.7B -> 0.6B config at tiny shapes), compiled abstractly on
one simulated CPU device."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from opd_jax.experiments.sweep import set_field
from opd_jax.planning import memory_plan as mp
from opd_jax.planning import plan_programs
from opd_jax.planning.plan_spec import GIB, PlanSpec, known_models, resolve_model, shapes_of
from opd_jax.spec import RunSpec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = {"model_type": "qwen3", "vocab_size": 1024, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
        "tie_word_embeddings": True, "eos_token_id": 1}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("tiny_config")
  with open(path / "config.json", "w") as f:
    json.dump(TINY, f)
  return str(path)


def plan_of(model_dir: str, devices: int = 1, device_memory_bytes: int = GIB, teacher_dir: str = "",
            **overrides) -> PlanSpec:
  """The shipped real config (bf16 teacher, float32 learner, reverse_kl_pg, remat) on `model_dir` for both
  models: batch 8 x (8 + 32) tokens, no micro-batching, evaluation over the whole batch; `overrides` are
  config fields with "__" for ".", as --config.x.y=v would set them."""
  from configs.real import qwen3_1p7b_to_0p6b
  config = qwen3_1p7b_to_0p6b.get_config(f"teacher={teacher_dir or model_dir},student={model_dir}")
  fields = {"train.batch_size": 8, "data.max_prompt_tokens": 8, "rollout.max_new_tokens": 32,
            "train.micro_batch_size": 0, "train.eval_batch_size": 8,
            **{k.replace("__", "."): v for k, v in overrides.items()}}
  for field, value in fields.items():
    set_field(config, field, value)
  spec = RunSpec.from_config(config, device_count=devices, models=shapes_of)
  return PlanSpec(spec, *shapes_of(spec.pair), devices=devices, device_memory_bytes=device_memory_bytes)


@pytest.fixture(scope="module")
def tiny_plan(tiny_dir):
  """A plan whose device memory (1 GiB) holds everything at the whole batch of 8."""
  return plan_of(tiny_dir)


@pytest.fixture(scope="module")
def tiny_result(tiny_plan):
  return mp.plan_memory(tiny_plan)


@pytest.mark.slow
def test_json_fields_are_present_and_consistent(tiny_result):
  out = json.loads(json.dumps(tiny_result.to_json()))
  assert set(out["programs"]) == {"sampler", "teacher_score", "train_step", "eval_sampler", "eval_sampler_sampled",
                                  "eval_reverse_kl"}
  assert out["fits"] is True and out["micro_batch_size"] == 8
  assert out["peak_bytes_per_device"] == max(out["program_totals"].values()) <= out["device_memory_bytes"]
  assert out["planner_peak_rss_bytes"] > 100e6  # this process: jax and its compiles
  assert {"teacher_params", "learner_params", "optimizer_state", "rollout_batch"} <= set(out["resident_bytes"])
  for name, details in out["program_details"].items():
    assert details["peak_bytes"] == out["programs"][name] == (
        details["argument_bytes"] + details["output_bytes"] + details["temp_bytes"] - details["alias_bytes"]) > 0
    assert out["program_totals"][name] >= out["programs"][name]
  # The train step's arguments are the learner state, the batch and the teacher: its total adds nothing.
  resident = out["resident_bytes"]
  assert out["program_totals"]["train_step"] == out["programs"]["train_step"]
  # float32 Adam holds two moments per parameter; a bfloat16 teacher of the same shape is a quarter of the
  # float32 learner.
  assert resident["optimizer_state"] == pytest.approx(2 * resident["learner_params"], abs=64)
  assert resident["teacher_params"] * 2 == resident["learner_params"]
  assert out["programs"]["train_step"] > out["programs"]["teacher_score"]
  # Colocated, the sampler runs beside everything the learner keeps resident (its own weights are an argument).
  learner_side = sum(resident[k] for k in ("teacher_params", "learner_params", "optimizer_state", "rollout_batch"))
  assert out["program_totals"]["sampler"] == out["programs"]["sampler"] + learner_side


def test_a_paged_run_plans_the_engines_programs_and_its_kv_capacity(tiny_dir):
  """rollout.engine=paged: prefill and decode programs (with the KV pool among their arguments) instead of one
  generate program, and the sequences of the run's length its device holds at each KV dtype."""
  result = mp.plan_memory(plan_of(tiny_dir, rollout__engine="paged", rollout__page_size=8))
  assert {"sampler_prefill", "sampler_decode"} <= set(result.programs) and "sampler" not in result.programs
  paged = result.to_json()["paged"]
  assert paged["sequence_tokens"] == 8 + 32 and paged["pool_bytes"] > 0
  by = paged["by_kv_dtype"]
  assert by["int4"]["sequences"] > by["fp8_e4m3_bf16scale"]["sequences"] >= by["fp8_e4m3"]["sequences"] > \
      by["bf16"]["sequences"] > 0
  pages = lambda kv: by[kv]["kv_tokens"] // 8 // 5  # 40 tokens: 5 pages of 8
  assert all(by[kv]["sequences"] == pages(kv) for kv in by)


def test_a_cross_tokenizer_run_plans_the_teachers_own_lengths(tiny_dir, tmp_path):
  """cross_tokenizer.enabled: the teacher scores its own prompt and response (twice the student's by default),
  with its hidden states at span starts for the marginal objective; the held-out KL is the span estimate. The
  marginal form compares two vocabularies through common events, planned with placeholder events (one per token
  of either side): it was planned as one vocabulary and crashed on configs/pairx.py (logits of 32 against 128
  tokens), so a teacher of its own vocabulary size is planned too, settled and corrected."""
  cross = dict(cross_tokenizer__enabled=True, cross_tokenizer__teacher_format="plain", objective__name="reverse_kl")
  result = mp.plan_memory(plan_of(tiny_dir, **cross))
  assert {"teacher_score", "eval_span_kl", "train_step"} <= set(result.programs)
  assert "eval_reverse_kl" not in result.programs
  same = mp.plan_memory(plan_of(tiny_dir, objective__name="reverse_kl"))
  # 2 x (8 + 32) teacher tokens against 8 + 32
  assert result.programs["teacher_score"].argument_bytes > same.programs["teacher_score"].argument_bytes
  with open(tmp_path / "config.json", "w") as f:
    json.dump({**TINY, "vocab_size": 1536}, f)
  settled = mp.plan_memory(plan_of(tiny_dir, teacher_dir=str(tmp_path), **cross))
  # corrected boundaries: the programs take the covers (the teacher's and the student's), and the marginal form
  # the teacher's hidden states one token back
  corrected = mp.plan_memory(plan_of(tiny_dir, teacher_dir=str(tmp_path), cross_tokenizer__boundaries="corrected",
                                     **cross))
  assert settled.fits and corrected.fits
  for name in ("teacher_score", "train_step"):
    assert corrected.programs[name].argument_bytes > settled.programs[name].argument_bytes, name


def test_bigger_batch_bigger_train_step_peak(tiny_dir):
  peaks = []
  for batch in (8, 16):
    plan = plan_of(tiny_dir, train__batch_size=batch)
    program = plan_programs.build_programs(plan, plan_programs.plan_mesh(plan), batch)[0]["train_step"]
    peaks.append(mp.compile_memory(program).peak_bytes)
  assert peaks[1] > peaks[0]


@pytest.mark.slow
def test_less_device_memory_flips_fits_and_shrinks_the_micro_batch(tiny_plan, tiny_result):
  # Just below the train step's total at the whole batch: the batch no longer fits, half of it does.
  small = dataclasses.replace(tiny_plan, device_memory_bytes=tiny_result.totals["train_step"] - 1)
  totals = dict(tiny_result.micro_batch_totals)
  largest = mp.largest_micro_batch(small, plan_programs.plan_mesh(small), tiny_result.resident, totals)
  assert 0 < largest < 8 and totals[largest] <= small.device_memory_bytes < totals[8]
  refit = dataclasses.replace(tiny_result, plan=small, micro_batch_size=largest, micro_batch_totals=totals)
  assert refit.to_json()["fits"] is False and refit.to_json()["micro_batch_size"] == largest


def test_shipped_shapes_parse_with_published_vocabularies():
  vocab = {name: resolve_model(name, "config.teacher").vocab_size for name in known_models()}
  assert vocab == {"llama-3.1-8b": 128256, "qwen2.5-1.5b": 151936, "qwen2.5-7b": 152064, "qwen3-0.6b": 151936,
                   "qwen3-1.7b": 151936, "qwen3-8b": 151936}
  assert round(resolve_model("QWEN3-8B", "config.teacher").num_params() / 1e9, 2) == 8.19


def test_bad_model_name_names_the_field_and_the_known_names():
  with pytest.raises(ValueError, match=r"config.teacher='qwen9' is neither .* known names: llama-3.1-8b, .*qwen3-8b"):
    resolve_model("qwen9", "config.teacher")


def test_cli_bad_input_is_one_line_and_exit_2():
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "OPD_JAX_COMPILATION_CACHE": "off"}
  result = subprocess.run([sys.executable, "launch/plan_memory.py", "--config=configs/real/qwen3_1p7b_to_0p6b.py",
                           "--config.teacher=qwen9", "--json"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "config.teacher='qwen9'" in errors[0] and "qwen3-0.6b" in errors[0]
  assert result.stdout == ""


@pytest.mark.slow
def test_disaggregated_plan_counts_each_pool_and_host_snapshots(tiny_dir):
  """Sampler on device 0 (fp8, staleness 2), learner on device 1: the sampler's residents count only in its
  pool; with snapshots on the host they leave device memory."""
  settings = dict(rollout__placement="disaggregated", rollout__devices=1, rollout__weights="fp8",
                  rollout__staleness_steps=2, train__micro_batch_size=8)
  base = plan_of(tiny_dir, devices=2, **settings)
  mesh = plan_programs.plan_mesh(base)
  assert [d.id for d in mesh.devices.flat] == [1]
  assert [d.id for d in plan_programs.plan_sampler_mesh(base).devices.flat] == [0]
  programs = plan_programs.build_programs(base, mesh, 8)[0]
  memory = {name: mp.compile_memory(programs[name]) for name in ("sampler", "train_step")}
  for on in ("device", "host"):
    plan = plan_of(tiny_dir, devices=2, rollout__snapshots_on=on, **settings)
    resident = {name: mp.per_device_bytes(tree)
                for name, tree in plan_programs.build_programs(plan, mesh, 8)[1].items()}
    assert resident["staleness_snapshots"] == (2 * resident["sampler_weights"] if on == "device" else 0)
    assert resident["sampler_weights"] > 0
    totals = {name: mp._total(memory[name], programs[name], resident, plan) for name in memory}
    assert totals["sampler"] == memory["sampler"].peak_bytes + resident["staleness_snapshots"]
    assert totals["train_step"] == memory["train_step"].peak_bytes  # no sampler entry in the learner's pool


def test_fp8_sampler_weights_at_qwen3_8b_shapes():
  """The sampler's weights as rollout.weight_sync makes them (abstract, at real shapes): fp8 decoder linears
  over bf16 weights, with and without the embedding table; on a tensor-parallel sampler mesh each of 8 devices
  holds about an eighth."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from opd_jax.models.decoder import Decoder
  from opd_jax.rollout import placement
  from opd_jax.rollout.config import RolloutConfig
  from opd_jax.rollout.weight_sync import WeightSync
  config = resolve_model("qwen3-8b", "config.student")
  params = nnx.state(nnx.eval_shape(lambda: Decoder(config, dtype=jnp.bfloat16, param_dtype=jnp.float32)), nnx.Param)
  one = placement.sampler_mesh(jax.devices()[:1], 1)
  learner = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=jax.sharding.NamedSharding(
      one, jax.sharding.PartitionSpec())), params)
  bytes_of = lambda mesh, **recipe: WeightSync(RolloutConfig(**recipe), learner, mesh, jnp.bfloat16).bytes_per_device()
  bf16 = bytes_of(one, weights="bf16")
  assert bf16 == 2 * config.num_params()
  fp8, fp8_embed = bytes_of(one, weights="fp8") / bf16, bytes_of(one, weights="fp8", quantize_embedding=True) / bf16
  assert 0.57 < fp8 < 0.58 and 0.53 < fp8_embed <= 0.55, (fp8, fp8_embed)
  tp8 = bytes_of(placement.sampler_mesh(jax.devices(), 8), weights="fp8", quantize_embedding=True)
  assert tp8 <= fp8_embed * bf16 / 8 * 1.01


@pytest.mark.slow
def test_the_planner_needs_nothing_outside_the_package(tmp_path):
  """As from a non-editable install (`pip install .`, run from another folder): only the opd_jax package, with its
  package data, is importable; the shipped shapes, the planner's model resolution and the KV capacity of a
  shipped shape still work (they once read the repository's configs/ folder)."""
  import shutil
  site = tmp_path / "site"
  shutil.copytree(os.path.join(REPO, "opd_jax"), site / "opd_jax", ignore=shutil.ignore_patterns("__pycache__"))
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  code = ("import opd_jax; from opd_jax.planning import memory_plan, plan_spec as ps; from opd_jax.rollout import memory; "
          "print(opd_jax.__file__); print(ps.resolve_model('Qwen3-8B', 'config.teacher').vocab_size, "
          "len(ps.known_models()), memory.kv_capacity(ps.resolve_model('qwen3-8b', 'config.teacher'), (), 'bf16', "
          "device_bytes=80 * 2 ** 30).kv_tokens > 0)")
  env = {**os.environ, "PYTHONPATH": str(site), "JAX_PLATFORMS": "cpu"}
  result = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  where, numbers = result.stdout.strip().splitlines()[-2:]
  assert where.startswith(str(site)), where  # the copy, not the checkout
  assert numbers == "151936 6 True", numbers  # 6 shipped shapes


def test_host_device_term_counts_every_device_of_each_pool(tiny_dir):
  """On CPU each simulated device's buffers are host memory: colocated, the largest total times all devices;
  disaggregated, each pool's largest total times its own devices."""
  from opd_jax.planning import host_memory
  totals = {"sampler": 5, "teacher_score": 3, "train_step": 7, "eval_sampler": 2, "eval_reverse_kl": 4}
  pools = {name: "sampler" if name == "sampler" else "learner" for name in totals}
  colocated = mp.MemoryPlan(plan_of(tiny_dir, devices=4), {}, totals, {}, 8, 8, {}, pools)
  assert host_memory.device_bytes_on_host(colocated) == 4 * 7
  split = plan_of(tiny_dir, devices=5, rollout__placement="disaggregated", rollout__devices=1)
  assert host_memory.device_bytes_on_host(mp.MemoryPlan(split, {}, totals, {}, 8, 8, {}, pools)) == 4 * 7 + 1 * 5


def test_malloc_arena_cap_is_set_and_checked():
  from opd_jax.errors import InputError
  from opd_jax.train import malloc
  assert malloc.cap_arenas(0) is False  # glibc's default kept
  assert malloc.cap_arenas(8) is (sys.platform == "linux")  # this process keeps the cap: 8 is glibc's own floor
  for bad in (-1, 1.5, True, "2"):
    with pytest.raises(InputError, match="train.malloc_arena_max must be an integer >= 0"):
      malloc.cap_arenas(bad)


def test_malloc_tunables_restart_the_process_once_with_them(tmp_path):
  """use_tunables re-executes the script once with GLIBC_TUNABLES holding hugetlb=1 and the keep-freed pair (kept
  beside the user's other tunables); a tunable the user names wins; all off changes nothing; keeping freed memory
  with more than one arena is refused (a thread's own arena would map large blocks afresh anyway)."""
  import subprocess
  from opd_jax.train import malloc
  script = ("import os, sys; sys.path.insert(0, {root!r}); from opd_jax.train import malloc; "
            "print('start', os.environ.get('GLIBC_TUNABLES', ''), flush=True); "
            "print('on', ','.join(malloc.use_tunables({huge}, {keep}, 1)))")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

  def run(huge, keep, tunables):
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env.update({"GLIBC_TUNABLES": tunables} if tunables else {})
    path = tmp_path / "script.py"
    path.write_text(script.format(root=root, huge=huge, keep=keep).replace("; ", "\n"))
    out = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")[:-1]

  with pytest.raises(Exception, match="train.malloc_huge_pages must be True or False"):
    malloc.use_tunables("yes", False, 1)
  with pytest.raises(Exception, match="train.malloc_keep_freed must be True or False"):
    malloc.use_tunables(True, 1, 1)
  with pytest.raises(Exception, match="malloc_keep_freed=True needs train.malloc_arena_max=1"):
    malloc.use_tunables(True, True, 2)
  keep = ":".join(malloc.KEEP_FREED)
  if not (sys.platform == "linux" and malloc._glibc_at_least(2, 35)):  # no such tunables: nothing is set, no restart
    assert run(True, True, "") == ["start ", "on "]
    return
  assert run(True, False, "glibc.malloc.arena_max=2") == [
      "start glibc.malloc.arena_max=2", "start glibc.malloc.arena_max=2:" + malloc.HUGETLB, "on " + malloc.HUGETLB]
  assert run(True, True, "") == [
      "start ", f"start {malloc.HUGETLB}:{keep}", "on " + ",".join((malloc.HUGETLB, *malloc.KEEP_FREED))]
  # the user's hugetlb=0 and mmap_max=4 win; only the trim threshold is added
  assert run(True, True, "glibc.malloc.hugetlb=0:glibc.malloc.mmap_max=4") == [
      "start glibc.malloc.hugetlb=0:glibc.malloc.mmap_max=4",
      "start glibc.malloc.hugetlb=0:glibc.malloc.mmap_max=4:" + malloc.KEEP_FREED[1], "on " + malloc.KEEP_FREED[1]]
  assert run(False, False, "") == ["start ", "on "]


def test_malloc_trim_hands_a_kept_heaps_free_pages_back():
  """With freed memory kept (the training default), 400 MB written and freed stay resident until trim() runs."""
  from opd_jax.train import malloc
  if not (sys.platform == "linux" and malloc._glibc_at_least(2, 35)):
    pytest.skip("needs glibc >= 2.35 (the keep-freed tunables)")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  script = f"""import ctypes, sys
sys.path.insert(0, {root!r})
from opd_jax.train import malloc
def rss():
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * 4096
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
keep = libc.malloc(1 << 20)  # allocated after the block: the freed block is not the heap's top
block = libc.malloc(400 << 20)
libc.malloc(1 << 20)  # a chunk above the block, so the freed block is a hole inside the heap
ctypes.memset(block, 1, 400 << 20)
before = rss()
libc.free(ctypes.c_void_p(block))
freed = rss()
assert malloc.trim()
print(before, freed, rss())
"""
  env = dict(os.environ, GLIBC_TUNABLES=":".join(malloc.KEEP_FREED))
  out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  before, freed, trimmed = (int(x) for x in out.stdout.split())
  assert freed > before - (50 << 20)  # kept: free() gave (almost) nothing back
  assert trimmed < freed - (350 << 20)  # trim() did


def test_heap_trim_after_growth_settles_after_each_trim(monkeypatch):
  """HeapTrim.after_step: the first step after a trim sets the level; a later step more than growth_gb above it
  trims once (and reports it), and the level is set again by the next step; off (0 GB, or trims disabled), it
  never reads the resident size."""
  from opd_jax.train import malloc, process_memory
  sizes, trims, reports, waits = [], [], [], []
  monkeypatch.setattr(process_memory, "rss_bytes", lambda: (sizes.pop(0), 0))
  monkeypatch.setattr(malloc, "trim", lambda: trims.append(1) or True)
  heap = malloc.HeapTrim(True, 1.5, wait=lambda: waits.append(1))
  sizes[:] = [5.6e9, 6.0e9, 7.0e9, 7.7e9, 5.5e9, 7.0e9, 7.2e9]
  for _ in range(7):
    heap.after_step(reports.append)
  # 5.6 settles; 6.0 and 7.0 are within 1.5 GB; 7.7 is 2.1 above: trim; 5.5 settles again; 7.0 is 1.5 above (not
  # more); 7.2 is more
  assert len(trims) == len(waits) == len(reports) == 2
  assert reports[0].startswith("the heap grew to 7.70 GB resident, 2.10 GB above the 5.60 GB it settled at")
  heap.trim()  # a save's trim sets the level again too
  sizes[:] = [9.0e9, 9.1e9]
  heap.after_step(reports.append), heap.after_step(reports.append)
  assert len(trims) == 3 and len(reports) == 2
  malloc.HeapTrim(True, 0.0).after_step(reports.append)  # growth off: the saves' trims only
  disabled = malloc.HeapTrim(False, 1.5)  # train.malloc_trim off: no trim at all
  disabled.after_step(reports.append), disabled.trim()
  assert len(trims) == 3 and not sizes  # nothing read, nothing more trimmed


def test_heap_trim_gives_back_a_hole_that_a_kept_heap_outgrew():
  """The mechanism HeapTrim answers, on the real glibc with freed memory kept: a freed 400 MB block split by a small
  allocation no longer fits the next 400 MB block, so the heap grows by the whole block while the hole stays
  resident; after_step sees the growth and its trim gives the hole's pages back."""
  from opd_jax.train import malloc
  if not (sys.platform == "linux" and malloc._glibc_at_least(2, 35)):
    pytest.skip("needs glibc >= 2.35 on Linux (the kept-heap tunables)")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  script = f"""import ctypes, sys
sys.path.insert(0, {root!r})
from opd_jax.train import malloc, process_memory
rss = lambda: process_memory.rss_bytes()[0]
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
MB = 1 << 20
libc.malloc(MB)
block = libc.malloc(400 * MB)
libc.malloc(MB)  # above the block: once freed, the block is a hole inside the heap, not its top
ctypes.memset(block, 1, 400 * MB)
libc.free(ctypes.c_void_p(block))
reused = libc.malloc(400 * MB) == block  # unsplit, the hole takes the next block of its size
libc.free(ctypes.c_void_p(block))
heap, reports = malloc.HeapTrim(True, 0.2), []
heap.after_step(reports.append)  # settles with the hole resident
small = [libc.malloc(64 << 10) for _ in range(4)]  # served from the hole, which splits it
again = libc.malloc(400 * MB)
ctypes.memset(again, 1, 400 * MB)
grown = rss()
heap.after_step(reports.append)
print(int(reused), len(reports), grown, rss())
"""
  env = dict(os.environ, GLIBC_TUNABLES=":".join(malloc.KEEP_FREED))
  out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  reused, reported, grown, trimmed = (int(x) for x in out.stdout.split())
  assert reused and reported == 1
  assert trimmed < grown - (350 << 20)  # the hole's pages went back


@pytest.mark.slow
def test_malloc_benchmark_runs_both_settings_with_the_same_numbers(tmp_path):
  """launch/bench/malloc.py at toy size (pair1's smoke config): one run per setting, each with its own step times,
  CPU time and peak RSS, and the same logged numbers in both (a malloc setting must not change the math)."""
  out = tmp_path / "malloc.json"
  proc = subprocess.run([sys.executable, "launch/bench/malloc.py", "--config=configs/pair1.py:runlocal", "--steps=4",
                         "--warmup=2", "--rounds=1", f"--out={out}"], cwd=REPO, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(out.read_text())
  assert [r["variant"] for r in result["runs"]] == ["config", "baseline"]
  for r in result["runs"]:
    assert len(r["step_s"]) == 4 and r["step_s_mean"] > 0 and r["sys_s"] > 0 and r["peak_rss_bytes"] > 10**8
  assert result["same_numbers"] is True
  assert result["baseline_over_config"]["step_s_mean"] == pytest.approx(
      result["median"]["baseline"]["step_s_mean"] / result["median"]["config"]["step_s_mean"])
  assert "same numbers in every run: yes" in proc.stdout


@pytest.mark.slow
def test_host_rss_prediction_holds_for_a_run(tmp_path):
  """plan_memory.py --host_rss against the peak RSS of launch/train.py on the same config (pair1's smoke run),
  both without the persistent compilation cache (what a fresh machine does).

  The prediction runs low (opd_jax/planning/host_memory.py says why): 1.04 GB against 1.10-1.16 GB in ten
  runs here (GB = 1e9 bytes), and one run, forked straight from pytest, came out above 1.22 GB (the runner
  below keeps the caller's own peak out), so the band is what a single run allows: never above the measurement
  by more than 5%, never below it by more than 25% (a missing term such as the tokenizers' 0.2 GB fails it),
  with a second run when the first falls outside. The shipped comparisons of whole runs are
  results/host_rss.jsonl."""
  # As a user runs both (without tests/conftest.py's compiler flags; the planner's own measuring process has none).
  env = {**os.environ, "OPD_JAX_COMPILATION_CACHE": "off",
         "XLA_FLAGS": " ".join(f for f in os.environ["XLA_FLAGS"].split()
                               if f not in os.environ["OPD_JAX_TEST_XLA_FLAGS"].split())}
  config = "--config=configs/pair1.py:runlocal"
  plan = subprocess.run([sys.executable, "launch/plan_memory.py", config, "--host_rss", "--json"], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=600)
  assert plan.returncode == 0, plan.stderr[-3000:]
  host = json.loads(plan.stdout.strip().splitlines()[-1])["host_rss"]
  assert host["peak_bytes"] == sum(host[k] for k in ("runtime_bytes", "compile_bytes", "device_bytes",
                                                     "snapshot_bytes"))
  assert host["runtime_bytes"] > 0 and host["compile_bytes"] > 0 and host["device_bytes"] > 0

  def peak_of_a_run(attempt: int) -> int:  # through the benchmark's runner: a pytest worker's own peak stays out
    from opd_jax.bench.host_rss import run_guarded
    log_path = tmp_path / f"train{attempt}.log"
    result = run_guarded([sys.executable, "launch/train.py", config, f"--workdir={tmp_path}/run{attempt}"],
                         str(log_path), max_rss_bytes=8 * 10**9, timeout_s=600, env=env, cwd=REPO)
    assert result["exit"] == 0, log_path.read_text()[-3000:]
    return result["peak_rss_bytes"]

  within = lambda measured: 0.75 * measured <= host["peak_bytes"] <= 1.05 * measured
  measured = peak_of_a_run(0)
  if not within(measured):  # retention only adds: a second run, and the lower of the two peaks
    measured = min(measured, peak_of_a_run(1))
  assert within(measured), (host, measured)


def test_the_benchmark_runner_measures_the_command_not_its_caller():
  """A child forked straight from a process holding 1 GB reports that 1 GB as its ru_maxrss (Linux keeps the
  larger high-water mark across exec); run_guarded's spawner reports the command's own 0.2 GB. A command over
  the cap is killed and reported with the largest RSS seen."""
  import numpy as np

  from opd_jax.bench.host_rss import run_guarded
  ballast = np.ones(10**9 // 8)  # touched: resident in this process
  allocate = lambda gb: [sys.executable, "-c", f"import numpy as np; print(np.ones(int({gb} * 1e9) // 8).sum())"]
  direct = subprocess.Popen(allocate(0.2), stdout=subprocess.DEVNULL)
  _, _, usage = os.wait4(direct.pid, 0)
  assert usage.ru_maxrss * 1024 > 0.9e9
  result = run_guarded(allocate(0.2), os.devnull, max_rss_bytes=10**10)
  assert result["exit"] == 0 and 0.2e9 < result["peak_rss_bytes"] < 0.6e9, result
  killed = run_guarded(allocate(2.0), os.devnull, max_rss_bytes=int(0.6e9))
  assert killed["killed"].startswith("RSS > 0.6 GB") and killed["exit"] != 0 and killed["peak_rss_bytes"] > 0.6e9
  del ballast


def test_device_peak_memory_is_the_largest_devices_peak_and_absent_on_cpu():
  """The metrics rows' memory/device_peak_gib: the measured side of the planner's prediction on an accelerator."""
  from opd_jax.train.device_memory import peak_gib

  class Device:
    def __init__(self, stats):
      self.stats = stats

    def memory_stats(self):
      return self.stats

  assert peak_gib([Device({"peak_bytes_in_use": 3 * 2**30}), Device({"peak_bytes_in_use": 5 * 2**29})]) == {
      "memory/device_peak_gib": 3.0}
  assert peak_gib([Device(None)]) == {}
  assert peak_gib() == {}  # XLA:CPU reports none: the rows of a CPU run carry no such field


def test_the_logged_host_peak_never_falls_below_what_was_seen(monkeypatch):
  """/proc's current size can pass the kernel's ru_maxrss by a few pages (per-thread counters): the logged peak is
  the largest of both seen so far, so it never falls from one metrics row to the next."""
  from opd_jax.train import process_memory
  monkeypatch.setattr(process_memory, "_seen_peak", 0)
  counts = iter([(5_000_000_000, 4_900_000_000), (3_000_000_000, 4_950_000_000), (6_000_000_000, 6_100_000_000)])
  monkeypatch.setattr(process_memory, "rss_bytes", lambda: next(counts))
  rows = [process_memory.host_gb() for _ in range(3)]
  assert [(r["perf/host_rss_gb"], r["perf/host_peak_rss_gb"]) for r in rows] == [(5.0, 5.0), (3.0, 5.0), (6.0, 6.1)]
