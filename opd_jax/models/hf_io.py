"""Hugging Face checkpoint import and export (config.json + safetensors, single file or sharded).

Module paths mirror HF names, so the mapping is mechanical: `layers.3.self_attn.q_proj.kernel` <->
`model.layers.3.self_attn.q_proj.weight` (transposed: HF stores Linear weights as [out, in]),
`embed_tokens.embedding` <-> `model.embed_tokens.weight`, `lm_head.kernel` <-> `lm_head.weight`.

Stacked layer storage (`scan_layers`, opd_jax.models.layer_stack) maps layer l of `layers.self_attn.q_proj.kernel`
[L, ...] to `model.layers.l.self_attn.q_proj.weight`.

Loading builds the model abstractly (`nnx.eval_shape`, no memory), then reads one tensor at a time,
checks its shape, converts it and places it on device (optionally with a per-parameter sharding), so the
host never holds the whole model twice; a stacked parameter is read layer by layer into each device's own
block (`jax.make_array_from_callback`), never whole on the host. Every problem raises `CheckpointError` before
a model is returned.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import tempfile
from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from opd_jax.models.config import CheckpointError, ModelConfig, read_hf_config, read_json_object
from opd_jax.models import layer_stack
from opd_jax.models.decoder import Decoder

SUPPORTED_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
_INDEX_FILE = "model.safetensors.index.json"
_IGNORABLE = re.compile(r".*rotary_emb\.inv_freq$")  # buffers some older checkpoints carry
_VOCAB_ROWS = ("model.embed_tokens.weight", "lm_head.weight")  # [vocab, hidden] tensors vocab_size slices
_FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")  # safetensors dtype names a parameter may be stored in


def canonical_dtype(dtype) -> str:
  """'float32' or 'bfloat16'; anything else is an error naming the supported choices."""
  try:
    name = jnp.dtype(dtype).name
  except TypeError:
    name = str(dtype)
  if name not in SUPPORTED_DTYPES:
    raise CheckpointError(f"dtype {name!r} is not supported for model parameters; use float32 or bfloat16")
  return name


def hf_name(path: tuple) -> tuple[str, bool]:
  """Our parameter path -> (HF tensor name, whether the tensor is stored transposed)."""
  parts = [str(p) for p in path]
  leaf = parts[-1]
  if leaf == "kernel":
    name, transpose = ".".join(parts[:-1] + ["weight"]), True
  elif leaf == "embedding":
    name, transpose = ".".join(parts[:-1] + ["weight"]), False
  else:
    name, transpose = ".".join(parts), False
  return (name if parts[0] == "lm_head" else "model." + name), transpose


def _tensor_files(path: str) -> dict[str, str]:
  """HF tensor name -> safetensors file that holds it (from the sharded index, or by listing files)."""
  index_file = os.path.join(path, _INDEX_FILE)
  if os.path.isfile(index_file):
    weight_map = read_json_object(index_file).get("weight_map")
    if not isinstance(weight_map, dict):
      raise CheckpointError(f"{index_file} has no 'weight_map' (expected a safetensors shard index)")
    for file in set(weight_map.values()):
      if not os.path.isfile(os.path.join(path, file)):
        raise CheckpointError(f"{index_file} names shard {file!r}, which is missing from {path!r}")
    return dict(weight_map)
  files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
  if not files:
    raise CheckpointError(f"checkpoint dir {path!r} has no *.safetensors files (pytorch .bin is not "
                          "supported; convert with transformers' save_pretrained(safe_serialization=True))")
  names = {}
  for file in files:
    with _readable(os.path.join(path, file)), safe_open(os.path.join(path, file), framework="numpy") as f:
      names.update({k: file for k in f.keys()})
  return names


@contextlib.contextmanager
def _readable(file: str):
  """A safetensors file that cannot be read (truncated, garbage, unreadable) -> CheckpointError naming it."""
  try:
    yield
  except (SafetensorError, OSError) as e:
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise CheckpointError(f"{file} cannot be read as safetensors ({reason}); the file is damaged or cut short: "
                          "copy the checkpoint again") from None


def load_pretrained(path: str, dtype=jnp.float32, *, compute_dtype=None,
                    sharding_for: Callable[[str, tuple], jax.sharding.Sharding] | None = None,
                    attention: str = "xla", remat: str = "none", scan_layers: bool = True,
                    vocab_size: int | None = None) -> Decoder:
  """Reads an HF checkpoint directory into a Decoder with parameters in `dtype`.

  compute_dtype: activation dtype (default: `dtype`). sharding_for: optional (dotted parameter path, shape)
  -> jax Sharding; each tensor is placed with it as it is read (sharded loading onto a mesh).
  attention, remat, scan_layers: the Decoder's static execution options (see opd_jax.models.decoder).
  vocab_size: keep only the first `vocab_size` rows of embed_tokens and lm_head (read as a slice, never whole)
  and set config.vocab_size to it, e.g. to score a padded-vocabulary teacher over the student's vocabulary
  (see opd_jax.models.tokenizer_compat). None: the checkpoint's own vocabulary.
  """
  param_dtype = SUPPORTED_DTYPES[canonical_dtype(dtype)]
  if compute_dtype is not None and jnp.dtype(compute_dtype) == jnp.float64:  # a reference forward (parity checks)
    if not jax.config.jax_enable_x64:
      raise CheckpointError("compute_dtype float64 needs jax_enable_x64; set jax.config.update('jax_enable_x64', "
                            "True) before any array is made, or compute in float32")
    compute_dtype = jnp.float64
  else:
    compute_dtype = SUPPORTED_DTYPES[canonical_dtype(compute_dtype or dtype)]
  config = read_hf_config(path)
  stored_vocab = config.vocab_size
  if vocab_size is not None:
    if not isinstance(vocab_size, int) or not 0 < vocab_size <= stored_vocab:
      raise CheckpointError(f"vocab_size={vocab_size!r} cannot slice checkpoint {path!r}, whose vocab_size is "
                            f"{stored_vocab}; pass a positive size up to it (or None for the whole vocabulary)")
    config = dataclasses.replace(config, vocab_size=vocab_size)
  options = dict(attention=attention, remat=remat, scan_layers=scan_layers)
  abstract = nnx.eval_shape(lambda: Decoder(config, dtype=compute_dtype, param_dtype=param_dtype, **options))
  graphdef, abstract_state = nnx.split(abstract)
  files = _tensor_files(path)
  leaves = {}
  with _TensorReader(path, files, config, stored_vocab, jnp.dtype(param_dtype)) as reader:
    for param_path, variable in nnx.to_flat_state(abstract_state):
      expected = tuple(variable.get_value().shape)
      target = sharding_for(".".join(map(str, param_path)), expected) if sharding_for is not None else None
      leaves[param_path] = reader.param(param_path, expected, target, vocab_size)
  ignorable = lambda n: _IGNORABLE.match(n) or (n == "lm_head.weight" and config.tie_word_embeddings)
  unexpected = sorted(n for n in files if n not in reader.used and not ignorable(n))
  if unexpected:
    raise CheckpointError(f"checkpoint dir {path!r} has tensors config.json does not describe: "
                          f"{', '.join(unexpected[:5])}{' ...' if len(unexpected) > 5 else ''}")
  state = nnx.from_flat_state([(p, v.replace(leaves[p])) for p, v in nnx.to_flat_state(abstract_state)])
  return nnx.merge(graphdef, state)


class _TensorReader:
  """The safetensors files of one checkpoint, open while a model is read from them: each tensor checked for
  presence, shape and dtype before any data is read, then read whole, as a block, or only its first rows."""

  def __init__(self, path: str, files: dict[str, str], config: ModelConfig, stored_vocab: int, dtype):
    self.path, self.files, self.config, self.stored_vocab, self.dtype = path, files, config, stored_vocab, dtype
    self.used: set[str] = set()  # tensor names read
    self._stack, self._handles = contextlib.ExitStack(), {}

  def __enter__(self) -> "_TensorReader":
    return self

  def __exit__(self, *exc) -> None:
    self._stack.close()

  def open(self, name: str, expected: tuple, transpose: bool, rows: int | None = None):
    """(file, safetensors slice) of `name`, checked for presence, shape and dtype before any data is read."""
    file = self.files.get(name)
    if file is None:
      raise CheckpointError(f"checkpoint dir {self.path!r}: tensor {name!r} is missing "
                            f"(config.json describes a {self.config.model_type} model that needs it)")
    want = expected[::-1] if transpose else expected  # the stored layout
    if rows is not None:
      want = (self.stored_vocab, *want[1:])
    with _readable(os.path.join(self.path, file)):
      if file not in self._handles:
        self._handles[file] = self._stack.enter_context(safe_open(os.path.join(self.path, file), framework="numpy"))
      tensor = self._handles[file].get_slice(name)
      stored, dtype = tuple(tensor.get_shape()), tensor.get_dtype()
    if stored != want:
      raise CheckpointError(f"{os.path.join(self.path, file)}: tensor {name!r} has shape {stored}, "
                            f"expected {want} from config.json")
    if dtype not in _FLOAT_DTYPES:
      raise CheckpointError(f"{os.path.join(self.path, file)}: tensor {name!r} has dtype {dtype}; "
                            "expected a floating-point tensor")
    self.used.add(name)
    return file, tensor

  def read(self, name: str, file: str, tensor, transpose: bool, index: tuple | None = None) -> np.ndarray:
    """The tensor (or the block `index` of it, in our layout) as a contiguous array in the parameter dtype."""
    with _readable(os.path.join(self.path, file)):
      if index is None:
        array = self._handles[file].get_tensor(name)
      else:
        array = tensor[index[::-1] if transpose else index]
    return np.ascontiguousarray(array.T if transpose else array).astype(self.dtype, copy=False)

  def param(self, param_path: tuple, expected: tuple, target, vocab_size: int | None) -> jax.Array:
    """One parameter of the Decoder, placed with `target` (a Sharding, or None) as it is read."""
    if layer_stack.stacked_path(param_path):  # [L, ...]: layer l is HF's model.layers.l.*
      per_layer = [(*hf_name(layer_stack.layer_path(param_path, l)),) for l in range(expected[0])]
      opened = [self.open(name, expected[1:], transpose) for name, transpose in per_layer]

      def block(index):
        """The [layers, ...] block `index` of the stacked tensor, read layer by layer (only that block)."""
        layers = range(expected[0])[index[0]] if index else range(expected[0])
        inner = tuple(index[1:]) if index else tuple(slice(None) for _ in expected[1:])
        return np.stack([self.read(per_layer[l][0], *opened[l], per_layer[l][1], inner) for l in layers])

      # each device reads its own shard's block: the host never holds the whole stacked tensor
      return (jax.device_put(block(None)) if target is None
              else jax.make_array_from_callback(expected, target, block))
    name, transpose = hf_name(param_path)
    rows = vocab_size if vocab_size is not None and name in _VOCAB_ROWS else None
    file, tensor = self.open(name, expected, transpose, rows)
    if rows is None:
      array = self.read(name, file, tensor, transpose)
    else:  # read only the first `rows` (stored) rows: the padded rest never touches host memory
      index = (slice(None), slice(0, rows)) if transpose else (slice(0, rows), slice(None))
      array = self.read(name, file, tensor, transpose, index)
    return jax.device_put(array, target)  # straight to its shards: never whole on one device first


def param_dtype_of(model: Decoder) -> str:
  leaf = jax.tree.leaves(nnx.state(model, nnx.Param))[0]
  return jnp.dtype(leaf.dtype).name


def save_pretrained(model: Decoder, path: str, *, dtype=None, max_shard_bytes: int = 4 << 30,
                    extra_files: dict[str, str] | None = None) -> None:
  """Writes config.json, generation_config.json and safetensors that transformers loads.

  Tensors above `max_shard_bytes` in total are split into model-0000i-of-0000n.safetensors with an index.
  Files are written to a temporary directory first and moved into `path` only when all are complete.
  extra_files: {file name: source path} copied alongside (e.g. tokenizer files).
  """
  dtype_name = canonical_dtype(dtype or param_dtype_of(model))
  np_dtype = np.float32 if dtype_name == "float32" else ml_dtypes.bfloat16
  config: ModelConfig = model.config
  tensors = {}
  for param_path, value in layer_stack.per_layer_flat(nnx.state(model, nnx.Param)):  # stacked layers: one by one
    if not isinstance(value, jax.Array):
      raise ValueError(f"parameter {'.'.join(map(str, param_path))} is quantized; save_pretrained "
                       "takes the unquantized (learner) model")
    name, transpose = hf_name(param_path)
    array = np.asarray(jax.device_get(value.astype(jnp.float32))).astype(np_dtype)
    tensors[name] = np.ascontiguousarray(array.T if transpose else array)
  shards, current, size = [], {}, 0
  for name, array in tensors.items():
    if current and size + array.nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[name] = array
    size += array.nbytes
  shards.append(current)

  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".opd_save_", dir=parent)
  try:
    if len(shards) == 1:
      save_file(shards[0], os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    else:
      weight_map = {}
      for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(tmp, file), metadata={"format": "pt"})
        weight_map.update({name: file for name in shard})
      with open(os.path.join(tmp, _INDEX_FILE), "w") as f:
        total = sum(a.nbytes for a in tensors.values())
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(config.to_hf_dict(dtype_name), f, indent=2)
    generation = {"bos_token_id": config.bos_token_id, "pad_token_id": config.pad_token_id,
                  "eos_token_id": list(config.eos_token_id) or None}
    with open(os.path.join(tmp, "generation_config.json"), "w") as f:
      json.dump({k: v for k, v in generation.items() if v is not None}, f, indent=2)
    for file, source in (extra_files or {}).items():
      shutil.copyfile(source, os.path.join(tmp, file))
    os.makedirs(path, exist_ok=True)
    written = set(os.listdir(tmp))
    for file in sorted(written, key=lambda f: f == "config.json"):  # config.json last: the dir is valid after
      os.chmod(os.path.join(tmp, file), 0o644)
      os.replace(os.path.join(tmp, file), os.path.join(path, file))
    for stale in os.listdir(path):  # old weights would shadow the new ones (e.g. single file vs shards)
      if (stale.endswith(".safetensors") or stale == _INDEX_FILE) and stale not in written:
        os.remove(os.path.join(path, stale))
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
