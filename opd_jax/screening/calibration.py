"""A calibration batch: the pair, held-out prompts, and one way to measure a rollout config's mismatch.

Used by the sensitivity scan, the prefix-shift analysis and the admission check, so all three measure
mismatch exactly as the training step does: sample with the candidate sampler, score the same tokens with the
unquantized learner, and compute `token_metrics` (k3 and friends) plus vocabulary metrics.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from opd_jax.data.batching import encode_prompts
from opd_jax.data.problems import get_problems
from opd_jax.data.task import ArithmeticTask, Problem
from opd_jax.mismatch.metrics import token_mean, token_metrics, vocab_divergences_topk_per_token
from opd_jax.models import load_tokenizer
from opd_jax.objectives.chunked import exact_reverse_kl, gather_logp, tempered_log_softmax, token_map
from opd_jax.objectives.logprobs import response_hidden, score
from opd_jax.rollout.config import RolloutConfig, build_sampler_state
from opd_jax.rollout.sampler import SampleOutput, Sampler
from opd_jax.spec import RunSpec
from opd_jax.train.load import load_model


@dataclasses.dataclass
class Calibration:
  graphdef: nnx.GraphDef
  params: nnx.State
  teacher_graphdef: nnx.GraphDef
  teacher_state: nnx.State
  tokenizer: object
  problems: list[Problem]
  prompt_BxP: np.ndarray
  valid_BxP: np.ndarray
  eos_ids: tuple[int, ...]
  pad_id: int
  vocab_size: int
  is_cap: float
  vocab_top_k: int = 64  # sampler top-k log-probs for the vocabulary metrics (0 = none)
  logits_chunk: int = 0  # tokens (rows x positions) per vocabulary chunk (0 = all at once)
  learner_graphdef: nnx.GraphDef | None = None  # learner's own graph when its compute dtype differs from the sampler's

  @classmethod
  def from_spec(cls, spec: RunSpec, num_prompts: int, seed: int = 0) -> "Calibration":
    """Held-out prompts of the run's data source (never the training split) and its pair (an entry point makes
    the spec with opd_jax.spec.screening_spec, after preparing the pair)."""
    pair = spec.pair
    student, teacher = load_model(pair, "student", vocab=spec.vocab), load_model(pair, "teacher", vocab=spec.vocab)
    tokenizer = load_tokenizer(pair.tokenizer_dir)
    d = spec.data
    task = ArithmeticTask(d.min_terms, d.max_terms, d.min_digits, d.max_digits)
    problems = get_problems(d.source, "heldout", num_prompts, d.seed + 1000 + seed, task, d.train_file,
                            d.heldout_file)
    prompts, valid = encode_prompts(tokenizer, problems, d.max_prompt_tokens, d.use_chat_template,
                                   prompt_format=d.prompt_format)
    graphdef, params = nnx.split(student)
    teacher_graphdef, teacher_state = nnx.split(teacher)
    eos = tuple(student.config.eos_token_id) or (tokenizer.eos_token_id,)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    vocab = student.config.vocab_size
    top_k = min(spec.train.sampler_top_k(vocab), vocab)
    return cls(graphdef, params, teacher_graphdef, teacher_state, tokenizer, problems, prompts, valid, eos, pad,
               vocab, spec.objective.is_cap, top_k, spec.train.logits_chunk)

  @functools.cached_property
  def _learner_score(self):
    return jax.jit(functools.partial(_learner_tokens, self.learner_graphdef or self.graphdef, chunk=self.logits_chunk),
                   static_argnames="temperature")

  @functools.cached_property
  def _teacher_score(self):
    return jax.jit(functools.partial(score, self.teacher_graphdef, logits_chunk=self.logits_chunk),
                   static_argnames="temperature")

  @functools.cached_property
  def _prefix_kl(self):
    return jax.jit(functools.partial(_prefix_kl, self.graphdef, self.teacher_graphdef, chunk=self.logits_chunk))

  def sampler_state(self, rollout: RolloutConfig, params=None):
    """The sampler's weights for `rollout` (recipe and noise) from `params` (default: the pair's student)."""
    params = self.params if params is None else params
    return build_sampler_state(params, rollout, jnp.int32(0))

  def sampler(self, rollout: RolloutConfig) -> Sampler:
    return _sampler(self.graphdef, rollout.sampling(eos_ids=self.eos_ids, pad_id=self.pad_id,
                                                    logits_top_k=self.vocab_top_k))

  def sample(self, rollout: RolloutConfig, state, key) -> SampleOutput:
    return self.sampler(rollout)(state, self.prompt_BxP, self.valid_BxP, key)

  def learner_scores(self, out: SampleOutput, params=None, temperature: float = 1.0) -> dict:
    """The learner (default: the pair's student) on the sampled tokens: {"logp": [B, R] (masked)} plus, when
    the sampler returned top-k log-probs, per-token vocabulary divergences {"vocab/<name>": [B, R]}."""
    return self._learner_score(self.params if params is None else params, self.prompt_BxP, self.valid_BxP,
                               out.tokens_BxN, out.mask_BxN, out.top_logprobs_BxNxK, out.top_ids_BxNxK,
                               temperature=temperature)

  def learner_logp(self, out: SampleOutput, params=None, temperature: float = 1.0):
    return self.learner_scores(out, params, temperature)["logp"]

  def teacher_logp(self, out: SampleOutput, temperature: float = 1.0):
    return self._teacher_score(self.teacher_state, self.prompt_BxP, self.valid_BxP, out.tokens_BxN, out.mask_BxN,
                               temperature=temperature).logp_BxR

  def prefix_kl(self, out: SampleOutput):
    """Exact KL(learner || teacher) over the vocabulary at every prefix of `out`, [B, R] (temperature 1)."""
    return self._prefix_kl(self.params, self.teacher_state, self.prompt_BxP, self.valid_BxP, out.tokens_BxN,
                           out.mask_BxN)

  def measure(self, rollout: RolloutConfig, key, sampler_params=None, learner_params=None) -> dict[str, float]:
    """Mismatch of `rollout` (built from `sampler_params`, default the pair's student) against the learner.

    Returns token metrics (k3, k1, tv, mult_prob_error, ...) and `vocab/*` divergences, as floats.
    """
    base = self.params if sampler_params is None else sampler_params
    state = self.sampler_state(rollout, base)
    out = self.sample(rollout, state, key)
    scores = self.learner_scores(out, learner_params, rollout.temperature)
    metrics = token_metrics(scores.pop("logp"), out.logprobs_BxN, out.mask_BxN, self.is_cap)
    metrics.update(token_mean(scores, out.mask_BxN))
    return {k: float(v) for k, v in jax.device_get(metrics).items()}


def _learner_tokens(graphdef, state, prompt_BxP, valid_BxP, tokens_BxR, mask_BxR, top_logp_BxRxK, top_ids_BxRxK, *,
                    temperature: float, chunk: int) -> dict:
  model = nnx.merge(graphdef, state)
  arrays = {"hidden": response_hidden(model, prompt_BxP, valid_BxP, tokens_BxR, mask_BxR), "tokens": tokens_BxR}
  if top_logp_BxRxK is not None:
    arrays.update(top_logp=top_logp_BxRxK, top_ids=top_ids_BxRxK)

  def per_chunk(x):
    logits_BxCxV = model.logits(x["hidden"])
    out = {"logp": gather_logp(tempered_log_softmax(logits_BxCxV, temperature), x["tokens"])}
    if "top_logp" in x:
      out.update({f"vocab/{k}": v for k, v in vocab_divergences_topk_per_token(
          logits_BxCxV, x["top_logp"], x["top_ids"]).items()})
    return out

  out = token_map(per_chunk, arrays, chunk)
  out["logp"] = out["logp"] * mask_BxR
  return out


def _prefix_kl(graphdef, teacher_graphdef, state, teacher_state, prompt_BxP, valid_BxP, tokens_BxR, mask_BxR, *,
               chunk: int):
  student, teacher = nnx.merge(graphdef, state), nnx.merge(teacher_graphdef, teacher_state)
  hidden = lambda model: response_hidden(model, prompt_BxP, valid_BxP, tokens_BxR, mask_BxR)
  return exact_reverse_kl(student, teacher, hidden(student), hidden(teacher), chunk)


@functools.lru_cache(maxsize=32)
def _sampler(graphdef, sampling) -> Sampler:
  return Sampler(graphdef, sampling)
