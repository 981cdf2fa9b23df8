"""The other direction of the cross-family pair, measured before building it: can the instruct model (SmolLM2-135M-
Instruct, in its chat format) teach the base model (Gemma 3 270M) to answer questions asked without examples?

  python -m study.base_student_probe --out=results/gemma3/base_student_probe.json
  python -m study.base_student_probe --gemma=<run>/export --out=...   # the same, for a distilled Gemma student

Greedy answers to the capitals questions of the chat prompt set that have an answer (training and held-out splits
reported apart), graded by "contains" (case and accents ignored), each answer its first line:
  - Gemma in the zero-shot formats a student could be prompted in (FORMATS: no examples, so what it does there is
    its own behaviour, not a copy of a demonstration), and two-shot for what it knows;
  - SmolLM2 in its chat format (the teacher).
A format where Gemma knows the capital (two-shot) but does not answer it zero-shot is a behaviour a teacher can
give it. Exit code 2 on bad input.
"""

import os

from absl import flags

from launch import _cli
from study._greedy_answers import FEW_SHOT

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MODELS = os.path.join(os.path.expanduser("~"), ".cache", "opd_jax", "models")
_GEMMA = flags.DEFINE_string("gemma", os.path.join(_MODELS, "gemma3-270m"), "Gemma 3 270M, prepared.")
_SMOLLM = flags.DEFINE_string("smollm", os.path.join(_MODELS, "smollm2-135m-instruct"), "SmolLM2, prepared.")
_OUT = flags.DEFINE_string("out", None, "JSON file for the measured accuracies and every answer (optional).")

# Zero-shot student formats (data.prompt_format): the question alone on its line, and a bare Q/A frame.
FORMATS = {"question line": "{prompt}\n", "Q/A": "Q: {prompt}\nA:"}


def run():
  from opd_jax.data.problems import load_jsonl
  from opd_jax.errors import InputError
  from opd_jax.files import check_output_file
  from study import _greedy_answers as greedy_answers
  for path in (_GEMMA.value, _SMOLLM.value):
    if not os.path.isdir(path):
      raise InputError(f"{path} is not a prepared model; prepare it with launch/prepare_model.py (module docstring)")
  if _OUT.value:
    check_output_file(_OUT.value, "--out")
  chat = os.path.join(_REPO, "opd_jax", "assets", "chat")
  splits = {split: [p for p in load_jsonl(os.path.join(chat, f"{split}.jsonl")) if p.answer is not None]
            for split in ("train", "heldout")}
  runs = {f"gemma3-270m zero-shot, {name}": (_GEMMA.value, False, template) for name, template in FORMATS.items()}
  runs["gemma3-270m two-shot"] = (_GEMMA.value, False, FEW_SHOT)
  runs["smollm2-135m-instruct chat (the teacher)"] = (_SMOLLM.value, True, "")
  report = {"formats": {name: template for name, (_, _, template) in runs.items()},
            "models": {name: path for name, (path, _, _) in runs.items()}, "results": {}}
  for name, (path, is_chat, template) in runs.items():
    for split, problems in splits.items():
      prompts = [p.prompt for p in problems]
      texts, seconds = greedy_answers.answers(path, prompts, is_chat, template, 32)
      graded = greedy_answers.grade(prompts, [p.answer for p in problems], texts, seconds)
      report["results"].setdefault(name, {})[split] = graded
      print(f"{name:44s} {split:8s} {graded['correct']:3d} / {graded['asked']:3d} correct, {graded['empty']:3d} empty "
            f"({seconds:.0f} s)")
  if _OUT.value:
    from opd_jax.files import write_json
    write_json(_OUT.value, report)


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
