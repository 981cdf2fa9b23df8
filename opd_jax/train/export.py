"""Export of the trained student as a Hugging Face checkpoint that transformers and load_pretrained read.

The export directory holds safetensors (HF tensor names, `hf_io.hf_name`), the student's config.json (copied
from the student dir, dtype updated), generation_config.json (copied, or derived from the config's bos / eos /
pad ids) and the tokenizer files.

Memory: tensors are gathered to the host one at a time (an all-gather across processes when a tensor is not
fully addressable: every process takes part, process 0 writes) and streamed into safetensors files whose headers
are computed up front from the shapes, so no host holds more than one whole tensor.

Atomicity: everything is written into a temporary directory next to `out_dir`, which replaces `out_dir` only when
complete; on any failure the temporary directory is removed and an existing `out_dir` is left as it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import struct
import tempfile

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from jax.experimental import multihost_utils

from opd_jax.errors import InputError
from opd_jax.models import layer_stack
from opd_jax.models import sharding as shard_lib
from opd_jax.models.config import read_hf_config
from opd_jax.models.decoder import Decoder
from opd_jax.models.hf_io import SUPPORTED_DTYPES, canonical_dtype, hf_name
from opd_jax.models.tokenizer import TOKENIZER_FILES, has_tokenizer
from opd_jax.spec import PairSpec
from opd_jax.train.checkpoint import integrity

_INDEX_FILE = "model.safetensors.index.json"
_SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16"}


def export_student(graphdef, params, student_dir: str, out_dir: str, tokenizer_dir: str | None = None, *,
                   dtype: str = "float32", max_shard_bytes: int = 4 << 30) -> str:
  """Writes the student (graphdef + params, e.g. TrainState.params) to `out_dir` as an HF checkpoint.

  student_dir: the HF dir the student started from (config.json, generation_config.json, and the tokenizer
  unless `tokenizer_dir` is given). dtype: float32 | bfloat16 for the exported tensors. Tensors above
  `max_shard_bytes` in total are split into model-0000i-of-0000n.safetensors with an index. Every process of a
  multi-process run must call this (the gathers are collective); process 0 writes. Returns `out_dir`.
  """
  dtype_name = canonical_dtype(dtype)
  out_dir = os.path.abspath(out_dir)
  tokenizer_dir = tokenizer_dir or student_dir
  model_config = read_hf_config(student_dir)  # errors name the dir
  check_out_dir(out_dir, student_dir, tokenizer_dir)
  tensors = _hf_tensors(graphdef, params, model_config)
  shards = _plan_shards(tensors, np.dtype(SUPPORTED_DTYPES[dtype_name]).itemsize, max_shard_bytes)
  writer = jax.process_index() == 0
  tmp = None
  try:
    if writer:
      os.makedirs(os.path.dirname(out_dir), exist_ok=True)
      tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=os.path.dirname(out_dir))
    for file, names in shards.items():
      _write_safetensors(os.path.join(tmp, file) if writer else None, [(n, tensors[n]) for n in names], dtype_name)
    if writer:
      _write_metadata(tmp, shards, tensors, dtype_name, model_config, student_dir, tokenizer_dir)
      _replace_dir(tmp, out_dir)
      tmp = None
  finally:
    if tmp is not None:
      shutil.rmtree(tmp, ignore_errors=True)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("export_student")  # every process returns once it is there
  return out_dir


@dataclasses.dataclass(frozen=True)
class _Tensor:
  """One HF tensor of the export: a parameter array, or layer `layer` of a stacked one (sliced when gathered)."""
  value: jax.Array
  layer: int | None
  transpose: bool  # HF stores it transposed

  @property
  def shape(self) -> tuple[int, ...]:
    shape = tuple(self.value.shape[1:] if self.layer is not None else self.value.shape)
    return shape[::-1] if self.transpose else shape


def _hf_tensors(graphdef, params, model_config) -> dict[str, _Tensor]:
  """HF name -> tensor, sorted by name; shapes checked against `model_config` in the per-layer view (any storage)."""
  state = nnx.state(nnx.merge(graphdef, params), nnx.Param)
  expected = {path: value for path, value in layer_stack.per_layer_flat(
      nnx.state(nnx.eval_shape(lambda: Decoder(model_config, scan_layers=False)), nnx.Param))}
  tensors = {}
  for path, _, value, layer in layer_stack.entries(state):
    dotted = layer_stack.dotted(path)
    if not isinstance(value, jax.Array):
      raise InputError(f"parameter {dotted} is not a plain array (quantized?); export the learner's params")
    shape = tuple(value.shape[1:] if layer is not None else value.shape)
    want = expected.pop(path, None)
    if want is None or tuple(want.shape) != shape:
      raise InputError(f"parameter {dotted} with shape {shape} does not fit the student's config.json "
                       f"({'no such parameter' if want is None else tuple(want.shape)}); pass the "
                       "student dir these params were trained from")
    name, transpose = hf_name(path)
    tensors[name] = _Tensor(value, layer, transpose)
  if expected:
    raise InputError(f"the params lack {', '.join('.'.join(map(str, p)) for p in list(expected)[:3])} that the "
                     "student's config.json describes; pass the student dir these params were trained from")
  return dict(sorted(tensors.items()))


def _plan_shards(tensors: dict, itemsize: int, max_shard_bytes: int) -> dict[str, list[str]]:
  """File name -> tensor names, in order; a new file starts when the next tensor would pass max_shard_bytes."""
  groups, size = [[]], 0
  for name, tensor in tensors.items():
    nbytes = math.prod(tensor.shape) * itemsize
    if groups[-1] and size + nbytes > max_shard_bytes:
      groups.append([])
      size = 0
    groups[-1].append(name)
    size += nbytes
  if len(groups) == 1:
    return {"model.safetensors": groups[0]}
  return {f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors": g for i, g in enumerate(groups)}


def _gather(tensor: _Tensor, dtype_name: str) -> np.ndarray:
  """One whole tensor on the host (every process), sliced, cast and transposed on device first."""
  value = tensor.value if tensor.layer is None else tensor.value[tensor.layer]
  if value.dtype != SUPPORTED_DTYPES[dtype_name]:
    value = value.astype(SUPPORTED_DTYPES[dtype_name])
  if tensor.transpose:
    value = value.T
  if value.is_fully_addressable:
    return np.ascontiguousarray(jax.device_get(value))
  return np.ascontiguousarray(multihost_utils.process_allgather(value, tiled=True))


def _write_safetensors(path: str | None, tensors: list[tuple[str, _Tensor]], dtype_name: str):
  """Streams one safetensors file: the header from the shapes, then each tensor as it is gathered.

  path None: this process only takes part in the gathers (another process writes)."""
  itemsize = np.dtype(SUPPORTED_DTYPES[dtype_name]).itemsize
  header, offset = {"__metadata__": {"format": "pt"}}, 0
  for name, tensor in tensors:
    shape = list(tensor.shape)
    nbytes = math.prod(shape) * itemsize
    header[name] = {"dtype": _SAFETENSORS_DTYPES[dtype_name], "shape": shape, "data_offsets": [offset, offset + nbytes]}
    offset += nbytes
  raw = json.dumps(header, separators=(",", ":")).encode()
  raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned, as safetensors writes it
  with open(path, "wb") if path else contextlib.nullcontext() as f:
    if f is not None:
      f.write(struct.pack("<Q", len(raw)) + raw)
    for name, tensor in tensors:
      host = _gather(tensor, dtype_name)
      if list(host.shape) != header[name]["shape"]:
        raise AssertionError(f"gathered {name} has shape {host.shape}, expected {header[name]['shape']}")
      if f is not None:
        f.write(host.reshape(-1).view(np.uint8))
      del host


def _write_metadata(tmp: str, shards: dict, tensors: dict, dtype_name: str, model_config, student_dir: str,
                    tokenizer_dir: str) -> None:
  """config.json, generation_config.json, the shard index (when sharded) and the tokenizer files."""
  if len(shards) > 1:
    itemsize = np.dtype(SUPPORTED_DTYPES[dtype_name]).itemsize
    total = sum(math.prod(tensor.shape) * itemsize for tensor in tensors.values())
    weight_map = {name: file for file, names in shards.items() for name in names}
    _write_json(os.path.join(tmp, _INDEX_FILE), {"metadata": {"total_size": total}, "weight_map": weight_map})
  with open(os.path.join(student_dir, "config.json")) as f:
    hf_config = json.load(f)
  for key in [k for k in ("torch_dtype", "dtype") if k in hf_config] or ["torch_dtype"]:
    hf_config[key] = dtype_name
  _write_json(os.path.join(tmp, "config.json"), hf_config)
  generation_file = os.path.join(student_dir, "generation_config.json")
  if os.path.isfile(generation_file):
    shutil.copyfile(generation_file, os.path.join(tmp, "generation_config.json"))
  else:
    generation = {"bos_token_id": model_config.bos_token_id, "pad_token_id": model_config.pad_token_id,
                  "eos_token_id": list(model_config.eos_token_id) or None}
    _write_json(os.path.join(tmp, "generation_config.json"), {k: v for k, v in generation.items() if v is not None})
  for file in TOKENIZER_FILES:
    if os.path.isfile(os.path.join(tokenizer_dir, file)):
      shutil.copyfile(os.path.join(tokenizer_dir, file), os.path.join(tmp, file))


def _write_json(path: str, obj) -> None:
  with open(path, "w") as f:
    json.dump(obj, f, indent=2)
    f.write("\n")


def _replace_dir(tmp: str, out_dir: str) -> None:
  """Moves the complete `tmp` to `out_dir`; an existing `out_dir` is moved aside first and removed after."""
  os.chmod(tmp, 0o755)
  for file in os.listdir(tmp):
    os.chmod(os.path.join(tmp, file), 0o644)
  if not os.path.exists(out_dir):
    os.rename(tmp, out_dir)
    return
  trash = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.old-", dir=os.path.dirname(out_dir))
  os.rename(out_dir, os.path.join(trash, "previous"))
  try:
    os.rename(tmp, out_dir)
  except OSError:
    os.rename(os.path.join(trash, "previous"), out_dir)
    raise
  finally:
    shutil.rmtree(trash, ignore_errors=True)


def check_out_dir(out_dir: str, student_dir: str, tokenizer_dir: str) -> None:
  """Before any work: `out_dir` can take an export of a student read from `student_dir` / `tokenizer_dir`."""
  out_dir = os.path.abspath(out_dir)
  for source in {student_dir, tokenizer_dir}:
    if os.path.realpath(source) == os.path.realpath(out_dir):
      raise InputError(f"export dir {out_dir!r} is the student / tokenizer dir it reads from; choose another out dir")
  if _replaces_something_else(out_dir):  # the export replaces out_dir whole
    raise InputError(f"export dir {out_dir!r} is a non-empty directory that is not an export (a run, or no "
                     "safetensors), and exporting replaces it whole; choose a new out dir, e.g. <workdir>/export")
  if not has_tokenizer(tokenizer_dir):
    raise InputError(f"tokenizer dir {tokenizer_dir!r} has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}); "
                     "pass the run's tokenizer dir (config.tokenizer)")
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise InputError(f"export dir {out_dir!r} exists and is not a directory; remove it or choose another out dir")


def _replaces_something_else(out_dir: str) -> bool:
  """True when `out_dir` holds files that are not an earlier export (a run dir, or a folder above one)."""
  names = set(os.listdir(out_dir)) if os.path.isdir(out_dir) else set()
  no_weights = bool(names) and not any(n.endswith(".safetensors") for n in names)
  return no_weights or bool({"checkpoints", "metrics.jsonl"} & names)


# --- From a training workdir -------------------------------------------------------------------------------------


def read_run_pair(workdir: str) -> PairSpec:
  """The run's pair (from workdir/config.json, written by launch/train.py)."""
  if not os.path.isdir(workdir):
    raise InputError(f"workdir {workdir!r} does not exist; pass the --workdir of a launch/train.py run")
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise InputError(f"workdir {workdir!r} has no config.json; pass the --workdir of a launch/train.py run")
  try:
    with open(path) as f:
      return PairSpec.from_config(json.load(f))
  except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
    detail = e.msg if isinstance(e, json.JSONDecodeError) else f"no field {e}" if isinstance(e, KeyError) else e
    raise InputError(f"{path!r} is not a launch/train.py run's config ({detail}); pass the --workdir of a "
                     "launch/train.py run, whose config.json it wrote") from None


