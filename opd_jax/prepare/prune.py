"""Depth pruning: drop whole decoder layers chosen by a measured importance, then write the smaller model.

Legend: B batch, P prompt length, R response length, D model width, L layers.

Importance of layer l = KL(full model || model without layer l), exact over the vocabulary, token mean over
the model's own greedy responses to calibration prompts (the behaviour a distilled student has to recover).
A skipped layer passes its input through unchanged (`Decoder.hidden_states(layer_keep_L=...)`), so one
compiled program scores every subset. Selection is greedy, as in iterative layer pruning: remove the layer
whose removal costs the least KL given the layers already removed, and repeat until `keep_layers` remain
(each round re-measures the remaining layers, so interactions between removed layers count; the first
round's numbers, each layer removed alone, are reported too).

The pruned model keeps the other tensors as they are (embeddings, final norm, tokenizer) and renumbers the
kept layers; it is written to a temporary sibling directory and renamed into place when complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from opd_jax.data.batching import encode_prompts
from opd_jax.data.task import Problem
from opd_jax.errors import InputError
from opd_jax.models import Decoder, layer_stack, load_pretrained, load_tokenizer, read_hf_config, save_pretrained
from opd_jax.models.tokenizer import TOKENIZER_FILES
from opd_jax.objectives.chunked import exact_reverse_kl
from opd_jax.objectives.logprobs import response_hidden
from opd_jax.rollout.sampler import Sampler, SamplingConfig

MARKER = "prune.json"  # written into the pruned model: source, settings, what was dropped and why


@dataclasses.dataclass(frozen=True)
class CalibrationSet:
  """The full model's greedy responses to calibration prompts, batch by batch (padding rows masked)."""
  batches: tuple  # ((prompt_BxP, valid_BxP, response_BxR, mask_BxR), ...)

  @classmethod
  def make(cls, model, tokenizer, problems: list[Problem], *, max_prompt_tokens: int, max_new_tokens: int,
           use_chat_template: bool, batch_size: int) -> "CalibrationSet":
    graphdef, state = nnx.split(model)
    eos = tuple(model.config.eos_token_id) or (tokenizer.eos_token_id,)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0, eos_ids=eos,
                                               pad_id=pad))
    batches = []
    for start in range(0, len(problems), batch_size):
      chunk = problems[start:start + batch_size]
      prompts, valid = encode_prompts(tokenizer, chunk, max_prompt_tokens, use_chat_template)
      out = sampler(state, prompts, valid, jax.random.key(0))
      batches.append((prompts, valid, out.tokens_BxN, out.mask_BxN))
    return cls(tuple(batches))


def _measure_fn(graphdef, logits_chunk: int):
  """jit (state, keep_L, full_BxRxD, batch) -> (sum over tokens of KL(full || kept layers), token count)."""

  @jax.jit
  def measure(state, keep_L, full_BxRxD, prompt_BxP, valid_BxP, response_BxR, mask_BxR):
    model = nnx.merge(graphdef, state)
    kept_BxRxD = response_hidden(model, prompt_BxP, valid_BxP, response_BxR, mask_BxR, layer_keep_L=keep_L)
    kl_BxR = exact_reverse_kl(model, model, full_BxRxD, kept_BxRxD, logits_chunk)
    return jnp.sum(kl_BxR * mask_BxR), jnp.sum(mask_BxR)

  return measure


class LayerScorer:
  """KL(full model || model with only the layers marked in keep_L) on a calibration set."""

  def __init__(self, model: Decoder, calibration: CalibrationSet, logits_chunk: int = 0):
    self.graphdef, self.state = nnx.split(model)
    self.layers = model.config.num_hidden_layers
    self.calibration = calibration
    self._measure = _measure_fn(self.graphdef, logits_chunk)
    hidden = jax.jit(lambda state, *batch: response_hidden(nnx.merge(self.graphdef, state), *batch))
    self._full = [hidden(self.state, *batch) for batch in calibration.batches]
    self.calls = 0  # subsets scored so far (each one forward over the calibration set)

  def __call__(self, keep_L: np.ndarray) -> float:
    self.calls += 1
    total = count = 0.0
    for full, batch in zip(self._full, self.calibration.batches):
      t, c = self._measure(self.state, jnp.asarray(keep_L, bool), full, *batch)
      total, count = total + float(t), count + float(c)
    return total / max(count, 1.0)


def choose_layers(model, calibration: CalibrationSet, keep_layers: int, logits_chunk: int = 0,
                  drops_per_round: int = 1, log=lambda message: None) -> dict:
  """Removes layers down to `keep_layers`, `drops_per_round` at a time: each round scores every remaining layer's
  removal (given those already removed) and drops the cheapest ones (1 = greedy; >= the number to drop =
  one-shot). Returns kept / dropped layers, the KL after each drop and each layer's KL removed alone."""
  scorer = LayerScorer(model, calibration, logits_chunk)
  keep_L = np.ones(scorer.layers, bool)
  dropped, alone = [], None
  while keep_L.sum() > keep_layers:
    costs = {}
    for layer in np.flatnonzero(keep_L):
      trial = keep_L.copy()
      trial[layer] = False
      costs[int(layer)] = scorer(trial)
    alone = alone or costs
    cheapest = sorted(costs, key=costs.get)[:min(drops_per_round, int(keep_L.sum()) - keep_layers)]
    for layer in cheapest:
      keep_L[layer] = False
    kl = scorer(keep_L) if len(cheapest) > 1 else costs[cheapest[0]]
    dropped += [{"layer": layer, "kl_removed_with_earlier": costs[layer], "kl_alone": alone[layer]}
                for layer in cheapest]
    log(f"dropped layers {cheapest}: KL to the full model {kl:.4f} with {int(keep_L.sum())} layers left")
  return {"kept": [int(i) for i in np.flatnonzero(keep_L)], "dropped": dropped, "kl_to_source": kl,
          "kl_alone": {str(k): v for k, v in sorted(alone.items())}, "subsets_scored": scorer.calls}


