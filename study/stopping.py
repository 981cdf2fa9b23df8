"""Why a student stops (or not): end-of-turn probabilities and OPD's push on the EOS logit, per prompt kind.

  python -m study.stopping --config=configs/smollm2.py --prompts=32 --out=results/smollm2/stopping.json
  python -m study.stopping --config=configs/smollm2.py --student=runs/smollm2/export   # a trained student

On the first --prompts graded prompts (with an answer: capitals) and the first --prompts open prompts of the
config's --split, with the config's prompt format, response cap and rollout temperature: the student's rollouts,
the teacher's greedy and the student's greedy responses, each scored by both models (opd_jax/train/stopping.py:
mean length, share at the cap, both EOS probabilities where responses end, and the exact reverse-KL gradient on
the student's EOS logit; positive = OPD lowers it). The pair must be prepared (a run of the config does it).
"""

import os

from absl import flags
from ml_collections import config_flags

from launch import _cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Pair config, e.g. configs/smollm2.py.", lock_config=True)
_STUDENT = flags.DEFINE_string("student", None, "A student HF directory to study instead of the config's.")
_PROMPTS = flags.DEFINE_integer("prompts", 32, "Prompts of each kind (graded, open).")
_SPLIT = flags.DEFINE_enum("split", "train", ["train", "heldout"], "Which prompt file of the config.")
_OUT = flags.DEFINE_string("out", None, "Write the report here (JSON).")


def run():
  import json

  from opd_jax.data.batching import encode_prompts
  from opd_jax.data.problems import load_jsonl
  from opd_jax.errors import InputError
  from opd_jax.files import check_output_file
  from opd_jax.experiments.files import write_json
  from opd_jax.models import load_pretrained
  from opd_jax.models.tokenizer import load_tokenizer
  from opd_jax.train.stopping import stopping_study

  config = _CONFIG.value
  d, student_dir = config.data, _STUDENT.value or config.student
  if _PROMPTS.value < 1:
    raise InputError(f"--prompts={_PROMPTS.value} must be >= 1")
  if d.source != "jsonl":
    raise InputError(f"--config: data.source={d.source!r}; this study reads JSONL prompt files (data.source=jsonl)")
  for role, path in (("teacher", config.teacher), ("student", student_dir)):
    if not os.path.isfile(os.path.join(path, "config.json")):
      raise InputError(f"{role} {path!r} is not an HF directory; prepare the pair first (a run of the config does)")
  if _OUT.value:
    check_output_file(_OUT.value, "--out")
  problems = load_jsonl(d.train_file if _SPLIT.value == "train" else d.heldout_file)
  tokenizer = load_tokenizer(config.teacher)
  student, teacher = load_pretrained(student_dir), load_pretrained(config.teacher)
  eos_id = tokenizer.eos_token_id
  pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
  report = {"config": config.pair, "student": student_dir, "split": _SPLIT.value, "eos_id": eos_id,
            "max_new_tokens": config.rollout.max_new_tokens, "temperature": config.rollout.temperature}
  for kind, chosen in (("graded", [p for p in problems if p.answer][:_PROMPTS.value]),
                       ("open", [p for p in problems if not p.answer][:_PROMPTS.value])):
    if not chosen:
      continue
    prompts, valid = encode_prompts(tokenizer, chosen, d.max_prompt_tokens, d.use_chat_template)
    report[kind] = stopping_study(student, teacher, prompts, valid, max_new_tokens=config.rollout.max_new_tokens,
                                  temperature=config.rollout.temperature, eos_id=eos_id, pad_id=pad_id,
                                  seed=config.seed)
    for name, r in report[kind].items():
      print(f"{kind:<6} {name:<16} {json.dumps(r)}")
  if _OUT.value:
    write_json(_OUT.value, report)
    print(f"wrote {_OUT.value}")


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main, required=("config",))
