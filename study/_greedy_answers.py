"""Greedy answers of a prepared model to a list of questions, in its chat format or a few-shot template, the
grading text they are compared in, and their grades (study/cross_family_probe.py, study/base_student_probe.py,
study/teacher_sft_baseline.py)."""

import time

# Two solved capitals questions, then the question: what a base model needs to answer in one line.
FEW_SHOT = ("Q: What is the capital of France?\nA: Paris\n\nQ: What is the capital of Japan?\nA: Tokyo\n\n"
            "Q: {prompt}\nA:")


def plain(text: str) -> str:
  """Lower case without accents (œ as oe), for grading translations."""
  import unicodedata
  text = text.lower().replace("œ", "oe")
  return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))


def grade(prompts: list[str], answers: list[str], texts: list[str], seconds: float) -> dict:
  """Greedy answers graded by "contains" (plain text): the counts (correct, asked, empty) and every answer."""
  right = [plain(a) in plain(t) for a, t in zip(answers, texts)]
  return {"correct": sum(right), "asked": len(right), "empty": sum(not t for t in texts), "seconds": round(seconds, 1),
          "answers": [{"prompt": p, "answer": a, "response": t, "correct": ok}
                      for p, a, t, ok in zip(prompts, answers, texts, right)]}


def answers(path: str, prompts: list[str], chat: bool, template: str, new_tokens: int) -> tuple[list[str], float]:
  """(greedy answers, seconds): in the model's chat format, or else in `template` (a few-shot prompt with
  {prompt}) cut at its first line, 32 prompts a batch."""
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
