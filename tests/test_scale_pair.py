"""The real-vocabulary scale pair (opd_jax/bench/scale_pair.py), built small: tokenizer, chat template, loading."""

import json
import os

import jax.numpy as jnp
import pytest

from configs import common
from opd_jax.bench.scale_pair import (ENDOFTEXT, IM_END, IM_START, MAX_PROMPT_TOKENS, SCALE_TASK,
                                         build_scale_pair, special_token_ids)
from opd_jax.data.problems import load_jsonl
from opd_jax.models import load_pretrained, load_tokenizer, read_hf_config
from opd_jax.models.tokenizer import encode_prompt
from opd_jax.train.data import PromptPipeline
from opd_jax.spec import RunSpec

VOCAB = 4096


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory):
  return build_scale_pair(str(tmp_path_factory.mktemp("scale_pair")), vocab_size=VOCAB, teacher_layers=1,
                          student_layers=1, train_problems=64, heldout_problems=16)


def test_tokenizer_has_exactly_vocab_size_tokens_and_qwen_specials(small_pair):
  tokenizer = load_tokenizer(small_pair["student"])
  assert len(tokenizer) == VOCAB
  ids = special_token_ids(VOCAB)
  assert tokenizer.convert_tokens_to_ids([ENDOFTEXT, IM_START, IM_END]) == [ids[ENDOFTEXT], ids[IM_START], ids[IM_END]]
  assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (ids[IM_END], ids[ENDOFTEXT])
  assert special_token_ids(151_936) == {ENDOFTEXT: 151_643, IM_START: 151_644, IM_END: 151_645}  # Qwen3's ids


def test_chat_template_renders_and_prompts_round_trip(small_pair):
  tokenizer = load_tokenizer(small_pair["teacher"])
  problems = load_jsonl(small_pair["train_file"])
  assert len(problems) == 64 and len(load_jsonl(small_pair["heldout_file"])) == 16
  for problem in problems:
    plain = encode_prompt(tokenizer, problem.prompt, use_chat_template=False)
    assert tokenizer.decode(plain) == problem.prompt
    chat = encode_prompt(tokenizer, problem.prompt, use_chat_template=True)
    assert tokenizer.decode(chat) == f"<|im_start|>user\n{problem.prompt}<|im_end|>\n<|im_start|>assistant\n"
    assert 20 <= len(chat) <= MAX_PROMPT_TOKENS
  assert SCALE_TASK.max_prompt_chars() + 1 + 19 <= MAX_PROMPT_TOKENS  # the longest possible prompt fits too


@pytest.mark.slow  # the fast tier keeps the pair build checks; this one loads and runs both models
def test_models_load_with_pair_eos_and_produce_vocab_logits(small_pair):
  ids = special_token_ids(VOCAB)
  for role, tied in (("teacher", False), ("student", True)):
    config = read_hf_config(small_pair[role])
    assert config.vocab_size == VOCAB and config.tie_word_embeddings == tied
    assert config.eos_token_id == (ids[IM_END], ids[ENDOFTEXT]) and config.pad_token_id == ids[ENDOFTEXT]
    with open(os.path.join(small_pair[role], "config.json")) as f:
      assert json.load(f)["dtype"] == "float32"
    model = load_pretrained(small_pair[role])
    tokens = jnp.asarray([encode_prompt(load_tokenizer(small_pair[role]), "12+3-4\n", True)], jnp.int32)
    logits = model(tokens)
    assert logits.shape == (1, tokens.shape[1], VOCAB)
    assert bool(jnp.isfinite(logits).all())


def test_train_config_accepts_the_pair(small_pair):
  config = common.pair_config("pair1", None)
  config.teacher, config.student = small_pair["teacher"], small_pair["student"]
  config.data.source, config.data.use_chat_template = "jsonl", True
  config.data.train_file, config.data.heldout_file = small_pair["train_file"], small_pair["heldout_file"]
  config.data.max_prompt_tokens, config.train.batch_size = MAX_PROMPT_TOKENS, 8
  RunSpec.from_config(config, device_count=8)
  tokenizer = load_tokenizer(small_pair["student"])
  batch = next(PromptPipeline(load_jsonl(small_pair["train_file"]), tokenizer, batch_size=8,
                              max_prompt_tokens=MAX_PROMPT_TOKENS, seed=0, use_chat_template=True))
  assert batch["prompt_BxP"].shape == (8, MAX_PROMPT_TOKENS)
  assert (batch["prompt_BxP"][:, -1] == tokenizer.convert_tokens_to_ids("\n")).all()  # "assistant\n" ends it
  problems = load_jsonl(small_pair["train_file"])
  based = next(PromptPipeline(problems, tokenizer, batch_size=8, max_prompt_tokens=MAX_PROMPT_TOKENS, seed=0,
                              prompt_format="Q: {prompt}A:"))  # data.prompt_format: a base student's template
  for row, valid, index in zip(based["prompt_BxP"], based["prompt_valid_BxP"], based["index_B"]):
    assert tokenizer.decode(row[valid].tolist()) == f"Q: {problems[index].prompt}A:"


