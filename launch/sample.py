"""Sample from a checkpoint through the rollout engine, with any mismatch knob.

  python launch/sample.py --checkpoint=DIR (--prompt=TEXT | --prompt_ids=1,2,3) --max_new_tokens=N
      --temperature=T --weights={none,bf16,int8,fp8} --kv_cache={native,bf16,int8,fp8} --noise=SIGMA --seed=S [--json]
      [--engine=static|paged]

With --json it prints one JSON object {"tokens": [new ids], "logprobs": [...]}: log-probs of the distribution
each token was drawn from (temperature / top-k / top-p applied; plain softmax for temperature 0). Otherwise it
prints the decoded text. --prompt_ids with --json needs no tokenizer files. EOS comes from the checkpoint's
config.json / generation_config.json. --engine=paged decodes with the paged KV cache (opd_jax/rollout/engine.py):
greedy output is the static engine's; sampled output differs (the request is drawn under fold_in(key(seed), 0)).
"""

import json

from absl import flags

from launch import _cli
from opd_jax.errors import InputError

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "HF checkpoint directory.")
_PROMPT = flags.DEFINE_string("prompt", None, "Prompt text (needs tokenizer files in the checkpoint).")
_PROMPT_IDS = flags.DEFINE_list("prompt_ids", None, "Prompt token ids, e.g. 1,2,3.")
_CHAT = flags.DEFINE_bool("chat_template", False, "Wrap --prompt as a user turn with the chat template.")
_FORMAT = flags.DEFINE_string("prompt_format", "", "Render --prompt in this format instead: 'chat', 'plain' or a "
                              "template with {prompt} (the run's data.prompt_format).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens to generate at most.")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature; 0 = greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Top-k filter; 0 = off.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus filter; 1 = off.")
_WEIGHTS = flags.DEFINE_string("weights", "none", "Weight recipe: none | bf16 | int8 | int4 | fp8 | fp8_e5m2 | fp8_tensor.")
_KV = flags.DEFINE_string("kv_cache", "native", "KV cache dtype: native | bf16 | int8 | int4 | fp8 | fp8_e5m2.")
_NOISE = flags.DEFINE_float("noise", 0.0, "Relative Gaussian weight noise sigma.")
_DTYPE = flags.DEFINE_string("dtype", "float32", "Parameter dtype: float32 | bfloat16.")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed (sampling and noise).")
_JSON = flags.DEFINE_bool("json", False, "Print {'tokens', 'logprobs'} as one JSON object.")
_ENGINE = flags.DEFINE_enum("engine", "static", ["static", "paged"], "Decoding engine: static batch or paged KV "
                            "cache with continuous batching.")


def sample():
  import jax
  import numpy as np
  from flax import nnx

  from opd_jax.data import char_tokenizer
  from opd_jax.models.prompt_format import PromptFormat
  from opd_jax.models import load_pretrained, load_tokenizer
  from opd_jax.models.finite import check_finite
  from opd_jax.models.tokenizer import encode_prompt
  from opd_jax.rollout.config import RolloutConfig, build_sampler_state
  from opd_jax.rollout.engine import engine_config
  from opd_jax.rollout.paged_sampler import PagedSampler
  from opd_jax.rollout.sampler import Sampler, left_pad

  if (_PROMPT.value is None) == (_PROMPT_IDS.value is None):
    raise InputError("give exactly one of --prompt or --prompt_ids")
  rollout = RolloutConfig(weights=_WEIGHTS.value, kv_cache=_KV.value, noise_sigma=_NOISE.value,
                          noise_seed=_SEED.value, temperature=_TEMPERATURE.value, top_k=_TOP_K.value,
                          top_p=_TOP_P.value, max_new_tokens=_MAX_NEW.value, engine=_ENGINE.value)
  model = load_pretrained(_CHECKPOINT.value, _DTYPE.value)
  check_finite(nnx.state(model), _CHECKPOINT.value)
  tokenizer = None
  if _PROMPT.value is not None or not _JSON.value:
    tokenizer = load_tokenizer(_CHECKPOINT.value)
  if _PROMPT_IDS.value is not None:
    try:
      ids = [int(i) for i in _PROMPT_IDS.value]
    except ValueError:
      raise InputError(f"--prompt_ids must be comma-separated integers, got {','.join(_PROMPT_IDS.value)!r}") from None
    if not ids or min(ids) < 0 or max(ids) >= model.config.vocab_size:
      raise InputError(f"--prompt_ids must be non-empty ids in [0, {model.config.vocab_size})")
  else:
    if char_tokenizer.is_char_tokenizer(tokenizer):
      char_tokenizer.check_text(_PROMPT.value, "--prompt")
    if _FORMAT.value:
      PromptFormat(_FORMAT.value, tokenizer, "--prompt_format")  # names this flag if it does not render
    ids = encode_prompt(tokenizer, _PROMPT.value, _CHAT.value, _FORMAT.value)
  limit = model.config.max_position_embeddings
  if len(ids) + _MAX_NEW.value > limit:
    raise InputError(f"prompt ({len(ids)} tokens) + --max_new_tokens={_MAX_NEW.value} exceeds the model's "
                     f"max_position_embeddings {limit}; shorten the prompt or lower --max_new_tokens")
  graphdef, state = nnx.split(model)
  rollout.validate_for(state)
  eos = tuple(model.config.eos_token_id) or ((tokenizer.eos_token_id,) if tokenizer is not None else ())
  pad = model.config.pad_token_id if model.config.pad_token_id is not None else (eos[0] if eos else 0)
  tokens, valid = left_pad([ids], pad)
  sampler_state = build_sampler_state(state, rollout, np.int32(0))
  sampling = rollout.sampling(eos_ids=eos, pad_id=pad)
  sampler = (PagedSampler(graphdef, sampling, engine_config(rollout, len(ids), 1)) if rollout.engine == "paged"
             else Sampler(graphdef, sampling))
  out = sampler(sampler_state, tokens, valid, jax.random.key(_SEED.value))
  n = int(np.asarray(out.mask_BxN)[0].sum())
  new_tokens = np.asarray(out.tokens_BxN)[0, :n].tolist()
  logprobs = np.asarray(out.logprobs_BxN)[0, :n].tolist()
  if _JSON.value:
    print(json.dumps({"tokens": new_tokens, "logprobs": logprobs}))
  else:
    print(tokenizer.decode(new_tokens, skip_special_tokens=True))


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(sample)


if __name__ == "__main__":
  _cli.run(main, required=("checkpoint",))
