"""GGUF import (opd_jax/models/gguf_import.py): tensors, config, tokenizer and chat template, logits against
transformers' own GGUF loading, and the one-line errors, on tiny GGUF files written here (tests/gguf_files.py)."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from opd_jax.errors import InputError
from opd_jax.models import layer_stack, load_pretrained, load_tokenizer, read_hf_config
from opd_jax.models.gguf_import import import_gguf
from opd_jax.models.tokenizer import encode_prompt
from tests.gguf_files import CHAT_TEMPLATE, GEMMA_SHAPE, SHAPE, write_gemma3_gguf, write_gguf

TEXTS = ["the cap in a cat", "12 + 345 = 357\n\n  héllo, wörld! <|im_end|> tab\there", "Ġ and ĉ are plain text"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
  """{arch: (gguf dir, gguf file name, imported HF dir)} for llama (tied, smollm pre-tokenizer), qwen2 (q/k/v
  biases, qwen2 pre-tokenizer) and qwen3 (QK-norm, untied head)."""
  root = tmp_path_factory.mktemp("gguf")
  out = {}
  for arch, pre, tie in (("llama", "smollm", True), ("qwen2", "qwen2", True), ("qwen3", "qwen2", False)):
    d = root / arch
    d.mkdir()
    write_gguf(str(d / "m.gguf"), arch, pre=pre, tie=tie)
    summary = import_gguf(str(d / "m.gguf"), str(d / "hf"))
    assert not summary["skipped"] and summary["architecture"] == arch
    out[arch] = (str(d), "m.gguf", str(d / "hf"))
  d = root / "gemma3"
  d.mkdir()
  write_gemma3_gguf(str(d / "m.gguf"))
  assert import_gguf(str(d / "m.gguf"), str(d / "hf"))["architecture"] == "gemma3_text"
  out["gemma3"] = (str(d), "m.gguf", str(d / "hf"))
  return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_logits_and_tensors_match_transformers_gguf_loading(imported, arch):
  """transformers dequantizes and un-permutes the same file its own way (and takes 1 off Gemma's norms): tensors
  and float32 logits agree; gemma3's 24 tokens cross its window of 4."""
  torch = pytest.importorskip("torch")
  from transformers import AutoModelForCausalLM
  from safetensors.numpy import load_file
  folder, name, hf = imported[arch]
  reference = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
  ours = load_file(os.path.join(hf, "model.safetensors"))
  theirs = {k: v.numpy() for k, v in reference.state_dict().items() if k in ours}
  assert set(theirs) == set(ours)
  for key, value in ours.items():
    np.testing.assert_allclose(value, theirs[key], atol=1e-6, err_msg=key)
  tokens = np.random.default_rng(0).integers(0, reference.config.vocab_size, (2, 24))
  with torch.no_grad():
    want = reference(torch.tensor(tokens)).logits.numpy()
  got = np.asarray(load_pretrained(hf, jnp.float32)(jnp.asarray(tokens)))
  np.testing.assert_allclose(got, want, atol=5e-5, rtol=0)


def test_qwen3_import_matches_transformers_on_the_written_directory(imported):
  """transformers' GGUF reader ignores qwen3's key_length (it assumes head_dim 128), so qwen3 is checked on the
  written directory instead: the QK-norm weights are the file's, and the logits match transformers there."""
  torch = pytest.importorskip("torch")
  from transformers import AutoModelForCausalLM
  import gguf
  folder, name, hf = imported["qwen3"]
  config = read_hf_config(hf)
  assert config.head_dim == SHAPE["head_dim"] and not config.tie_word_embeddings
  reader = gguf.GGUFReader(os.path.join(folder, name))
  q_norm = next(t for t in reader.tensors if t.name == "blk.1.attn_q_norm.weight")
  model = load_pretrained(hf, jnp.float32)
  np.testing.assert_array_equal(np.asarray(layer_stack.get(nnx.state(model), "layers.1.self_attn.q_norm.weight")),
                                np.asarray(q_norm.data))
  tokens = np.random.default_rng(1).integers(0, config.vocab_size, (2, 24))
  with torch.no_grad():
    want = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)(torch.tensor(tokens)).logits.numpy()
  np.testing.assert_allclose(np.asarray(model(jnp.asarray(tokens))), want, atol=5e-5, rtol=0)