def test_shaped_pair_takes_depth_width_heads_and_tying_from_the_shape(tmp_path, monkeypatch):
  """build_shaped_pair (the GPU check's real-size pair) copies every dimension of the shipped shape; here two
  small qwen3 shapes stand in for Qwen3-1.7B / -0.6B so the test builds in seconds."""
  from opd_jax.bench import scale_pair
  from opd_jax.models import shapes

  small = {"teacher-shape": dict(hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                 head_dim=48, intermediate_size=320, tie_word_embeddings=False),
           "student-shape": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                 head_dim=40, intermediate_size=96, tie_word_embeddings=True)}
  monkeypatch.setattr(shapes, "hf_dict", lambda name: {"model_type": "qwen3", "vocab_size": VOCAB, **small[name]})
  paths = scale_pair.build_shaped_pair(str(tmp_path), "teacher-shape", "student-shape", train_problems=8,
                                       heldout_problems=4)
  for role, name in (("teacher", "teacher-shape"), ("student", "student-shape")):
    stored = json.load(open(os.path.join(paths[role], "config.json")))
    assert {k: stored[k] for k in small[name]} == small[name]
    assert stored["vocab_size"] == VOCAB and stored["dtype"] == "bfloat16"
    model = load_pretrained(paths[role], jnp.float32)
    assert {k: getattr(model.config, k) for k in small[name]} == small[name]  # and as opd_jax reads it back
    assert len(load_tokenizer(paths[role])) == VOCAB


def test_shaped_pair_refuses_a_shape_it_cannot_build(tmp_path):
  from opd_jax.bench.scale_pair import build_shaped_pair
  from opd_jax.errors import InputError
  with pytest.raises(InputError, match="'llama-3.1-8b' is a 'llama' shape"):
    build_shaped_pair(str(tmp_path), "llama-3.1-8b", "qwen3-0.6b")
  with pytest.raises(InputError, match="not a shipped model shape"):
    build_shaped_pair(str(tmp_path), "qwen3-99b", "qwen3-0.6b")


def _real_config(name: str, arg: str):
  import importlib
  return importlib.import_module(f"configs.real.{name}").get_config(arg)


def test_every_shipped_real_config_has_a_one_device_smoke_form(small_pair):
  """`smoke` keeps each real config's model settings and shrinks shapes and the mesh to one device; the result
  passes the loop's own config check on one device."""
  import glob
  p = small_pair
  names = sorted(os.path.basename(f)[:-3] for f in glob.glob(os.path.join(
      os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "real", "qwen3_*.py")))
  assert names == ["qwen3_1p7b_to_0p6b", "qwen3_8b_to_1p7b"]
  for name in names:
    arg = f"teacher={p['teacher']},student={p['student']},train_file={p['train_file']},heldout_file={p['heldout_file']}"
    full, smoke = _real_config(name, arg), _real_config(name, arg + ",smoke")
    assert (smoke.mesh.fsdp, smoke.mesh.tensor, smoke.rollout.tensor_parallel) == (1, 1, 1)
    assert smoke.train.batch_size < full.train.batch_size and smoke.train.steps < full.train.steps
    for field in ("student_compute_dtype", "teacher_param_dtype", "objective", "model"):
      assert smoke[field] == full[field], field
    RunSpec.from_config(smoke, device_count=1)


@pytest.mark.slow
def test_the_real_config_smoke_runs_on_cpu(small_pair, tmp_path):
  """`:...,smoke` runs the shipped real config end to end on one CPU device with the user's checkpoints (here the
  small Qwen3-shaped pair): bf16 compute, the real objective and attention, 3 steps, an evaluation, an export."""
  import subprocess
  import sys
  name, p = "qwen3_1p7b_to_0p6b", small_pair
  workdir = tmp_path / "run"
  result = subprocess.run(
      [sys.executable, "launch/train.py",
       f"--config=configs/real/{name}.py:teacher={p['teacher']},student={p['student']},"
       f"train_file={p['train_file']},heldout_file={p['heldout_file']},smoke", f"--workdir={workdir}",
       "--config.train.progress_bar=False"],
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), capture_output=True, text=True, timeout=600,
      env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""})
  assert result.returncode == 0, result.stderr[-3000:]
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 3]
  assert all(r["response_tokens"] > 0 for r in rows if "loss" in r) and (workdir / "export").is_dir()
