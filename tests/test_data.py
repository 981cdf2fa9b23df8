"""Embedded task generator, grader, JSONL problem sets and the character tokenizer."""

import json
import os

import numpy as np
import pytest

from opd_jax.data import ArithmeticTask, extract_answer, get_problems, gold_answer, is_correct, load_jsonl
from opd_jax.data.batching import decode_responses, encode_prompts, encode_solutions
from opd_jax.data.char_tokenizer import build_char_tokenizer, vocab_size
from opd_jax.models import load_tokenizer


def test_task_is_deterministic_and_splits_are_disjoint():
  task = ArithmeticTask()
  train = task.problems("train", 3000, seed=0)
  assert [p.prompt for p in train[:50]] == [p.prompt for p in task.problems("train", 50, seed=0)]
  assert [p.prompt for p in train[:50]] != [p.prompt for p in task.problems("train", 50, seed=1)]
  heldout = task.problems("heldout", 500, seed=0)
  assert not {p.prompt for p in train} & {p.prompt for p in heldout}
  assert all(task.is_heldout(p.prompt) for p in heldout)


def test_task_solutions_are_correct_and_sized():
  task = ArithmeticTask()
  for p in task.problems("train", 2000, seed=3):
    assert is_correct(p.solution, p.answer)
    expression = p.prompt.strip()
    assert eval(expression) == int(p.answer)  # the chain evaluates left to right, as written
    lines = p.solution.split("\n")
    assert len(lines) == expression.count("+") + expression.count("-") + 1
    assert 16 <= len(p.solution) + 1 <= 64  # + EOS
    assert len(p.solution) <= task.max_response_chars() and len(p.prompt) <= task.max_prompt_chars()
    for line in lines[:-1]:
      lhs, rhs = line.split("=")
      assert eval(lhs) == int(rhs) >= 0


def test_task_rejects_bad_settings():
  with pytest.raises(ValueError, match="min_terms"):
    ArithmeticTask(min_terms=1)
  with pytest.raises(ValueError, match="digits"):
    ArithmeticTask(max_digits=5)


@pytest.mark.parametrize("text,answer", [
    ("47+38=85\n#### 85", "85"),
    ("so the total is \\boxed{1,234}.", "1,234"),
    ("#### 3\nwait, recheck\n#### 4", "4"),
    ("\\boxed{\\frac{1}{2}} then #### 7", "7"),
    ("#### 7 then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("no answer here 42", None),
])
def test_extract_answer(text, answer):
  assert extract_answer(text) == answer


def test_grader_normalizes_numbers():
  assert is_correct("#### 1,234", "1234")
  assert is_correct("#### $1234.00", "Some working\n#### 1234")
  assert is_correct("\\boxed{72}", "72")
  assert not is_correct("#### 71", "72")
  assert not is_correct("72", "72")  # no answer line: no credit
  assert gold_answer("Natalia sold 48/2 = 24 clips.\n#### 72") == "72"
  assert not is_correct("#### inf", "72") and not is_correct("#### nan", "72")


def test_jsonl_problem_sets(tmp_path):
  path = tmp_path / "gsm.jsonl"
  rows = [{"prompt": "What is 2+2?", "answer": "Two and two.\n#### 4"}, {"prompt": "1+1?", "answer": 2}]
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  problems = load_jsonl(str(path))
  assert [p.answer for p in problems] == ["Two and two.\n#### 4", "2"]
  assert is_correct("#### 4", problems[0].answer)
  assert get_problems("jsonl", "heldout", 1, 0, heldout_file=str(path))[0].prompt == "What is 2+2?"
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "x", "answer": "1"}\n{"question": "y"}\n')
  with pytest.raises(ValueError, match="bad.jsonl:2: each line needs"):
    load_jsonl(str(bad))
  for row, fragment in (({"answer": "1"}, "needs a non-empty string 'prompt'"), ({"prompt": ""}, "non-empty"),
                        ({"prompt": "x", "answer": [1]}, "'answer' must be a string or a number"),
                        ({"prompt": "x", "answer": "1", "grader": "regex"}, "'grader' must be one of")):
    bad.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=f"bad.jsonl:1: .*{fragment}"):
      load_jsonl(str(bad))
  with pytest.raises(ValueError, match="does not exist"):
    load_jsonl(str(tmp_path / "missing.jsonl"))
  with pytest.raises(ValueError, match="data.train_file"):
    get_problems("jsonl", "train", 1, 0)


