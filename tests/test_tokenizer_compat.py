"""Tokenizer compatibility of a teacher/student pair, vocabulary slicing, counted prompt truncation, and the
character tokenizer's refusal of characters it lacks."""

import dataclasses
import json
import os
import shutil
import time

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from opd_jax.data.batching import encode_prompts, encode_solutions
from opd_jax.data.char_tokenizer import build_char_tokenizer, check_text
from opd_jax.data.task import Problem
from opd_jax.models import Decoder, ModelConfig, load_pretrained, load_tokenizer, read_hf_config, save_pretrained
from opd_jax.models.tokenizer_compat import _compare, _Summary, check_pair
from opd_jax.train.data import PromptPipeline


def _configs(paths):
  return read_hf_config(paths["teacher"]), read_hf_config(paths["student"])


def _copy_model(src, dst, tokenizer=True):
  """A copy of checkpoint `src` at `dst`, with or without its tokenizer files."""
  shutil.copytree(src, dst, ignore=None if tokenizer else shutil.ignore_patterns("tokenizer*"))
  return str(dst)


def _edit_tokenizer_json(path, edit):
  file = os.path.join(path, "tokenizer.json")
  with open(file) as f:
    data = json.load(f)
  edit(data)
  with open(file, "w") as f:
    json.dump(data, f)


def _save_padded(path, vocab_size, tied, seed=3):
  config = ModelConfig(model_type="qwen3", vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                       tie_word_embeddings=tied, eos_token_id=(1,), pad_token_id=0)
  save_pretrained(Decoder(config, rngs=nnx.Rngs(seed)), str(path))
  build_char_tokenizer(str(path))
  return str(path)


def test_same_tokenizer_passes(tiny_pair):
  pair = check_pair(tiny_pair["teacher"], tiny_pair["student"], *_configs(tiny_pair))
  assert (pair.vocab_size, pair.tokenizer_size, pair.tokenizers_compared) == (32, 18, True)
  assert pair.slice_to("teacher") is None and pair.slice_to("student") is None
  with_dir = check_pair(tiny_pair["teacher"], tiny_pair["student"], *_configs(tiny_pair),
                        tokenizer_dir=tiny_pair["student"])
  assert with_dir == pair


def test_swapped_ids_fail_naming_the_tokens(tiny_pair, tmp_path):
  teacher = _copy_model(tiny_pair["teacher"], tmp_path / "teacher")

  def swap(data):
    vocab = data["model"]["vocab"]
    vocab["1"], vocab["2"] = vocab["2"], vocab["1"]
  _edit_tokenizer_json(teacher, swap)
  with pytest.raises(ValueError, match=r"give 2 of 18 tokens different ids \('1': teacher 4, student 3; "
                                       r"'2': teacher 3, student 4\).*shares a tokenizer"):
    check_pair(teacher, tiny_pair["student"], *_configs(tiny_pair))
  # The same teacher against a separate data tokenizer dir that matches the student: still caught.
  tokenizer_dir = tmp_path / "tok"
  build_char_tokenizer(str(tokenizer_dir))
  with pytest.raises(ValueError, match=r"'1': teacher 4, tokenizer 3"):
    check_pair(teacher, tiny_pair["student"], *_configs(tiny_pair), tokenizer_dir=str(tokenizer_dir))


def test_different_special_tokens_fail(tiny_pair, tmp_path):
  teacher = _copy_model(tiny_pair["teacher"], tmp_path / "teacher")
  config_file = os.path.join(teacher, "tokenizer_config.json")
  with open(config_file) as f:
    config = json.load(f)
  config["eos_token"] = "#"
  with open(config_file, "w") as f:
    json.dump(config, f)
  with pytest.raises(ValueError, match=r"different special tokens: eos_token teacher '#' \(15\), "
                                       r"student '<eos>' \(1\)"):
    check_pair(teacher, tiny_pair["student"], *_configs(tiny_pair))
  teacher = _copy_model(tiny_pair["teacher"], tmp_path / "teacher_added")  # '#' made special, same id
  _edit_tokenizer_json(teacher, lambda data: data["added_tokens"].append(
      {**data["added_tokens"][0], "id": 15, "content": "#"}))
  with pytest.raises(ValueError, match=r"different added special tokens \(only teacher: '#' \(15\); only "
                                       r"student: none\)"):
    check_pair(teacher, tiny_pair["student"], *_configs(tiny_pair))


