"""Rebuild the embedded chat prompt set (opd_jax/assets/chat/{train,heldout}.jsonl) from its sources.

  python -m study.build_chat_prompts                     # from sources.json as it is (deterministic)
  python -m study.build_chat_prompts --teacher=DIR       # first re-measure which capitals the teacher knows

With --teacher, the teacher answers every "What is the capital of X?" greedily (chat template, 24 tokens) and
sources.json's "teacher_known_capitals" becomes the countries it names correctly: only those questions are
graded (opd_jax/data/chat_prompts.py). The shipped list was measured on SmolLM2-135M-Instruct as
configs/smollm2.py prepares it. Exit code 2 on bad input (one `error:` line).
"""

import json
import os

from absl import flags

from launch import _cli

_TEACHER = flags.DEFINE_string("teacher", None, "HF model dir whose known capitals decide which questions are graded.")


def run():
  from opd_jax import files
  from opd_jax.data import chat_prompts
  if _TEACHER.value:
    from opd_jax.data.task import Problem
    from opd_jax.models import read_hf_config
    from opd_jax.prepare.facts import answered_correctly
    read_hf_config(_TEACHER.value)  # a bad directory is an error before anything is measured
    questions = chat_prompts.capital_questions()
    graded = answered_correctly(_TEACHER.value, [Problem(q, capital, grader="contains")
                                                 for _, capital, q in questions])
    known = [country for (country, _, _), (ok, _) in zip(questions, graded) if ok]
    path = os.path.join(chat_prompts.ASSET_DIR, "sources.json")
    with open(path, encoding="utf-8") as f:
      sources = json.load(f)
    sources["teacher_known_capitals"] = known
    files.write_json(path, sources, indent=1, ensure_ascii=False)
    print(f"the teacher names {len(known)} of {len(questions)} capitals correctly; wrote {path}")
  counts = chat_prompts.write()
  print(f"wrote {counts['train']} training and {counts['heldout']} held-out prompts to {chat_prompts.ASSET_DIR}")


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
