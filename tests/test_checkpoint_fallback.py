"""Damaged checkpoints fall back to the newest intact step; a target that does not fit is an error; one trainer
per workdir (WorkdirLock)."""

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opd_jax.errors import InputError
from opd_jax.train.checkpoint.manager import CheckpointMismatch, Checkpointer
from opd_jax.train.workdir_lock import WorkdirLock
from tests import checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = (1, 2, 3)


def _arrays(step: int, width: int = 1024):
  """A small train-state-like pytree whose values identify the step; snapshot versions come from meta.

  32 KiB of incompressible floats in `w`, so orbax writes it to a data file instead of inlining it.
  """
  return {"train": {"w": jnp.sin(jnp.arange(width * 8, dtype=jnp.float32)).reshape(width, 8) * step,
                    "step": jnp.asarray(step, jnp.int32)},
          "snapshots": {str(step - 1): {"w": jnp.full((width, 8), step - 1, jnp.float32)}}}


def _make_abstract(width: int = 1024):
  def make(meta):
    versions = meta["snapshot_versions"]
    return {"train": {"w": jax.ShapeDtypeStruct((width, 8), jnp.float32),
                      "step": jax.ShapeDtypeStruct((), jnp.int32)},
            "snapshots": {str(v): {"w": jax.ShapeDtypeStruct((width, 8), jnp.float32)} for v in versions}}
  return make


def _save_three(directory) -> Checkpointer:
  checkpointer = Checkpointer(str(directory), keep=5)
  for step in STEPS:
    checkpointer.save(step, _arrays(step), {"step": step, "snapshot_versions": [step - 1]})
  checkpointer.wait()
  return checkpointer


def _assert_restores(checkpointer, step):
  restored = checkpointer.restore_latest_intact(_make_abstract())
  assert restored.step == step and restored.meta == {"step": step, "snapshot_versions": [step - 1]}
  jax.tree.map(np.testing.assert_array_equal, restored.arrays, _arrays(step))
  return restored


