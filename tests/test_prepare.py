"""Layer pruning (opd_jax/prepare/prune.py), config-driven pair preparation, and the real-model config's whole
path (import -> prune -> OPD -> evaluation -> export) on a tiny GGUF written here."""

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from opd_jax.data.problems import load_jsonl
from opd_jax.errors import InputError
from opd_jax.models import load_pretrained, load_tokenizer, read_hf_config
from opd_jax.models.gguf_import import import_gguf
from opd_jax.prepare.prune import CalibrationSet, LayerScorer, choose_layers, prune, pruned_model
from tests.gguf_files import write_gemma3_gguf, write_gguf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAT_TRAIN = os.path.join(REPO, "opd_jax", "assets", "chat", "train.jsonl")
CAL = dict(max_prompt_tokens=24, max_new_tokens=8, use_chat_template=True, batch_size=4)


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("prepare")
  write_gguf(str(root / "t.gguf"), "llama")
  import_gguf(str(root / "t.gguf"), str(root / "teacher"))
  return str(root / "teacher")


def _tokens():
  return jnp.asarray(np.random.default_rng(0).integers(0, 200, (2, 12)))


@pytest.mark.parametrize("scan", [True, False])
def test_skipping_layers_equals_a_model_without_them(teacher_dir, scan):
  model = load_pretrained(teacher_dir, jnp.float32, scan_layers=scan)
  tokens = _tokens()
  full = model.hidden_states(tokens)
  np.testing.assert_array_equal(np.asarray(model.hidden_states(tokens, layer_keep_L=jnp.ones(3, bool))),
                                np.asarray(full))
  skipped = model.hidden_states(tokens, layer_keep_L=jnp.asarray([True, False, True]))
  small = pruned_model(model, [0, 2])
  assert small.config.num_hidden_layers == 2
  np.testing.assert_allclose(np.asarray(small.hidden_states(tokens)), np.asarray(skipped), atol=1e-6)
  assert float(jnp.max(jnp.abs(skipped - full))) > 1e-3  # the layer mattered


def test_greedy_choice_measures_every_remaining_layer(teacher_dir):
  model = load_pretrained(teacher_dir, jnp.float32)
  problems = load_jsonl(CHAT_TRAIN)[:4]
  calibration = CalibrationSet.make(model, load_tokenizer(teacher_dir), problems, **CAL)
  choice = choose_layers(model, calibration, keep_layers=1)
  assert len(choice["kept"]) == 1 and len(choice["dropped"]) == 2
  assert sorted(choice["kl_alone"]) == ["0", "1", "2"]
  first = choice["dropped"][0]
  assert first["kl_alone"] == min(choice["kl_alone"].values())  # round one drops the cheapest layer
  scorer = LayerScorer(model, calibration)
  keep = np.zeros(3, bool)
  keep[choice["kept"]] = True
  assert scorer(keep) == pytest.approx(choice["kl_to_source"], rel=1e-6)
  assert scorer(np.ones(3, bool)) == pytest.approx(0.0, abs=1e-6)
  one_shot = choose_layers(model, calibration, keep_layers=1, drops_per_round=5)
  assert len(one_shot["dropped"]) == 2 and one_shot["kl_alone"] == choice["kl_alone"]
  assert (choice["subsets_scored"], one_shot["subsets_scored"]) == (3 + 2, 3 + 1)  # rounds, plus one-shot's check


def test_prune_writes_a_model_and_is_idempotent(teacher_dir, tmp_path):
  problems = load_jsonl(CHAT_TRAIN)[:4]
  out = str(tmp_path / "student")
  report = prune(teacher_dir, out, 2, problems, **CAL, log=lambda m: None)
  assert not report["skipped"] and len(report["kept"]) == 2
  student, teacher = load_pretrained(out, jnp.float32), load_pretrained(teacher_dir, jnp.float32)
  keep = jnp.asarray([i in report["kept"] for i in range(3)])
  tokens = _tokens()
  np.testing.assert_allclose(np.asarray(student.hidden_states(tokens)),
                             np.asarray(teacher.hidden_states(tokens, layer_keep_L=keep)), atol=1e-6)
  assert load_tokenizer(out).chat_template == load_tokenizer(teacher_dir).chat_template
  with open(os.path.join(out, "prune.json")) as f:
    assert json.load(f)["kept"] == report["kept"]
  assert prune(teacher_dir, out, 2, problems, **CAL, log=lambda m: None)["skipped"]
  with pytest.raises(InputError, match="other settings"):
    prune(teacher_dir, out, 1, problems, **CAL, log=lambda m: None)
  for keep_layers in (0, 3):
    with pytest.raises(InputError, match="out of range"):
      prune(teacher_dir, str(tmp_path / "x"), keep_layers, problems, **CAL)
  assert sorted(os.listdir(tmp_path)) == ["student"]  # nothing half-written