def test_prompts_without_answers_and_the_contains_grader(tmp_path):
  """OPD needs no answers: answerless rows load, and only rows with an answer are graded."""
  path = tmp_path / "chat.jsonl"
  rows = [{"prompt": "Write a haiku."}, {"prompt": "Capital of Colombia?", "answer": "Bogotá", "grader": "contains"}]
  path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
  open_prompt, capital = load_jsonl(str(path))
  assert open_prompt.answer is None and capital.grader == "contains"
  assert is_correct("The capital of Colombia is Bogota.\nNot Medellín.", capital.answer, capital.grader)
  assert not is_correct("It is Medellín.\nBogotá", capital.answer, capital.grader)  # first line only
  assert not is_correct("Bogotáx", capital.answer, capital.grader)  # whole words


def test_chat_prompt_set_is_generated_and_split_by_subject():
  """The shipped chat prompt files are what the generator makes, >= 2,000 prompts, and no held-out subject is
  asked about in training."""
  from opd_jax.data import chat_prompts
  built = chat_prompts.build()
  for split, rows in built.items():
    shipped = load_jsonl(os.path.join(chat_prompts.ASSET_DIR, f"{split}.jsonl"))
    assert [p.prompt for p in shipped] == [r["prompt"] for r in rows]
    assert [p.answer for p in shipped] == [r.get("answer") for r in rows]
    assert [p.source for p in shipped] == [r["source"] for r in rows]
  assert len(built["train"]) + len(built["heldout"]) >= 2000
  train = {r["prompt"] for r in built["train"]}
  assert not train & {r["prompt"] for r in built["heldout"]}
  graded = [r for r in built["heldout"] if "answer" in r]
  assert len(graded) >= 30 and all(r["grader"] == "contains" for r in graded)
  country = lambda prompt: prompt.rsplit(" of ", 1)[1].rstrip("?")
  known = set(chat_prompts._sources()["teacher_known_capitals"])
  assert {country(r["prompt"]) for r in graded} <= known  # graded only where the teacher is right
  heldout_countries = {country(r["prompt"]) for r in built["heldout"] if "the capital of" in r["prompt"]}
  assert not heldout_countries & {country(t) for t in train if "the capital of" in t}
  assert ["answer" in r for r in built["heldout"][:6]] == [True, False] * 3  # any prefix mixes both kinds


