"""Test setup: 8 simulated CPU devices, LLVM -O0 and XLA:CPU's cheaper emitters (set before jax is imported),
strict rank promotion, one compilation cache for the session's processes, tiny HF checkpoints."""

import os

# LLVM at -O0 for the tests' compilations (here, and in the commands the tests start with these flags; a test
# that measures a run as a user makes it removes the flag): XLA's graph passes are the same and every numeric
# check passes at its tolerance, while compilation, most of the suite's time, is about a third cheaper (user time
# on 2 cores: tests/test_chunked.py 156 -> 99 s, tests/test_train.py 127 -> 86 s). The tests' programs are tiny,
# so slower machine code costs little. An XLA_FLAGS given to pytest keeps its own level.
#
# XLA:CPU's older elemental emitters in place of its MLIR fusion emitters: the same optimized HLO (fusion is decided
# before either runs), machine code from a cheaper path. The paged engine's programs in one test case compile in
# 1.4 s instead of 3.9 s; tests/test_train.py alone on one worker: 46 -> 35 s. Every numeric check passes at its
# tolerance with either. A jax whose XLA no longer knows the flag would abort at start, so the session's first
# process asks a child first. The commands the tests start use OPD_JAX_TEST_XLA_FLAGS (these flags, without the
# simulated devices).
import subprocess  # noqa: E402
import sys  # noqa: E402

_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def _xla_accepts(flag: str) -> bool:
  probe = [sys.executable, "-c", "import jax; jax.jit(lambda x: x + 1)(1.0).block_until_ready()"]
  env = {**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"}
  return subprocess.run(probe, env=env, capture_output=True, timeout=300).returncode == 0


# pytest's own process sets them; its xdist workers inherit them (a variable left in a shell is not trusted).
if "PYTEST_XDIST_WORKER" not in os.environ or "OPD_JAX_TEST_XLA_FLAGS" not in os.environ:
  _flags = os.environ.get("XLA_FLAGS", "")
  if "xla_backend_optimization_level" not in _flags:
    _flags += " --xla_backend_optimization_level=0"
  if "xla_cpu_use_fusion_emitters" not in _flags and _xla_accepts(_EMITTERS):
    _flags += " " + _EMITTERS
  os.environ["OPD_JAX_TEST_XLA_FLAGS"] = _flags.strip()
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Commands the tests start begin with the glibc tunables launch/train.py would re-execute itself to add
# (opd_jax/train/malloc.py, train.malloc_huge_pages and malloc_keep_freed): the same process settings, without a
# second interpreter start and import (~2 s per command). tests/test_memory_plan.py tests the re-execution with
# its own environment.
os.environ.setdefault("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:"
                      "glibc.malloc.trim_threshold=1099511627776")

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

# One persistent compilation cache for the whole session: pytest's process makes the folder and removes it when
# the session ends; its xdist workers and every command a test starts inherit the variable and share it (a
# launch script reads OPD_JAX_COMPILATION_CACHE). The tests compile the same tiny programs many times over (the
# loop's evaluation samplers and teacher scoring in every train() call, pair1's smoke run in many commands); a
# cache hit returns the executable compiled for the same program and flags, so no number changes. Tests that
# measure a command as a user runs it set OPD_JAX_COMPILATION_CACHE=off for it. Nothing lands in $HOME.
_CACHE_VAR = "OPD_JAX_TEST_XLA_CACHE"
if _CACHE_VAR not in os.environ:
  os.environ[_CACHE_VAR] = tempfile.mkdtemp(prefix="opd_jax_test_xla_")
  atexit.register(shutil.rmtree, os.environ[_CACHE_VAR], ignore_errors=True)
os.environ.setdefault("OPD_JAX_COMPILATION_CACHE", os.environ[_CACHE_VAR])

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_compilation_cache_dir", os.environ[_CACHE_VAR])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)

from tests import checkpoints  # noqa: E402


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
  """{family: directory} of tiny random HF checkpoints, one per family, made with transformers."""
  root = tmp_path_factory.mktemp("tiny_ckpts")
  return {family: checkpoints.make_tiny_checkpoint(str(root / family), family) for family in checkpoints.FAMILIES}


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
  """{"teacher": dir, "student": dir}: random qwen3-family pair with the embedded tokenizer."""
  return checkpoints.make_tiny_pair(str(tmp_path_factory.mktemp("tiny_pair")))