def test_padded_teacher_is_accepted_and_sliced(tiny_pair, tmp_path):
  student_config = read_hf_config(tiny_pair["student"])
  tokens = jnp.asarray(np.random.RandomState(0).randint(0, 18, (2, 7)), jnp.int32)
  for tied in (False, True):
    teacher = _save_padded(tmp_path / f"padded_{tied}", 40, tied)
    pair = check_pair(teacher, tiny_pair["student"], read_hf_config(teacher), student_config)
    assert (pair.vocab_size, pair.teacher_vocab_size, pair.student_vocab_size) == (32, 40, 32)
    assert pair.slice_to("teacher") == 32 and pair.slice_to("student") is None
    full = load_pretrained(teacher)
    sliced = load_pretrained(teacher, vocab_size=pair.slice_to("teacher"))
    assert sliced.config.vocab_size == 32 and sliced.embed_tokens.embedding.get_value().shape == (32, 64)
    np.testing.assert_allclose(np.asarray(sliced(tokens)), np.asarray(full(tokens))[..., :32], atol=1e-6)
  with pytest.raises(ValueError, match="vocab_size=41 cannot slice checkpoint .*whose vocab_size is 40"):
    load_pretrained(teacher, vocab_size=41)


def test_vocab_below_the_tokenizer_fails(tiny_pair):
  teacher, student = _configs(tiny_pair)
  with pytest.raises(ValueError, match=r"student vocab_size 16 is below the size of the tokenizer of student "
                                       r".*\(18, its max token id \+ 1\)"):
    check_pair(tiny_pair["teacher"], tiny_pair["student"], teacher, dataclasses.replace(student, vocab_size=16))


def test_no_tokenizer_files_falls_back_to_equal_vocab_sizes(tiny_pair, tmp_path):
  teacher = _copy_model(tiny_pair["teacher"], tmp_path / "teacher", tokenizer=False)
  pair = check_pair(teacher, tiny_pair["student"], *_configs(tiny_pair))
  assert pair.vocab_size == 32 and not pair.tokenizers_compared and pair.tokenizer_size == 18
  teacher_config, student_config = _configs(tiny_pair)
  with pytest.raises(ValueError, match=r"teacher vocab_size 40 != student vocab_size 32, and teacher .* has no "
                                       "tokenizer files"):
    check_pair(teacher, tiny_pair["student"], dataclasses.replace(teacher_config, vocab_size=40), student_config)


def test_comparison_is_fast_at_real_vocab_size():
  vocab = {f"tok{i}": i for i in range(151_665)}
  specials = {"bos_token": None, "eos_token": ("tok151643", 151643), "pad_token": None, "unk_token": None}
  reference = _Summary(vocab, specials, {151643: "tok151643"})
  start = time.perf_counter()
  _compare(reference, _Summary(dict(vocab), specials, {151643: "tok151643"}), "s", "t", "student", "teacher")
  swapped = dict(vocab, tok5=6, tok6=5)
  with pytest.raises(ValueError, match="'tok5': teacher 6, student 5"):
    _compare(reference, _Summary(swapped, specials, {151643: "tok151643"}), "s", "t", "student", "teacher")
  assert time.perf_counter() - start < 2.0


def test_truncation_is_counted_and_keeps_the_end(tmp_path):
  build_char_tokenizer(str(tmp_path))
  tokenizer = load_tokenizer(str(tmp_path))
  problems = [Problem("1+2\n", "3"), Problem("12+34+56\n", "102"), Problem("5\n", "5"), Problem("9-8-1-0\n", "0")]
  cut = []
  tokens, valid = encode_prompts(tokenizer, problems, 6, on_truncate=lambda i, n: cut.append((i, n)))
  assert cut == [(1, 9), (3, 8)]
  assert tokenizer.decode(list(tokens[1][valid[1]])) == "34+56\n"  # the end of the prompt is kept
  pipeline = PromptPipeline(problems, tokenizer, batch_size=2, max_prompt_tokens=6, seed=0)
  batches = [next(pipeline) for _ in range(4)]  # two passes over the four problems
  assert set(batches[0]) == {"prompt_BxP", "prompt_valid_BxP", "index_B"}
  assert (pipeline.truncated, pipeline.prompts_drawn) == (4, 8)


def test_char_tokenizer_rejects_unknown_characters(tmp_path):
  with pytest.raises(ValueError, match=r"^prompt 'x = 3 \+ \?' has characters outside the tokenizer's "
                                       r"vocabulary: 'x', '\?' \("):
    check_text("x = 3 + ?", "prompt")
  build_char_tokenizer(str(tmp_path))
  tokenizer = load_tokenizer(str(tmp_path))
  good, bad = Problem("1+2\n", "3", "1+2=3\n#### 3"), Problem("1*2\n", "2", "1*2=2\n#### 2")
  with pytest.raises(ValueError, match=r"prompt '1\*2\\n' has characters .*: '\*'"):
    encode_prompts(tokenizer, [good, bad], 8)
  with pytest.raises(ValueError, match=r"solution '1\*2=2\\n#### 2' has characters"):
    encode_solutions(tokenizer, [good, bad], 16)
  with pytest.raises(ValueError, match=r"training problem 1: prompt '1\*2\\n'"):
    PromptPipeline([good, bad], tokenizer, batch_size=1, max_prompt_tokens=8, seed=0)