def _manager(workdir: str) -> ocp.CheckpointManager:
  if not os.path.isdir(workdir):
    raise InputError(f"workdir {workdir!r} does not exist; pass the --workdir of a launch/train.py run")
  directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
  steps = ocp.utils.checkpoint_steps(directory) if os.path.isdir(directory) else []
  if not steps:
    raise InputError(f"workdir {workdir!r} has no checkpoints under checkpoints/; train first (launch/train.py "
                     "checkpoints every train.checkpoint_every steps and at the end)")
  return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(create=False))


def resolve_step(workdir: str, step: int | None = None) -> int:
  """`step` if the workdir holds a checkpoint of it, else (None) the latest; errors list the available steps."""
  manager = _manager(workdir)
  try:
    steps = sorted(manager.all_steps())
  finally:
    manager.close()
  if step is None:
    return steps[-1]
  if step not in steps:
    raise InputError(f"workdir {workdir!r} has no checkpoint of step {step}; available steps: "
                     f"{', '.join(map(str, steps))} (omit --step for the latest)")
  return step


def restore_params(workdir: str, step: int | None = None):
  """(graphdef, params) of the student at `step` (default latest), sharded over all devices (fsdp).

  Only the train state's params are read (an orbax partial restore): no optimizer state, no snapshots.
  """
  pair = read_run_pair(workdir)
  step = resolve_step(workdir, step)
  student = read_hf_config(pair.student)
  abstract = nnx.eval_shape(lambda: Decoder(
      student, dtype=SUPPORTED_DTYPES[canonical_dtype(pair.student_compute_dtype)],
      param_dtype=SUPPORTED_DTYPES[canonical_dtype(pair.student_param_dtype)], attention=pair.model.attention,
      remat=pair.model.remat, scan_layers=pair.model.scan_layers))
  graphdef, abstract_params = nnx.split(abstract)
  mesh = shard_lib.make_mesh(1, jax.device_count(), 1)
  shardings = shard_lib.state_shardings(abstract_params, mesh)
  target = {"train": {"params": jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                             abstract_params, shardings)}}
  step_dir = os.path.join(os.path.abspath(workdir), "checkpoints", str(step))
  others = [d for d in sorted(os.listdir(os.path.dirname(step_dir)), key=lambda d: (len(d), d))
            if d.isdigit() and d != str(step)]
  damaged = (f"checkpoint step {step} in {step_dir!r} is damaged ({{}}); export another --step "
             f"({', '.join(others) if others else 'none left: rerun launch/train.py'})")
  try:
    integrity.verify_manifest(step_dir, (jax.process_index(), jax.process_count()))
  except integrity.Unreadable as e:
    raise InputError(damaged.format(e)) from None
  manager = _manager(workdir)
  try:
    restored = manager.restore(step, args=ocp.args.Composite(arrays=ocp.args.PyTreeRestore(
        item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True)))
  except (ValueError, OSError, KeyError) as e:  # orbax / tensorstore reading a cut or missing file
    raise InputError(damaged.format(f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")) from None
  finally:
    manager.close()
  return graphdef, restored.arrays["train"]["params"]


def export_from_workdir(workdir: str, out_dir: str, step: int | None = None, *, dtype: str = "float32") -> str:
  """Exports the student of a training run at `step` (default latest) to `out_dir`; returns `out_dir`."""
  pair = read_run_pair(workdir)
  read_hf_config(pair.student)  # a student folder that is gone is named as such
  check_out_dir(out_dir, pair.student, pair.tokenizer or pair.student)  # before the checkpoint is read
  graphdef, params = restore_params(workdir, step)
  return export_student(graphdef, params, pair.student, out_dir, pair.tokenizer or None, dtype=dtype)
