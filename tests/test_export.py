"""HF export of the trained student: round trip through transformers, the launch script's errors, sharded params."""

import os
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from configs import common
from opd_jax.models import layer_stack, load_pretrained, load_tokenizer
from opd_jax.models import sharding as shard_lib
from opd_jax.train import export
from opd_jax.train.loop import train
from tests import checkpoints

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_STEPS = 2


@pytest.fixture(scope="module")
def run(tiny_pair, tmp_path_factory):
  """A workdir of a real (tiny) training run with checkpoints at steps 1 and 2."""
  config = common.base_config("tiny")
  common.shrink_for_local_run(config)
  config.teacher, config.student = tiny_pair["teacher"], tiny_pair["student"]
  config.model.attention, config.model.scan_layers = "reference", False  # fastest compile on XLA:CPU
  config.rollout.max_new_tokens = 8
  config.optimizer.learning_rate, config.optimizer.warmup_steps = 1e-2, 0
  t = config.train
  t.steps, t.checkpoint_every, t.keep_checkpoints, t.batch_size = TRAIN_STEPS, 1, 2, 8
  t.eval_size, t.eval_batch_size, t.eval_sampled, t.progress_bar = 8, 8, False, False
  workdir = str(tmp_path_factory.mktemp("export_run"))
  train(config, workdir)
  return workdir


def _export_script(*args):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": os.environ["OPD_JAX_TEST_XLA_FLAGS"]}
  return subprocess.run([sys.executable, "launch/export.py", *args], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=300)


def _leftovers(parent):
  return [f for f in os.listdir(parent) if f.startswith(".")]


@pytest.mark.slow
def test_export_round_trip_matches_transformers(run, tiny_pair, tmp_path):
  out = str(tmp_path / "export")
  result = _export_script(f"--workdir={run}", f"--out={out}")
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip().splitlines()[-1] == f"exported step {TRAIN_STEPS} to {out}"
  assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
          "tokenizer_config.json"} <= set(os.listdir(out))
  assert not _leftovers(tmp_path)

  graphdef, params = export.restore_params(run)  # the latest step
  initial = {p: np.asarray(v) for p, v in layer_stack.per_layer_flat(nnx.state(load_pretrained(
      tiny_pair["student"]), nnx.Param))}  # stacked storage, compared layer by layer with the run's per-layer one
  trained = {p: np.asarray(v) for p, v in layer_stack.per_layer_flat(params)}
  assert initial.keys() == trained.keys()
  assert max(float(np.abs(trained[p] - initial[p]).max()) for p in trained) > 1e-4, "training changed nothing"

  tokens = np.random.RandomState(0).randint(0, 32, (3, 9))
  with torch.no_grad():
    torch_logits = checkpoints.load_torch(out)(torch.tensor(tokens)).logits.numpy()
  jax_logits = np.asarray(nnx.merge(graphdef, params)(jnp.asarray(tokens)))
  np.testing.assert_allclose(torch_logits, jax_logits, atol=1e-4, rtol=0)

  from transformers import AutoTokenizer
  text = "12+3=15"
  want = load_tokenizer(tiny_pair["student"]).encode(text, add_special_tokens=False)
  assert load_tokenizer(out).encode(text, add_special_tokens=False) == want
  assert AutoTokenizer.from_pretrained(out, local_files_only=True).encode(text, add_special_tokens=False) == want


@pytest.mark.slow
def test_bad_step_is_one_error_line_and_leaves_nothing(run, tmp_path):
  out = tmp_path / "export"
  result = _export_script(f"--workdir={run}", f"--out={out}", "--step=7")
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
  assert "step 7" in lines[0] and "1, 2" in lines[0]
  assert not os.listdir(tmp_path)


def test_a_damaged_checkpoint_is_one_error_naming_the_other_steps(run, tmp_path):
  import shutil
  from tests.test_train import _damage_arrays
  copy = str(tmp_path / "run")
  shutil.copytree(run, copy)
  _damage_arrays(os.path.join(copy, "checkpoints"), 2)
  with pytest.raises(ValueError, match=r"checkpoint step 2 in .* is damaged \(.*\); export another --step \(1\)"):
    export.restore_params(copy, 2)
  export.restore_params(copy, 1)  # the intact one still exports


def test_workdir_errors(tmp_path):
  with pytest.raises(ValueError, match="does not exist"):
    export.resolve_step(str(tmp_path / "missing"))
  with pytest.raises(ValueError, match="no checkpoints"):
    export.resolve_step(str(tmp_path))
  assert not os.path.exists(tmp_path / "checkpoints")
  for text, detail in (('{"pair": "pair1", "teacher": ', "Expecting value"), ('{"pair": "pair1"}', "no field")):
    (tmp_path / "config.json").write_text(text)  # cut short; a config of something else
    with pytest.raises(ValueError, match=f"is not a launch/train.py run's config \\({detail}"):
      export.read_run_pair(str(tmp_path))