@pytest.mark.slow
def test_real_model_config_runs_end_to_end_on_a_tiny_gguf(tmp_path):
  """configs/smollm2.py:runlocal, pointed at a tiny GGUF: prepares the pair, distills, evaluates the teacher and
  the student (teacher-forced KL, capitals accuracy), writes samples and exports; a rerun reuses the pair."""
  gguf_file = str(tmp_path / "tiny.gguf")
  write_gguf(gguf_file, "llama")
  models, workdir = str(tmp_path / "models"), str(tmp_path / "run")
  command = [sys.executable, "launch/train.py", "--config=configs/smollm2.py:runlocal,keep_layers=2",
             f"--workdir={workdir}", f"--config.prepare.gguf={gguf_file}", f"--config.prepare.dir={models}",
             "--config.prepare.prompts=4", "--config.prepare.max_new_tokens=8", "--config.prepare.max_prompt_tokens=48",
             "--config.data.max_prompt_tokens=48",
             "--config.rollout.max_new_tokens=8", "--config.train.progress_bar=False"]
  # The evaluation-only rerun compiles what the first run did: one compilation cache for the two.
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": os.environ["OPD_JAX_TEST_XLA_FLAGS"],  # as conftest.py
         "OPD_JAX_COMPILATION_CACHE": str(tmp_path / "xla")}
  result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "prepare: imported" in result.stderr and "prepare: student" in result.stderr
  assert sorted(os.listdir(models)) == ["smollm2-135m-instruct", "smollm2-135m-instruct-L2"]
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  first, last = rows[0], rows[-1]
  assert first["step"] == 0 and 0 <= first["eval/teacher_accuracy"] <= 1
  for row in (first, last):
    assert row["eval/teacher_forced_kl"] > 0 and row["eval/reverse_kl"] > 0 and 0 <= row["eval/accuracy"] <= 1
  samples = [json.loads(line) for line in open(os.path.join(workdir, "samples.jsonl"))]
  assert {(s["step"], s["model"]) for s in samples} == {(0, "teacher"), (0, "student"), (4, "student")}
  assert any("answer" in s for s in samples) and any("answer" not in s for s in samples)
  assert load_pretrained(os.path.join(workdir, "export")).config.num_hidden_layers == 2
  evaluate_only = tmp_path / "run2"  # train.steps=0: the step-0 evaluation of the prepared (reused) pair
  again = subprocess.run(command[:3] + [f"--workdir={evaluate_only}"] + command[4:] + ["--config.train.steps=0"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "prepare:" not in again.stderr and "exported" not in again.stdout
  rows = [json.loads(line) for line in open(evaluate_only / "metrics.jsonl")]
  assert len(rows) == 1
  assert rows[0]["eval/teacher_forced_kl"] == pytest.approx(first["eval/teacher_forced_kl"], rel=1e-6)
  assert not (evaluate_only / "export").exists()


def test_cross_family_config_runs_end_to_end_on_tiny_ggufs(tmp_path):
  """configs/gemma3_to_smollm2.py:runlocal, pointed at two tiny GGUFs of two families (a gemma3 teacher with a
  SentencePiece vocabulary, a llama student with byte-level BPE and ChatML): both imported by the prepare
  section, the student distilled across tokenizers, the held-out span KL measured before and after."""
  teacher_gguf, student_gguf = str(tmp_path / "teacher.gguf"), str(tmp_path / "student.gguf")
  write_gemma3_gguf(teacher_gguf)
  write_gguf(student_gguf, "llama")
  models, workdir = str(tmp_path / "models"), str(tmp_path / "run")
  command = [sys.executable, "launch/train.py", "--config=configs/gemma3_to_smollm2.py:runlocal",
             f"--workdir={workdir}", f"--config.prepare.gguf={teacher_gguf}",
             f"--config.prepare.student_gguf={student_gguf}", f"--config.prepare.dir={models}",
             "--config.cross_tokenizer.teacher_end=<eos>",  # the tiny vocabulary has no "\n\n" token
             "--config.cross_tokenizer.max_teacher_prompt_tokens=180",  # its few merges: about a token a character
             "--config.cross_tokenizer.max_teacher_response_tokens=48", "--config.train.progress_bar=False"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": os.environ["OPD_JAX_TEST_XLA_FLAGS"]}
  result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert sorted(os.listdir(models)) == ["gemma3-270m", "smollm2-135m-instruct"]
  assert read_hf_config(os.path.join(models, "gemma3-270m")).model_type == "gemma3_text"
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  evals = [r for r in rows if "eval/accuracy" in r]
  kls = [r["eval/span_reverse_kl"] for r in evals]  # before and after: finite, and the updates moved it
  assert len(kls) == 2 and all(np.isfinite(kl) and kl >= 0 for kl in kls) and kls[0] != kls[1], kls
  steps = [r for r in rows if "loss" in r]
  assert steps and all(0 < r["cross_tokenizer/token_share"] <= 1 for r in steps)


@pytest.mark.slow  # the other direction of the test above; the fast tier keeps that one
def test_base_student_config_runs_end_to_end_on_tiny_ggufs(tmp_path):
  """configs/smollm2_to_gemma3.py:runlocal on two tiny GGUFs: a llama teacher in its chat format (ChatML) teaches a
  gemma3 student prompted in a plain format of its own (data.prompt_format, rendered with Gemma's BOS), its answer
  ended at its first line (rollout.stop_text) and scored against the teacher's end of turn."""
  teacher_gguf, student_gguf = str(tmp_path / "teacher.gguf"), str(tmp_path / "student.gguf")
  write_gguf(teacher_gguf, "llama")
  write_gemma3_gguf(student_gguf)
  models, workdir = str(tmp_path / "models"), str(tmp_path / "run")
  command = [sys.executable, "launch/train.py", "--config=configs/smollm2_to_gemma3.py:runlocal",
             f"--workdir={workdir}", f"--config.prepare.gguf={teacher_gguf}",
             f"--config.prepare.student_gguf={student_gguf}", f"--config.prepare.dir={models}",
             "--config.data.max_prompt_tokens=48",  # the tiny vocabulary's few merges: about a token a character
             "--config.cross_tokenizer.max_teacher_prompt_tokens=180",  # ChatML, about a token a character
             "--config.cross_tokenizer.max_teacher_response_tokens=64", "--config.train.progress_bar=False"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": os.environ["OPD_JAX_TEST_XLA_FLAGS"]}
  result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert read_hf_config(os.path.join(models, "gemma3-270m")).model_type == "gemma3_text"
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["data"]["prompt_format"] == "{prompt}\n"
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  evals = [r for r in rows if "eval/accuracy" in r]
  kls = [r["eval/span_reverse_kl"] for r in evals]  # before and after: finite, and the updates moved it
  assert len(kls) == 2 and all(np.isfinite(kl) and kl >= 0 for kl in kls) and kls[0] != kls[1], kls
  steps = [r for r in rows if "loss" in r]
  assert steps and all(0 < r["cross_tokenizer/token_share"] <= 1 for r in steps)


def test_prepare_errors_before_writing_anything(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "OPD_JAX_COMPILATION_CACHE": "off"}
  result = subprocess.run([sys.executable, "launch/train.py", "--config=configs/smollm2.py:runlocal",
                           f"--workdir={tmp_path / 'run'}", "--config.prepare.gguf=no-such-package-opd",
                           f"--config.prepare.dir={tmp_path / 'models'}"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert result.returncode == 2 and len(errors) == 1 and "no-such-package-opd" in errors[0], result.stderr
  assert os.listdir(tmp_path) == []
