"""How probable the cross-family teacher finds the student's final answers, against its own:

  python -m study.teacher_answer_probe --samples=results/gemma3/chain_run_seed0/samples.jsonl \
      --out=results/gemma3/chain_run_seed0/teacher_answers.json

For each held-out word of the run's last evaluation, the teacher of configs/gemma3_to_smollm2.py (Gemma 3 270M,
prepared) scores four answers in its own two-shot format, each as the config's scoring reads it (the response
prefix " ", the answer, the teacher's end "\\n\\n"): its own greedy answer (results/gemma3/probe.json), the
student's greedy answer at the last step, the English word itself and "chien" (the first answer of the teacher's
two-shot examples). Log-probabilities are teacher-forced sums over the answer's tokens and the end. With
--student (the run's exported student, `<workdir>/export`), the student's own log-probability of its answer in its
chat format is added, of the answer's first line and of the whole response as sampled (with the token that ended
it): how certain it is of what it says. Exit code 2 on bad input.
"""

import json
import os

from absl import flags

from launch import _cli

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SAMPLES = flags.DEFINE_string("samples", None, "A Gemma-pair run's samples.jsonl (its last step is read).")
_PROBE = flags.DEFINE_string("probe", os.path.join(_REPO, "results", "gemma3", "probe.json"),
                             "study.cross_family_probe's file: the teacher's own greedy answers.")
_TEACHER = flags.DEFINE_string("teacher", None, "The prepared teacher (default: the config's).")
_STUDENT = flags.DEFINE_string("student", None, "The run's exported student (optional).")
_OUT = flags.DEFINE_string("out", None, "JSON file for every answer's log-probability and the summary.")


def _logp(model, context: list[int], continuations: list[list[int]]) -> list[float]:
  """Teacher-forced log P(continuation | context) of each continuation's token ids, one padded batch."""
  import jax
  import numpy as np
  rows = [context + c for c in continuations]
  tokens = np.zeros((len(rows), max(map(len, rows))), np.int32)
  for i, r in enumerate(rows):
    tokens[i, :len(r)] = r
  logp = np.asarray(jax.nn.log_softmax(model(jax.numpy.asarray(tokens)).astype("float32"), axis=-1))
  return [float(sum(logp[i, t - 1, r[t]] for t in range(len(context), len(r)))) for i, r in enumerate(rows)]


def _teacher_logp(model, tokenizer, prompt: str, answers: list[str]) -> list[float]:
  """log P(" " + answer + "\n\n" | prompt) in the teacher's format (its tokens after the prompt's)."""
  from opd_jax.errors import InputError
  context = tokenizer.encode(prompt, add_special_tokens=True)
  rows = [tokenizer.encode(prompt + " " + a + "\n\n", add_special_tokens=True) for a in answers]
  if any(r[:len(context)] != context for r in rows):
    raise InputError(f"an answer merged with the teacher prompt's last token ({prompt[-20:]!r}); the probe reads the "
                     "prompt's tokens as context, so that format cannot be scored here")
  return _logp(model, context, [r[len(context):] for r in rows])


def _student_logp(model, tokenizer, question: str, response: str) -> tuple[float, float]:
  """(log P(the answer's first line), log P(the whole response as sampled, its ending included)) under the student,
  after the chat-formatted question."""
  context = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                          tokenize=True)
  context = list(context["input_ids"] if hasattr(context, "keys") else context)
  line = response.split("\n")[0]
  return tuple(_logp(model, context, [tokenizer.encode(text, add_special_tokens=False) for text in (line, response)]))


def run():
  import re
  import statistics
  from configs.gemma3_to_smollm2 import TEACHER_FORMAT, get_config
  from opd_jax.errors import InputError
  from opd_jax.files import check_output_file
  from opd_jax.experiments.files import read_jsonl
  from opd_jax.files import write_json
  from opd_jax.models import load_pretrained, load_tokenizer
  teacher = _TEACHER.value or get_config().teacher
  if not os.path.isdir(str(teacher)):
    raise InputError(f"{teacher} is not a prepared model; run the pair's config once, or launch/prepare_model.py")
  if _STUDENT.value and not os.path.isdir(_STUDENT.value):
    raise InputError(f"--student={_STUDENT.value} is not a directory; pass a run's exported student (<workdir>/export)")
  if _OUT.value:
    check_output_file(_OUT.value, "--out", (_SAMPLES.value, _PROBE.value))
  rows = read_jsonl(_SAMPLES.value, "samples file")
  last = max(r["step"] for r in rows)
  with open(_PROBE.value) as f:
    greedy = {a["prompt"]: a["response"] for a in json.load(f)["results"]["gemma3-270m (base, few-shot)"]["french"]
              ["answers"]}
  model, tokenizer = load_pretrained(str(teacher)), load_tokenizer(str(teacher))
  words = []
  for r in (r for r in rows if r["step"] == last):
    asked = re.search(r"French word for (.+)\?", r["prompt"])
    if asked is None or r["prompt"] not in greedy:
      raise InputError(f"{_SAMPLES.value}: prompt {r['prompt'][:60]!r} is not one of the held-out French words "
                       f"{_PROBE.value} answers; pass the samples.jsonl of a configs/gemma3_to_smollm2.py run")
    english = asked.group(1)
    answers = {"teacher": greedy[r["prompt"]], "student": r["response"].strip().split("\n")[0].strip(),
               "english": english, "chien": "chien"}
    logp = _teacher_logp(model, tokenizer, TEACHER_FORMAT.format(prompt=r["prompt"]), list(answers.values()))
    words.append({"prompt": r["prompt"], "answers": answers, "logp": dict(zip(answers, logp))})
  median = {k: statistics.median(w["logp"][k] for w in words) for k in ("teacher", "student", "english", "chien")}
  summary = {"step": last, "words": len(words), "median_logp": median}
  if _STUDENT.value:
    student, student_tokenizer = load_pretrained(_STUDENT.value), load_tokenizer(_STUDENT.value)
    for w, r in zip(words, (r for r in rows if r["step"] == last)):
      w["student_own_logp"], w["student_own_logp_with_end"] = _student_logp(student, student_tokenizer, w["prompt"],
                                                                            r["response"])
    for key in ("student_own_logp", "student_own_logp_with_end"):
      summary[f"{key}_median"] = statistics.median(w[key] for w in words)
  summary.update({
      "student_at_least_teacher": sum(w["logp"]["student"] >= w["logp"]["teacher"] - 1e-6 for w in words),
      "english_above_teacher": sum(w["logp"]["english"] > w["logp"]["teacher"] for w in words)})
  print(json.dumps(summary, indent=1))
  if _OUT.value:
    write_json(_OUT.value, {"summary": summary, "words": words})


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main, required=("samples",))
