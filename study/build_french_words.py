"""Builds the embedded English -> French word prompts of the cross-family pair (configs/gemma3_to_smollm2.py):

  python -m study.build_french_words     # writes opd_jax/assets/french/{train,heldout}.jsonl

Training prompts ask for the French word of study/_french_words.py TRAIN_WORDS (no answers: OPD's teacher scores the student's own
answers); held-out prompts ask for its FRENCH (common words with one usual translation, graded by `contains`: the
French word among the words of the response's first line, case and accents ignored). The two lists share no
word, and neither holds "dog" or "house" (the teacher's two-shot examples). Deterministic.
"""

import json
import os

from absl import flags

from launch import _cli
from study._french_words import FRENCH as HELDOUT, TRAIN_WORDS

_OUT = flags.DEFINE_string("out", None, "Output folder (default: opd_jax/assets/french).")
PROMPT = "What is the French word for {word}?"




def build():
  from opd_jax.errors import InputError
  out = _OUT.value or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "opd_jax",
                                   "assets", "french")
  shared = sorted(set(TRAIN_WORDS) & set(HELDOUT) | ({"dog", "house"} & (set(TRAIN_WORDS) | set(HELDOUT))))
  if shared or len(set(TRAIN_WORDS)) != len(TRAIN_WORDS):
    raise InputError(f"study/_french_words.py: the word lists overlap or repeat ({shared}); fix them")
  if os.path.exists(out) and not os.path.isdir(out):
    raise InputError(f"--out={out!r} is a file; give a folder")
  os.makedirs(out, exist_ok=True)
  rows = {"train": [{"prompt": PROMPT.format(word=w), "source": "french"} for w in TRAIN_WORDS],
          "heldout": [{"prompt": PROMPT.format(word=w), "answer": fr, "grader": "contains", "source": "french"}
                      for w, fr in HELDOUT.items()]}
  for split, items in rows.items():
    with open(os.path.join(out, f"{split}.jsonl"), "w", encoding="utf-8") as f:
      f.writelines(json.dumps(item, ensure_ascii=False) + "\n" for item in items)
    print(f"{split}: {len(items)} prompts -> {out}/{split}.jsonl")


def main(argv):
  del argv
  _cli.run_or_exit(build)


if __name__ == "__main__":
  _cli.run(main)