def _truncate_largest_data_file(step_dir):
  files = [f for f in glob.glob(os.path.join(step_dir, "arrays", "**", "*"), recursive=True) if os.path.isfile(f)]
  largest = max(files, key=os.path.getsize)
  with open(largest, "r+b") as f:
    f.truncate(os.path.getsize(largest) // 2)


def _overwrite(path, text):
  with open(path, "w") as f:
    f.write(text)


_CHANGED = "does not match its checksum in checksums.json (its bytes changed after the save)"
DAMAGES = {  # name: (damage the step directory, what the reason says with the checksum manifest, without it)
    "truncated data file": (_truncate_largest_data_file, _CHANGED, "OUT_OF_RANGE"),
    "bit flipped in a data file": (checkpoints.flip_a_bit_in_the_largest_array_file, _CHANGED, None),
    "_CHECKPOINT_METADATA deleted": (lambda step_dir: os.remove(os.path.join(step_dir, "_CHECKPOINT_METADATA")),
                                     "_CHECKPOINT_METADATA is missing", "_CHECKPOINT_METADATA is missing"),
    "arrays/_METADATA deleted": (lambda step_dir: os.remove(os.path.join(step_dir, "arrays", "_METADATA")),
                                 "arrays/_METADATA is missing", "arrays/_METADATA is missing"),
    "arrays item deleted": (lambda step_dir: shutil.rmtree(os.path.join(step_dir, "arrays")), "arrays/ is missing",
                            "arrays/ is missing"),
    "meta item deleted": (lambda step_dir: shutil.rmtree(os.path.join(step_dir, "meta")), "meta/ is missing",
                          "meta/ is missing"),
    "meta is not JSON": (lambda step_dir: _overwrite(os.path.join(step_dir, "meta", "metadata"), '{"st'),
                         "meta/metadata " + _CHANGED, "meta: Unterminated string"),
    "a file added": (lambda step_dir: _overwrite(os.path.join(step_dir, "arrays", "stray"), "x"),
                     "arrays/stray is not in checksums.json", None),
    "checksums.json is not JSON": (lambda step_dir: _overwrite(os.path.join(step_dir, "checksums.json"), "{"),
                                   "checksums.json is unreadable (JSONDecodeError)", None),
}


def test_a_save_after_finish_save_does_not_report_that_wait_as_a_slow_save(tmp_path, monkeypatch, caplog):
  """orbax warns at a save when waiting for the previous one took over a second (here: over no time at all). The
  loop's own wait in finish_save() is not such a wait and is not reported; a save that waited in save() is."""
  import orbax.checkpoint.checkpoint_manager as orbax_manager
  monkeypatch.setattr(orbax_manager, "_WAIT_FOR_PREV_SAVE_WARNING_THRESHOLD_SECS", -1.0)
  checkpointer = Checkpointer(str(tmp_path), keep=5)

  def slow_save_warnings(step):
    caplog.clear()
    with caplog.at_level("WARNING", logger="absl"):
      checkpointer.save(step, _arrays(step), {"step": step, "snapshot_versions": [step - 1]})
    return [r for r in caplog.records if r.getMessage().startswith("Waiting for previous save to complete")]

  slow_save_warnings(1)
  assert len(slow_save_warnings(2)) == 1  # save() waited for step 1 itself: orbax's warning stands
  checkpointer.finish_save()
  assert slow_save_warnings(3) == []
  assert len(slow_save_warnings(4)) == 1  # only the save right after finish_save() is quiet
  checkpointer.close()
  assert checkpointer.latest_step() == 4


def test_every_saved_step_has_a_checksum_manifest_of_its_files(tmp_path):
  _save_three(tmp_path).close()
  for step in STEPS:
    with open(tmp_path / str(step) / "checksums.json") as f:
      listed = json.load(f)["sha256"]
    files = {os.path.relpath(p, tmp_path / str(step)) for p in glob.glob(str(tmp_path / str(step) / "**" / "*"),
                                                                          recursive=True) if os.path.isfile(p)}
    assert set(listed) == files - {"checksums.json"} and any(name.startswith("arrays/") for name in listed)


def test_without_the_manifest_a_flipped_bit_reads_back_as_other_numbers(tmp_path):
  """Why the manifest exists: orbax / zarr alone restore the damaged step, with a value or a few changed."""
  _save_three(tmp_path).close()
  os.remove(tmp_path / "3" / "checksums.json")
  checkpoints.flip_a_bit_in_the_largest_array_file(str(tmp_path / "3"))
  checkpointer = Checkpointer(str(tmp_path), keep=5)
  restored = checkpointer.restore_latest_intact(_make_abstract())
  assert restored.step == 3 and restored.skipped == []
  changed = sum(int((np.asarray(a) != np.asarray(b)).sum())
                for a, b in zip(jax.tree.leaves(restored.arrays), jax.tree.leaves(_arrays(3))))
  # A value or a few of the 8192: 1 in 65 of 80 tries, 2 in 14, 34 once (where the flip lands in zstd's stream
  # decides how far it spreads; which bytes sit mid-file varies from save to save).
  assert 1 <= changed <= 256
  checkpointer.close()


# orbax's abandoned reads of the damaged step raise again when collected, in pytest's process; the commands drop
# exactly those (opd_jax/train/checkpoint/quiet.py, tested below), pytest reports them as a warning: expected here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage,manifest", [(name, manifest) for name, (_, _, without) in DAMAGES.items()
                                             for manifest in (True, False) if manifest or without],
                         ids=lambda v: v if isinstance(v, str) else ("with manifest" if v else "without manifest"))