@pytest.mark.slow
def test_sharded_params_export_identical_files(run, tmp_path):
  """Params over 8 devices (fsdp) and on one device write the same bytes; a rerun replaces the old export."""
  graphdef, params = export.restore_params(run, step=1)
  config = export.read_run_pair(run)
  mesh = shard_lib.make_mesh(1, 8, 1)
  sharded = jax.device_put(params, shard_lib.state_shardings(params, mesh))
  assert any(len(v.sharding.device_set) == 8 and not v.sharding.is_fully_replicated for v in jax.tree.leaves(sharded))
  local = jax.device_put(params, jax.devices()[0])
  one, eight = str(tmp_path / "one"), str(tmp_path / "eight")
  os.makedirs(eight)
  open(os.path.join(eight, "stale.safetensors"), "w").close()
  for out, state in ((one, local), (eight, sharded)):
    assert export.export_student(graphdef, state, config.student, out, max_shard_bytes=1 << 14) == out
  assert sorted(os.listdir(one)) == sorted(os.listdir(eight))  # the stale file went with the old dir
  assert "model.safetensors.index.json" in os.listdir(one)  # max_shard_bytes split the tensors
  for file in os.listdir(one):
    with open(os.path.join(one, file), "rb") as a, open(os.path.join(eight, file), "rb") as b:
      assert a.read() == b.read(), file
  reloaded = nnx.state(load_pretrained(eight), nnx.Param)
  for (path, got), (_, want) in zip(layer_stack.per_layer_flat(reloaded), layer_stack.per_layer_flat(params)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=str(path))
  assert not _leftovers(tmp_path)


@pytest.mark.slow
def test_bfloat16_export_and_failed_export_keeps_old(run, tmp_path, monkeypatch):
  graphdef, params = export.restore_params(run)
  student = export.read_run_pair(run).student
  out = str(tmp_path / "export")
  export.export_student(graphdef, params, student, out, dtype="bfloat16")
  reloaded = nnx.state(load_pretrained(out, "bfloat16"), nnx.Param)
  for (_, got), (_, want) in zip(layer_stack.per_layer_flat(reloaded), layer_stack.per_layer_flat(params)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want.astype(jnp.bfloat16)))
  before = {f: open(os.path.join(out, f), "rb").read() for f in os.listdir(out)}

  def fail(*args):
    raise OSError("disk full")

  monkeypatch.setattr(export, "_gather", fail)
  with pytest.raises(OSError, match="disk full"):
    export.export_student(graphdef, params, student, out)
  assert {f: open(os.path.join(out, f), "rb").read() for f in os.listdir(out)} == before
  assert not _leftovers(tmp_path)
  with pytest.raises(ValueError, match="is the student"):
    export.export_student(graphdef, params, student, student)
  # an out dir that is the run (or any non-empty folder that is not an export) would be replaced whole: refused
  listing = sorted(os.listdir(run))
  for target in (run, os.path.dirname(run)):
    with pytest.raises(ValueError, match="is a non-empty directory that is not an export"):
      export.export_student(graphdef, params, student, target)
  # from a workdir, the out dir is refused before the checkpoint is read
  monkeypatch.setattr(export, "restore_params", lambda *a, **k: pytest.fail("read the checkpoint before refusing"))
  with pytest.raises(ValueError, match="is a non-empty directory that is not an export"):
    export.export_from_workdir(run, run)
  assert sorted(os.listdir(run)) == listing


_WORKER = """
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"
from opd_jax.train import distributed, export
distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))
import jax
_, params = export.restore_params(sys.argv[3])
partial = sum(not leaf.is_fully_addressable for leaf in jax.tree.leaves(params))
export.export_from_workdir(sys.argv[3], sys.argv[4])
print(f"processes={jax.process_count()} devices={jax.device_count()} not_fully_addressable={partial}")
"""


@pytest.mark.slow
def test_two_processes_export_like_one(run, tmp_path):
  """Two processes (2 devices each) gather each tensor across processes; process 0 writes the same bytes."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  two = str(tmp_path / "two")
  workers = [subprocess.Popen([sys.executable, "-c", _WORKER, f"localhost:{port}", str(i), run, two], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
  one = export.export_from_workdir(run, str(tmp_path / "one"))
  for worker in workers:
    output, _ = worker.communicate(timeout=300)
    assert worker.returncode == 0, output[-3000:]
    last = output.strip().splitlines()[-1]
    assert last.startswith("processes=2 devices=4 not_fully_addressable=") and not last.endswith("=0"), last
  assert sorted(os.listdir(one)) == sorted(os.listdir(two))
  for file in os.listdir(one):
    with open(os.path.join(one, file), "rb") as a, open(os.path.join(two, file), "rb") as b:
      assert a.read() == b.read(), file
  assert not _leftovers(tmp_path)
