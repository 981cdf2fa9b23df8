"""Test setup: 8 simulated CPU devices (set before jax is imported), strict rank promotion, tiny HF checkpoints."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("OPD_JAX_COMPILATION_CACHE", "off")  # launch scripts in tests leave no cache in $HOME

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

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
