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
from opd_jax.mismatch.metrics import token_metrics, vocab_metrics_topk
from opd_jax.models import load_pretrained, load_tokenizer
from opd_jax.rollout.config import RolloutConfig, build_sampler_state
from opd_jax.rollout.sampler import SampleOutput, Sampler
from opd_jax.objectives.logprobs import score, token_logprobs


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

  @classmethod
  def from_config(cls, config, num_prompts: int, seed: int = 0) -> "Calibration":
    """Held-out prompts of the config's data source (never the training split) and its pair."""
    student = load_pretrained(config.student, config.student_dtype)
    teacher = load_pretrained(config.teacher, config.teacher_dtype)
    tokenizer = load_tokenizer(config.tokenizer or config.student)
    d = config.data
    task = ArithmeticTask(d.min_terms, d.max_terms, d.min_digits, d.max_digits)
    problems = get_problems(d.source, "heldout", num_prompts, d.seed + 1000 + seed, task, d.train_file,
                            d.heldout_file)
    prompts, valid = encode_prompts(tokenizer, problems, d.max_prompt_tokens, d.use_chat_template)
    graphdef, params = nnx.split(student)
    teacher_graphdef, teacher_state = nnx.split(teacher)
    eos = tuple(student.config.eos_token_id) or (tokenizer.eos_token_id,)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    return cls(graphdef, params, teacher_graphdef, teacher_state, tokenizer, problems, prompts, valid, eos, pad,
               student.config.vocab_size, config.objective.is_cap)

  @functools.cached_property
  def _learner_score(self):
    return jax.jit(functools.partial(score, self.graphdef, return_logits=True), static_argnames="temperature")

  @functools.cached_property
  def _teacher_score(self):
    return jax.jit(functools.partial(score, self.teacher_graphdef, return_logits=True),
                   static_argnames="temperature")

  def sampler_state(self, rollout: RolloutConfig, params=None):
    """The sampler's weights for `rollout` (recipe and noise) from `params` (default: the pair's student)."""
    params = self.params if params is None else params
    return build_sampler_state(params, rollout, jnp.int32(0))

  def sampler(self, rollout: RolloutConfig) -> Sampler:
    return _sampler(self.graphdef, rollout.sampling(eos_ids=self.eos_ids, pad_id=self.pad_id,
                                                    logits_top_k=self.vocab_size))

  def sample(self, rollout: RolloutConfig, state, key) -> SampleOutput:
    return self.sampler(rollout)(state, self.prompt_BxP, self.valid_BxP, key)

  def learner_logits(self, out: SampleOutput, params=None):
    return self._learner_score(self.params if params is None else params, self.prompt_BxP, self.valid_BxP,
                               out.tokens_BxN, out.mask_BxN, temperature=1.0)[1]

  def teacher_logp(self, out: SampleOutput, temperature: float = 1.0):
    return self._teacher_score(self.teacher_state, self.prompt_BxP, self.valid_BxP, out.tokens_BxN, out.mask_BxN,
                               temperature=temperature)[0]

  def teacher_logits(self, out: SampleOutput):
    return self._teacher_score(self.teacher_state, self.prompt_BxP, self.valid_BxP, out.tokens_BxN, out.mask_BxN,
                               temperature=1.0)[1]

  def measure(self, rollout: RolloutConfig, key, sampler_params=None, learner_params=None) -> dict[str, float]:
    """Mismatch of `rollout` (built from `sampler_params`, default the pair's student) against the learner.

    Returns token metrics (k3, k1, tv, mult_prob_error, ...) and `vocab/*` divergences, as floats.
    """
    base = self.params if sampler_params is None else sampler_params
    state = self.sampler_state(rollout, base)
    out = self.sample(rollout, state, key)
    logits = self.learner_logits(out, learner_params)
    learner_logp = token_logprobs(logits, out.tokens_BxN, rollout.temperature) * out.mask_BxN
    metrics = token_metrics(learner_logp, out.logprobs_BxN, out.mask_BxN, self.is_cap)
    metrics.update({f"vocab/{k}": v for k, v in vocab_metrics_topk(
        logits, out.top_logprobs_BxNxK, out.top_ids_BxNxK, out.mask_BxN).items()})
    return {k: float(v) for k, v in jax.device_get(metrics).items()}


@functools.lru_cache(maxsize=32)
def _sampler(graphdef, sampling) -> Sampler:
  return Sampler(graphdef, sampling)
