"""Run identity (opd_jax/experiments/run_identity.py): the hash changes with the config, the seed and the code,
not with the checkout's location; the code version says when the package has uncommitted changes; sweep rows
carry both."""

import os
import subprocess

import ml_collections

from opd_jax.experiments.files import read_jsonl
from opd_jax.experiments.run_identity import code_version, run_id
from opd_jax.experiments.sweep import run_sweep

CONFIG = {"pair": "pair1", "teacher": "/repo/opd_jax/assets/pair1/teacher", "rollout": {"noise_sigma": 0.1},
          "train": {"steps": 150}}


def test_the_run_id_changes_with_config_seed_and_code_only():
  same = run_id(CONFIG, 3, "abc", root="/repo")
  assert same == run_id({**CONFIG}, 3, "abc", root="/repo") and len(same) == 64
  assert run_id(CONFIG, 4, "abc", root="/repo") != same
  assert run_id(CONFIG, 3, "abc+dirty", root="/repo") != same
  assert run_id({**CONFIG, "rollout": {"noise_sigma": 0.11}}, 3, "abc", root="/repo") != same
  assert run_id({**CONFIG, "train": {"steps": 151}}, 3, "abc", root="/repo") != same
  moved = {**CONFIG, "teacher": "/elsewhere/opd_jax/assets/pair1/teacher"}
  assert run_id(moved, 3, "abc", root="/elsewhere") == same  # the same run in another checkout
  assert run_id(moved, 3, "abc", root="/repo") != same  # a path outside the repo is kept as given


def _git(root, *args):
  subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                 env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                      "GIT_COMMITTER_EMAIL": "t@t"})


def test_the_code_version_is_the_commit_and_dirty_when_the_package_changed(tmp_path):
  assert code_version(str(tmp_path)) == "unknown"
  (tmp_path / "opd_jax").mkdir()
  (tmp_path / "opd_jax" / "a.py").write_text("x = 1\n")
  (tmp_path / "README.md").write_text("r\n")
  _git(tmp_path, "init", "-q")
  _git(tmp_path, "add", ".")
  _git(tmp_path, "commit", "-q", "-m", "c")
  head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                        text=True).stdout.strip()
  assert code_version(str(tmp_path)) == head and len(head) == 12
  (tmp_path / "README.md").write_text("changed outside the package\n")
  assert code_version(str(tmp_path)) == head
  (tmp_path / "opd_jax" / "a.py").write_text("x = 2\n")
  assert code_version(str(tmp_path)) == head + "+dirty"


def _sweep():
  c = ml_collections.ConfigDict()
  c.name, c.pairs, c.base_overrides = "toy", ("pair1",), (("train.steps", 3),)
  c.points = (("baseline", ()), ("noise", (("rollout.noise_sigma", 0.1),)))
  return c


def _config(pair):
  return ml_collections.ConfigDict({"pair": pair, "seed": 3, "optimizer": {"learning_rate": 1e-3},
                                    "train": {"steps": 10, "progress_bar": True, "resume": False, "mode": "sync"},
                                    "rollout": {"noise_sigma": 0.0}, "objective": {"name": "reverse_kl"}})


def _train(config, workdir):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.write('{"step": 0, "eval/accuracy": 0.3}\n{"step": 3, "loss": 1.0, "mismatch/k3": 0.01}\n'
            '{"step": 3, "eval/accuracy": 0.5}\n')


def test_sweep_rows_record_their_run_identity(tmp_path):
  run_sweep(_sweep(), str(tmp_path), _config, _train, log=lambda *_: None)
  rows = {r["point"]: r for r in read_jsonl(os.path.join(tmp_path, "results.jsonl"))}
  version = code_version()
  assert {r["code_version"] for r in rows.values()} == {version}
  base = _config("pair1")
  base.train.steps, base.train.progress_bar, base.train.resume = 3, False, True
  assert rows["baseline"]["run_id"] == run_id(base.to_dict(), 3, version)
  base.rollout.noise_sigma = 0.1
  assert rows["noise"]["run_id"] == run_id(base.to_dict(), 3, version) != rows["baseline"]["run_id"]
  assert rows["noise"]["run_id"] != run_id(base.to_dict(), 4, version)  # another seed is another run
