"""The off-policy baseline of the cross-family pair: fine-tune the student on the teacher's own answers.

  python -m study.teacher_sft_baseline --out=results/gemma3/teacher_sft_baseline.json

The teacher of configs/gemma3_to_smollm2.py (Gemma 3 270M, two-shot) answers the 206 training words greedily (the
first line of its answer); the student (SmolLM2-135M-Instruct) is fine-tuned on those answers in its chat format,
each ended by its end-of-turn token (sequence-level distillation, Kim & Rush 2016: what an off-policy recipe
learns from this teacher on these words), then answers the 50 held-out words greedily. Reports the teacher's
answers that repeat the English word (right for cognates such as "animal", wrong for "ball" or "clock") and the
held-out accuracy and English-word share before and after. Exit code 2 on bad input.
"""

import os
import time

from absl import flags

from launch import _cli

_TEACHER = flags.DEFINE_string("teacher", None, "The prepared teacher (default: the config's).")
_STUDENT = flags.DEFINE_string("student", None, "The prepared student (default: the config's).")
_STEPS = flags.DEFINE_integer("steps", 40, "Fine-tuning steps (16 answers each: about 3 passes over the 206).")
_LR = flags.DEFINE_float("learning_rate", 3e-5, "Peak learning rate (5 warmup steps, cosine to a tenth).")
_BATCH = flags.DEFINE_integer("batch_size", 16, "Answers per step.")
_SEED = flags.DEFINE_integer("seed", 0, "Order of the answers.")
_OUT = flags.DEFINE_string("out", None, "JSON file for the measurements and every answer.")


def _word(prompt: str) -> str:
  return prompt.rsplit(" ", 1)[1].rstrip("?")


def _grade(prompts, answers, texts) -> dict:
  """Held-out accuracy (the answer in the first line, accents and case ignored) and the share that is the English
  word itself."""
  from study._greedy_answers import grade, plain
  first = [t.strip().split("\n")[0] for t in texts]
  graded = grade(prompts, answers, first, 0.0)
  english = [plain(t).strip(" .'\"") == plain(_word(p)) for p, t in zip(prompts, first)]
  return {"accuracy": graded["correct"] / graded["asked"], "english_word": sum(english) / len(english),
          "answers": graded["answers"]}


def _fine_tune(student: str, prompts: list[str], answers: list[str], out_dir: str) -> list[float]:
  """The student fine-tuned on (its chat prompt, answer + end of turn), written to out_dir; the loss per step."""
  import numpy as np
  import optax
  from flax import nnx
  from opd_jax.models import load_pretrained, load_tokenizer
  from opd_jax.train.export import export_student
  from opd_jax.train.sft import make_sft_step
  tokenizer, model = load_tokenizer(student), load_pretrained(student)
  graphdef, params = nnx.split(model)
  end = tokenizer.eos_token_id
  chat = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
          for p in prompts]
  chat = [list(x["input_ids"] if hasattr(x, "keys") else x) for x in chat]
  responses = [tokenizer.encode(a, add_special_tokens=False) + [end] for a in answers]
  P, R = max(map(len, chat)), max(map(len, responses))

  def batch(rows):  # prompts left-padded, responses right-padded, as the trainer's batches
    prompt, valid = np.zeros((len(rows), P), np.int32), np.zeros((len(rows), P), bool)
    response, mask = np.zeros((len(rows), R), np.int32), np.zeros((len(rows), R), np.float32)
    for j, i in enumerate(rows):
      prompt[j, P - len(chat[i]):], valid[j, P - len(chat[i]):] = chat[i], True
      response[j, :len(responses[i])], mask[j, :len(responses[i])] = responses[i], 1.0
    return prompt, valid, response, mask

  steps = _STEPS.value
  optimizer = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, _LR.value, 5, steps, _LR.value / 10),
                          weight_decay=0.0)
  opt_state, step = optimizer.init(params), make_sft_step(graphdef, optimizer)
  rng, losses = np.random.default_rng(_SEED.value), []
  for _ in range(steps):
    params, opt_state, loss = step(params, opt_state, batch(rng.choice(len(chat), _BATCH.value, replace=False)))
    losses.append(float(loss))
  export_student(graphdef, params, student, out_dir, student, dtype="float32")
  return losses


def run():
  import tempfile
  from configs.gemma3_to_smollm2 import FRENCH, TEACHER_FORMAT, get_config
  from opd_jax.data.problems import load_jsonl
  from opd_jax.errors import InputError
  from opd_jax.files import check_output_file
  from study._greedy_answers import answers, plain
  config = get_config()
  teacher, student = _TEACHER.value or config.teacher, _STUDENT.value or config.student
  for flag, path in (("teacher", teacher), ("student", student)):
    if not os.path.isdir(str(path)):
      raise InputError(f"--{flag}={path} is not a prepared model; run configs/gemma3_to_smollm2.py once, or "
                       "launch/prepare_model.py")
  if _STEPS.value < 1 or _BATCH.value < 1:
    raise InputError(f"--steps={_STEPS.value} and --batch_size={_BATCH.value} must be >= 1")
  if _OUT.value:
    check_output_file(_OUT.value, "--out")
  train = [p.prompt for p in load_jsonl(os.path.join(FRENCH, "train.jsonl"))]
  heldout = load_jsonl(os.path.join(FRENCH, "heldout.jsonl"))
  held_prompts, held_answers = [p.prompt for p in heldout], [p.answer for p in heldout]
  start = time.time()
  taught, _ = answers(teacher, train, False, TEACHER_FORMAT, 12)
  copies = sum(plain(t) == plain(_word(p)) for p, t in zip(train, taught))
  before = _grade(held_prompts, held_answers, answers(student, held_prompts, True, "", 32)[0])
  with tempfile.TemporaryDirectory() as tuned:
    losses = _fine_tune(student, train, taught, tuned)
    after = _grade(held_prompts, held_answers, answers(tuned, held_prompts, True, "", 32)[0])
  report = {"teacher": teacher, "student": student, "steps": _STEPS.value, "learning_rate": _LR.value,
            "batch_size": _BATCH.value, "seed": _SEED.value, "seconds": round(time.time() - start, 1),
            "teacher_train_answers": [{"prompt": p, "response": t} for p, t in zip(train, taught)],
            "teacher_english_word": copies / len(train), "loss_first": losses[0], "loss_last": losses[-1],
            "before": before, "after": after}
  print(f"teacher repeats the English word in {copies} of {len(train)} training answers; student held-out accuracy "
        f"{before['accuracy']:.2f} -> {after['accuracy']:.2f}, English word {before['english_word']:.2f} -> "
        f"{after['english_word']:.2f} ({report['seconds']:.0f} s)")
  if _OUT.value:
    from opd_jax.files import write_json
    write_json(_OUT.value, report)


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