def pruned_model(model: Decoder, kept: list[int]) -> Decoder:
  """A Decoder with only the `kept` layers (renumbered in order); every other tensor shared as it is."""
  config = dataclasses.replace(model.config, num_hidden_layers=len(kept))
  graphdef, state = nnx.split(model)
  param_dtype = jax.tree.leaves(state)[0].dtype
  abstract = nnx.eval_shape(lambda: Decoder(config, dtype=model.dtype, param_dtype=param_dtype,
                                            attention=model.attention, remat=model.remat,
                                            scan_layers=model.scan_layers))
  new_graphdef, new_state = nnx.split(abstract)
  source = dict(nnx.to_flat_state(state))
  kept_L = jnp.asarray(kept, jnp.int32)
  leaves = []
  for path, variable in nnx.to_flat_state(new_state):
    if layer_stack.stacked_path(path):  # [L, ...] -> the kept layers' rows, in order
      value = jnp.take(source[path].get_value(), kept_L, axis=0)
    elif path[0] == "layers":
      value = source[("layers", kept[int(path[1])], *path[2:])].get_value()
    else:
      value = source[path].get_value()
    leaves.append((path, variable.replace(value)))
  return nnx.merge(new_graphdef, nnx.from_flat_state(leaves))


def fingerprint(model_dir: str) -> str:
  """sha256 of a model directory's config.json and weight files (what a pruned copy was made from)."""
  digest = hashlib.sha256()
  for name in sorted(os.listdir(model_dir)):
    if name == "config.json" or name.endswith(".safetensors"):
      digest.update(name.encode())
      with open(os.path.join(model_dir, name), "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
          digest.update(block)
  return digest.hexdigest()


def prune(source: str, out: str, keep_layers: int, problems: list[Problem], *, max_prompt_tokens: int,
          max_new_tokens: int, use_chat_template: bool, batch_size: int = 16, logits_chunk: int = 0,
          drops_per_round: int = 1, log=print) -> dict:
  """Chooses `keep_layers` layers of the model at `source` on `problems` and writes them to `out`.

  Idempotent: an `out` already pruned from the same model with the same settings is left as it is; any other
  existing `out` is an error. Returns the report that is also written to out/prune.json.
  """
  start = time.time()
  layers = read_hf_config(source).num_hidden_layers  # errors name the checkpoint
  if not isinstance(keep_layers, int) or not 1 <= keep_layers < layers:
    raise InputError(f"--keep_layers={keep_layers} is out of range: {source!r} has {layers} layers; keep 1 to "
                     f"{layers - 1}")
  if not problems:
    raise InputError("pruning needs calibration prompts; the prompt set is empty")
  if not isinstance(drops_per_round, int) or drops_per_round < 1:
    raise InputError(f"drops_per_round must be a positive integer (1 = greedy), got {drops_per_round!r}")
  prompts_digest = hashlib.sha256("\n".join(p.prompt for p in problems).encode("utf-8")).hexdigest()
  settings = {"keep_layers": keep_layers, "prompts": len(problems), "prompts_sha256": prompts_digest,
              "max_prompt_tokens": max_prompt_tokens, "max_new_tokens": max_new_tokens,
              "use_chat_template": use_chat_template, "drops_per_round": drops_per_round}
  digest = fingerprint(source)
  if os.path.exists(out):
    marker = os.path.join(out, MARKER)
    if os.path.isfile(marker):
      with open(marker) as f:
        previous = json.load(f)
      if previous.get("source_sha256") == digest and previous.get("settings") == settings:
        return {**previous, "skipped": True}
      raise InputError(f"{out!r} holds a model pruned from another source or with other settings "
                       f"({previous.get('settings')}); choose another output directory or remove it")
    raise InputError(f"{out!r} exists and is not a pruned model made by this tool; choose a new directory")
  model = load_pretrained(source, jnp.float32, attention="xla", scan_layers=True)
  tokenizer = load_tokenizer(source)
  log(f"calibration: greedy responses of the {layers}-layer model to {len(problems)} prompts")
  calibration = CalibrationSet.make(model, tokenizer, problems, max_prompt_tokens=max_prompt_tokens,
                                    max_new_tokens=max_new_tokens, use_chat_template=use_chat_template,
                                    batch_size=batch_size)
  choice = choose_layers(model, calibration, keep_layers, logits_chunk, drops_per_round, log)
  report = {"source": os.path.abspath(source), "source_sha256": digest, "settings": settings, "layers": layers,
            **choice, "seconds": time.time() - start}
  small = pruned_model(model, choice["kept"])
  parent = os.path.dirname(os.path.abspath(out))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out))}.prune-", dir=parent)
  try:
    staged = os.path.join(tmp, "model")
    extra = {f: os.path.join(source, f) for f in TOKENIZER_FILES if os.path.isfile(os.path.join(source, f))}
    save_pretrained(small, staged, extra_files=extra)
    with open(os.path.join(staged, MARKER), "w") as f:
      json.dump(report, f, indent=2)
    os.rename(staged, out)  # atomic: `out` appears complete or not at all
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return {**report, "skipped": False}