def test_damaged_newest_step_falls_back_to_previous(tmp_path, capfd, damage, manifest):
  damage_fn, reason_with, reason_without = DAMAGES[damage]
  reason = reason_with if manifest else reason_without
  _save_three(tmp_path).close()
  if not manifest:  # a step written before manifests were kept: orbax's own reads must catch the damage
    os.remove(tmp_path / "3" / "checksums.json")
  damage_fn(str(tmp_path / "3"))
  checkpointer = Checkpointer(str(tmp_path), keep=5)
  restored = _assert_restores(checkpointer, 2)
  assert [step for step, _ in restored.skipped] == [3] and reason in restored.skipped[0][1]
  warnings = [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning:")]
  assert len(warnings) == 1 and warnings[0].startswith(f"warning: checkpoint step 3 in {tmp_path} is unreadable (")
  assert "; falling back to step 2; moved it aside to 3.corrupt-" in warnings[0] and len(warnings[0]) < 600
  assert checkpointer.latest_step() == 2 and len(glob.glob(str(tmp_path / "3.corrupt-*"))) == 1

  checkpointer.save(3, _arrays(3), {"step": 3, "snapshot_versions": [2]})  # the run resumes and saves step 3
  checkpointer.close()
  reopened = Checkpointer(str(tmp_path), keep=5)
  assert reopened.latest_step() == 3 and _assert_restores(reopened, 3).skipped == []
  assert len(glob.glob(str(tmp_path / "3.corrupt-*"))) == 1  # kept for a look; orbax's tmp cleanup leaves it
  reopened.close()


def test_two_damaged_steps_fall_back_past_both(tmp_path):
  _save_three(tmp_path).close()
  _truncate_largest_data_file(str(tmp_path / "3"))
  shutil.rmtree(tmp_path / "2" / "meta")
  checkpointer = Checkpointer(str(tmp_path), keep=5)
  assert [step for step, _ in _assert_restores(checkpointer, 1).skipped] == [3, 2]
  assert checkpointer.latest_step() == 1
  checkpointer.close()


def test_every_step_damaged_is_one_line_error_and_moves_nothing(tmp_path):
  _save_three(tmp_path).close()
  for step in STEPS:
    _truncate_largest_data_file(str(tmp_path / str(step)))
  checkpointer = Checkpointer(str(tmp_path), keep=5)
  with pytest.raises(InputError, match=r"no checkpoint in .* reads back \(step 3: .*the 2 older steps are "
                                       r"unreadable too\); use a new --workdir, or delete") as error:
    checkpointer.restore_latest_intact(_make_abstract())
  assert "\n" not in str(error.value)
  assert sorted(os.listdir(tmp_path)) == ["1", "2", "3"]
  checkpointer.close()


def test_target_that_does_not_fit_is_an_error_not_a_fallback(tmp_path):
  _save_three(tmp_path).close()
  checkpointer = Checkpointer(str(tmp_path), keep=5)
  with pytest.raises(CheckpointMismatch, match=r"checkpoint step 3 in .* does not fit this run's state: "
                                               r"snapshots.2.w is float32\[1024, 8\] in the checkpoint but "
                                               r"float32\[1025, 8\] in this run \(and 1 more differences\)"):
    checkpointer.restore_latest_intact(_make_abstract(width=1025))

  def extra_leaf(meta):
    abstract = _make_abstract()(meta)
    abstract["train"]["bias"] = jax.ShapeDtypeStruct((8,), jnp.float32)
    return abstract
  with pytest.raises(CheckpointMismatch, match="train.bias is in this run but not in the checkpoint"):
    checkpointer.restore_latest_intact(extra_leaf)
  assert checkpointer.latest_step() == 3 and sorted(os.listdir(tmp_path)) == ["1", "2", "3"]
  checkpointer.close()


def test_leftover_tmp_folders_do_not_break_restore(tmp_path):
  _save_three(tmp_path).close()
  leftover = tmp_path / "4.orbax-checkpoint-tmp-1234567890"  # an interrupted save of step 4
  shutil.copytree(tmp_path / "3", leftover)
  _truncate_largest_data_file(str(leftover))
  checkpointer = Checkpointer(str(tmp_path), keep=5)
  assert checkpointer.latest_step() == 3 and _assert_restores(checkpointer, 3).skipped == []
  checkpointer.save(4, _arrays(4), {"step": 4, "snapshot_versions": [3]})
  checkpointer.close()
  assert not leftover.exists() and Checkpointer(str(tmp_path), keep=5).latest_step() == 4


def test_no_checkpoints_is_none(tmp_path):
  assert Checkpointer(str(tmp_path), keep=2).restore_latest_intact(_make_abstract()) is None


_HOLD = ("import sys, time; from opd_jax.train.workdir_lock import WorkdirLock; "
         "lock = WorkdirLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(60)")
_TRY = "import sys; from opd_jax.train.workdir_lock import WorkdirLock; WorkdirLock(sys.argv[1]).acquire()"


def _python(code, workdir, **kwargs):
  return subprocess.Popen([sys.executable, "-c", code, str(workdir)], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, **kwargs)


def test_second_trainer_on_a_live_workdir_fails_at_once(tmp_path):
  with WorkdirLock(str(tmp_path)):
    second = _python(_TRY, tmp_path)
    _, err = second.communicate(timeout=30)
  assert second.returncode != 0
  message = err.strip().splitlines()[-1]
  assert message.startswith(f"opd_jax.errors.InputError: workdir '{tmp_path}' is in use by pid {os.getpid()} on "
                            f"host {socket.gethostname()} (since ")
  assert message.endswith("); wait for it to finish or use another --workdir")
  with WorkdirLock(str(tmp_path)):  # released on exit: a later trainer takes it
    pass


def test_lock_of_a_killed_trainer_is_taken_over(tmp_path):
  holder = _python(_HOLD, tmp_path)
  assert holder.stdout.readline().strip() == "locked"
  with pytest.raises(InputError, match=f"in use by pid {holder.pid} on host"):
    WorkdirLock(str(tmp_path)).acquire()
  holder.send_signal(signal.SIGKILL)
  holder.wait(timeout=30)
  assert str(holder.pid) in (tmp_path / ".lock").read_text()  # the stale holder record is still there
  with WorkdirLock(str(tmp_path)):
    assert f'"pid": {os.getpid()}' in (tmp_path / ".lock").read_text()
  assert (tmp_path / ".lock").read_text() == ""


def test_disabled_lock_takes_nothing(tmp_path):
  with WorkdirLock(str(tmp_path), enabled=False), WorkdirLock(str(tmp_path)):
    pass


def test_workdir_that_is_a_file_is_one_line_error(tmp_path):
  (tmp_path / "run").write_text("")
  with pytest.raises(InputError, match=r"workdir '.*/run' is a file; pass a directory as --workdir"):
    WorkdirLock(str(tmp_path / "run")).acquire()



def test_abandoned_read_noise_is_dropped_and_nothing_else(caplog):
  """What orbax's abandoned reads of a damaged step leave behind, made for real: an asyncio task and a gather of
  a coroutine named like orbax's that failed and was never awaited (asyncio logs them when collected), and an
  "Event loop is closed" raised by a call into a closed loop, reported through sys.excepthook and through the
  unraisable hook. Once quieted (every command installs it, launch/_cli.py), all of those are dropped; the same
  failures from a user's coroutine, and any other exception, still reach the user."""
  import asyncio
  import gc
  from opd_jax.train.checkpoint import quiet

  async def async_deserialize():  # orbax's name (orbax/checkpoint/_src/serialization/serialization.py)
    raise ValueError("damaged chunk")

  async def user_coroutine():
    raise ValueError("a user's own failure")

  async def gathered(coroutine):
    asyncio.gather(coroutine())  # a gather whose failure nobody retrieves, as orbax's abandoned reads
    await asyncio.sleep(0.01)

  def collect_failed_task(coroutine):
    loop = asyncio.new_event_loop()
    task = loop.create_task(coroutine())
    loop.run_until_complete(asyncio.sleep(0.01))
    loop.run_until_complete(gathered(coroutine))
    loop.close()
    del task
    gc.collect()

  closed = asyncio.new_event_loop()
  closed.close()
  with pytest.raises(RuntimeError, match="Event loop is closed") as raised:
    closed.call_soon_threadsafe(print)  # what a tensorstore callback does after orbax closed its loop
  closed_loop, other = raised.value, RuntimeError("something else")

  seen_unraisable, seen_except = [], []
  previous = sys.unraisablehook, sys.excepthook
  sys.unraisablehook = seen_unraisable.append
  sys.excepthook = lambda kind, value, traceback: seen_except.append(value)
  try:
    quiet.install()
    with caplog.at_level("ERROR", logger="asyncio"):
      collect_failed_task(async_deserialize)
      collect_failed_task(user_coroutine)
    for error in (closed_loop, other):
      sys.excepthook(type(error), error, error.__traceback__)
      sys.unraisablehook(type("Unraisable", (), {"object": None, "exc_value": error})())
  finally:
    sys.unraisablehook, sys.excepthook = previous
  messages = [record.getMessage().splitlines()[0] for record in caplog.records]
  assert sorted(messages) == ["Task exception was never retrieved", "_GatheringFuture exception was never "
                              "retrieved"], messages  # the user's own: the orbax-named ones are dropped
  assert [str(r.exc_info[1]) for r in caplog.records] == ["a user's own failure"] * 2
  assert seen_except == [other] and [u.exc_value for u in seen_unraisable] == [other]


def test_orbax_missing_metadata_line_is_dropped_and_nothing_else(caplog):
  """orbax logs "Metadata file does not exist: .../_CHECKPOINT_METADATA" (absl, WARNING) for a damaged step while it
  lists the steps, before the manager's own warning or error names that step; the quieting drops exactly that."""
  import logging
  from opd_jax.train.checkpoint import quiet
  quiet.install()
  absl_logger = logging.getLogger("absl")
  with caplog.at_level("WARNING", logger="absl"):
    absl_logger.warning("Metadata file does not exist: /w/checkpoints/6/_CHECKPOINT_METADATA")
    absl_logger.warning("Metadata file does not exist: /w/something/else.json")
    absl_logger.warning("a step is slow to save")
  assert [r.getMessage() for r in caplog.records] == ["Metadata file does not exist: /w/something/else.json",
                                                      "a step is slow to save"]


def test_processes_that_list_different_steps_stop_with_one_line(tmp_path, monkeypatch):
  """What two processes whose workdir is not one shared filesystem see (process 1 lists step 3 only)."""
  from opd_jax.train.checkpoint import agreement
  monkeypatch.setattr(agreement.jax, "process_count", lambda: 2)
  monkeypatch.setattr(agreement, "gather_texts", lambda text: [text, "3"])
  agreement.check_same_listing([3], str(tmp_path))  # the same steps: nothing to say
  with pytest.raises(InputError, match=r"the processes of this run see different checkpoint steps in .* "
                                       r"\(process 0: \[3,2,1\]; process 1: \[3\]\); give every process the same "
                                       r"workdir on a shared filesystem") as error:
    agreement.check_same_listing([3, 2, 1], str(tmp_path))
  assert "\n" not in str(error.value)


def test_processes_decide_each_step_by_the_worst_finding(monkeypatch):
  """A step one process finds damaged is damaged for all, with that process's reason; a mismatch outranks it."""
  from opd_jax.train.checkpoint import agreement
  monkeypatch.setattr(agreement.jax, "process_count", lambda: 3)
  monkeypatch.setattr(agreement, "gather_texts", lambda text: [text, "1 arrays/d/x changed", "0 "])
  assert agreement.agree(0, "", "arrays") == (1, "on process 1: arrays/d/x changed", None)
  assert agreement.agree(1, "meta/ is missing", None) == (1, "meta/ is missing", None)  # its own reason
  monkeypatch.setattr(agreement, "gather_texts", lambda text: [text, "1 x", "2 does not fit"])
  assert agreement.agree(0, "", "arrays") == (2, "on process 2: does not fit", None)