def _mixed_draws(problems, mix, draws, state=None):
  from opd_jax.train.data import PromptPipeline
  tokenizer = build_char_tokenizer_dir()
  pipeline = PromptPipeline(problems, tokenizer, batch_size=4, max_prompt_tokens=8, seed=0, mix=mix)
  if state:
    pipeline.set_state(state)
  indices = [int(i) for _ in range(draws // 4) for i in next(pipeline)["index_B"]]
  return indices, pipeline.get_state()


def build_char_tokenizer_dir(_cache={}):
  import tempfile
  if "tok" not in _cache:
    path = tempfile.mkdtemp(prefix="opd_char_tok_")
    build_char_tokenizer(path)
    _cache["tok"] = load_tokenizer(path)
  return _cache["tok"]


def test_training_mix_draws_sources_by_weight_and_resumes():
  """data.mix: a 10-prompt source beside a 90-prompt one, weighted 1:1, makes half the draws; a pipeline resumed
  from its state draws what the uninterrupted one does; without a mix every prompt is drawn equally often."""
  from opd_jax.data.task import Problem
  problems = [Problem(f"{i}+1\n", None, source="short" if i < 10 else "long") for i in range(100)]
  indices, _ = _mixed_draws(problems, {"long": 1.0, "short": 1.0}, 400)
  short = sum(i < 10 for i in indices)
  assert short == 200 and len(set(indices)) == 100  # grain's mix interleaves by weight exactly
  assert all(indices.count(i) == 20 for i in range(10))  # each short prompt repeats as its source cycles
  plain, _ = _mixed_draws(problems, None, 400)
  assert sum(i < 10 for i in plain) == 40
  first, state = _mixed_draws(problems, {"long": 3.0, "short": 1.0}, 40)
  rest, _ = _mixed_draws(problems, {"long": 3.0, "short": 1.0}, 40, state)
  whole, _ = _mixed_draws(problems, {"long": 3.0, "short": 1.0}, 80)
  assert first + rest == whole and sum(i < 10 for i in whole) == 20
  dropped, _ = _mixed_draws(problems, {"long": 0.0, "short": 1.0}, 40)
  assert all(i < 10 for i in dropped)


@pytest.mark.parametrize("spec, problem_sources, message", [
    ("chat=1,capitals", ["chat"], "data.mix: 'capitals' is not 'source=weight'"),
    ("chat=-1", ["chat"], "is not 'source=weight' with a weight >= 0"),
    ("chat=1,chat=2", ["chat"], "each source once"),
    ("chat=0", ["chat"], "at least one weight must be > 0"),
    ("chat=1", ["chat", "capitals"], "data.mix has no weight for source 'capitals'"),
    ("chat=1,capital=1", ["chat"], "data.mix weights source 'capital', but no training prompt has it"),
    ("chat=1", ["chat", ""], "training prompts have no \"source\""),
])
def test_training_mix_errors_name_the_culprit(spec, problem_sources, message):
  from opd_jax.data.problems import mix_groups, parse_mix
  from opd_jax.data.task import Problem
  from opd_jax.errors import InputError
  with pytest.raises(InputError, match=message):
    mix_groups([Problem("1+1\n", None, source=s) for s in problem_sources], parse_mix(spec))


def test_char_tokenizer_round_trips(tmp_path):
  build_char_tokenizer(str(tmp_path))
  tokenizer = load_tokenizer(str(tmp_path))
  assert len(tokenizer) == vocab_size() and tokenizer.eos_token_id == 1 and tokenizer.pad_token_id == 0
  problems = ArithmeticTask().problems("train", 8, seed=0)
  prompts, valid = encode_prompts(tokenizer, problems, 24)
  assert prompts.shape == (8, 24) and valid[:, -1].all() and not valid[:, 0].any()
  responses, mask = encode_solutions(tokenizer, problems, 66)
  texts = decode_responses(tokenizer, responses, mask)
  assert texts == [p.solution for p in problems]  # EOS and padding dropped
  assert all(tokenizer.decode(list(row[v])) == p.prompt for row, v, p in zip(prompts, valid, problems))
  assert np.all(mask.sum(1) == [len(p.solution) + 1 for p in problems])


def test_char_tokenizer_survives_a_family_config(tmp_path):
  """transformers >= 5 swaps in Qwen2Tokenizer for any qwen2 config.json, which drops newlines;
  load_tokenizer keeps the tokenizer.json the checkpoint declares."""
  build_char_tokenizer(str(tmp_path))
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "vocab_size": 32}))
  tokenizer = load_tokenizer(str(tmp_path))
  ids = tokenizer.encode("47+8\n#  1", add_special_tokens=False)
  assert ids == [6, 9, 12, 10, 16, 15, 17, 17, 3]
  assert tokenizer.decode(ids) == "47+8\n#  1"


def test_token_texts_decode_each_token_once_per_tokenizer():
  """Every id's own decoding (specials spelled, spaces kept), computed once per tokenizer object."""
  import os
  from transformers import AutoTokenizer
  from opd_jax.data.token_texts import token_texts
  tokenizer = AutoTokenizer.from_pretrained(os.path.join(os.path.dirname(os.path.dirname(__file__)), "opd_jax",
                                                         "assets", "pairx", "teacher"))
  texts = token_texts(tokenizer)
  assert token_texts(tokenizer) is texts and len(texts) == len(tokenizer)
  assert list(texts) == [tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
                         for i in range(len(tokenizer))]
  assert any(len(t) == 2 and t.isdigit() for t in texts)  # pairx's teacher writes two-digit numbers as one token


def test_student_prompt_format_is_checked_and_exclusive_with_the_chat_switch():
  """data.prompt_format (a base student's template): checked when the spec is read; with use_chat_template also set
  the two say different things, so the spec refuses both."""
  from opd_jax.errors import InputError
  from opd_jax.spec.parts import DataSpec
  assert DataSpec.from_section({"prompt_format": "Q: {prompt}\nA:"}).prompt_format == "Q: {prompt}\nA:"
  for section, message in (({"prompt_format": "Q: {question}"}, "data.prompt_format='Q: {question}' does not render"),
                           ({"prompt_format": "Q:"}, "data.prompt_format='Q:' is neither"),
                           ({"prompt_format": "chat", "use_chat_template": True}, "set one"),
                           ({"prompt_format": 3}, "data.prompt_format must be a string")):
    with pytest.raises(InputError, match=message):
      DataSpec.from_section(section)