def test_gemma3_config_and_tokenizer_match_transformers(imported):
  """The layer pattern, window and query scaling llama.cpp leaves implicit; the SentencePiece vocabulary tokenizes
  as transformers' GGUF tokenizer does (byte fallback for unknown characters, BOS added when asked)."""
  from transformers import AutoTokenizer
  folder, name, hf = imported["gemma3"]
  config = read_hf_config(hf)
  assert config.kinds_L == (1, 1, 1, 1, 1, 0) and config.sliding_window == GEMMA_SHAPE["window"]
  assert config.query_scale == GEMMA_SHAPE["head_dim"] ** -0.5 and config.tie_word_embeddings
  ours, theirs = load_tokenizer(hf), AutoTokenizer.from_pretrained(folder, gguf_file=name)
  for text in TEXTS + ["the cap 12 héllo", "<start_of_turn>user\nthe cap<end_of_turn>"]:
    for special in (True, False):
      assert ours.encode(text, add_special_tokens=special) == theirs.encode(text, add_special_tokens=special), text
    assert ours.decode(ours.encode(text, add_special_tokens=False)) == text
  assert ours.encode("the", add_special_tokens=True)[0] == 2  # <bos>
  # A base student's prompt format (data.prompt_format): the template rendered, with the BOS a base model needs.
  ids = encode_prompt(ours, "the cap", False, "Q: {prompt}\nA:")
  assert ids[0] == 2 and ours.decode(ids[1:]) == "Q: the cap\nA:"
  assert encode_prompt(ours, "the cap", False, "plain") == ours.encode("the cap", add_special_tokens=True)
  with pytest.raises(InputError, match="data.prompt_format='chat'.*no chat template"):
    encode_prompt(ours, "the cap", False, "chat")


def test_config_files_and_marker(imported):
  _, _, hf = imported["llama"]
  config = read_hf_config(hf)
  assert (config.model_type, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
          config.head_dim, config.tie_word_embeddings) == ("llama", 3, 4, 2, 16, True)
  assert config.eos_token_id == (2,) and config.bos_token_id == 1 and config.pad_token_id == 2
  with open(os.path.join(hf, "generation_config.json")) as f:
    assert json.load(f)["eos_token_id"] == [2]
  with open(os.path.join(hf, "import.json")) as f:
    marker = json.load(f)
  assert marker["tensor_types"] == {"F32": 7, "Q4_1": 21, "Q8_0": 1} and len(marker["sha256"]) == 64
  assert not [f for f in os.listdir(os.path.dirname(hf)) if f.startswith(".")]  # no staging folder left


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tokenizer_round_trip_and_chat_template(imported, arch):
  from transformers import AutoTokenizer
  folder, name, hf = imported[arch]
  ours, theirs = load_tokenizer(hf), AutoTokenizer.from_pretrained(folder, gguf_file=name)
  for text in TEXTS:
    ids = ours.encode(text, add_special_tokens=False)
    assert ids == theirs(text, add_special_tokens=False)["input_ids"], text
    assert ours.decode(ids) == text
  assert ours.encode("<|im_end|>", add_special_tokens=False) == [2]  # control tokens stay whole
  assert ours.chat_template == CHAT_TEMPLATE
  ids = encode_prompt(ours, "the cap", use_chat_template=True)
  assert ours.decode(ids) == "<|im_start|>user\nthe cap<|im_end|>\n<|im_start|>assistant\n"


def test_digits_are_split_one_by_one_for_smollm(imported):
  """SmolLM's pre-tokenizer splits every digit, whatever merges exist."""
  tokenizer = load_tokenizer(imported["llama"][2])
  assert tokenizer.convert_ids_to_tokens(tokenizer.encode("2026", add_special_tokens=False)) == ["2", "0", "2", "6"]


def test_reimport_is_a_no_op_and_another_file_is_refused(imported, tmp_path):
  folder, name, hf = imported["llama"]
  before = os.path.getmtime(os.path.join(hf, "model.safetensors"))
  assert import_gguf(os.path.join(folder, name), hf)["skipped"]
  assert os.path.getmtime(os.path.join(hf, "model.safetensors")) == before
  other = str(tmp_path / "other.gguf")
  write_gguf(other, "llama", seed=5)
  with pytest.raises(InputError, match="holds an import of another file"):
    import_gguf(other, hf)


def test_bad_inputs_are_one_line_errors(tmp_path):
  def refused(source, fragment, out="out"):
    with pytest.raises(InputError, match=fragment):
      import_gguf(source, str(tmp_path / out))
    assert not (tmp_path / out).exists()

  refused("no-such-package-opd", "is not installed")
  refused(str(tmp_path / "missing.gguf"), "does not exist")
  garbage = tmp_path / "garbage.gguf"
  garbage.write_bytes(b"GGUF" + os.urandom(64))
  refused(str(garbage), "cannot be read as GGUF")
  write_gguf(str(tmp_path / "falcon.gguf"), "falcon")
  refused(str(tmp_path / "falcon.gguf"), "architecture 'falcon' is not supported")
  write_gguf(str(tmp_path / "pre.gguf"), "llama", pre="mystery")
  refused(str(tmp_path / "pre.gguf"), "pre-tokenizer 'mystery' is not known")
  good = tmp_path / "good.gguf"
  write_gguf(str(good), "llama")
  cut = tmp_path / "cut.gguf"
  cut.write_bytes(good.read_bytes()[:os.path.getsize(good) * 2 // 3])
  refused(str(cut), "cut.gguf")
  (tmp_path / "taken").mkdir()
  (tmp_path / "taken" / "x").write_text("mine")
  with pytest.raises(InputError, match="is not an import made by this tool"):
    import_gguf(str(good), str(tmp_path / "taken"))
