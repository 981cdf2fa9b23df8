"""At the distilled student's greedy loops, does the teacher continue the loop too? (issue 35, repetition)

  python -m study.loops --config=configs/smollm2.py --student=runs/smollm2/export \
      --samples=results/smollm2/run/seed0/samples.jsonl --out=results/smollm2/loops/seed0_step300.json

Reads the student's greedy held-out responses at --step (default: the last evaluation in --samples), re-tokenizes
them, and teacher-forces the student (--student, an HF directory; the pruned student with --step=0) and the
config's teacher on the ones that repeat an 8-token run (study/analysis/loops.py says what is measured).
"""

import os

from absl import flags
from ml_collections import config_flags

from launch import _cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Pair config, e.g. configs/smollm2.py.", lock_config=True)
_STUDENT = flags.DEFINE_string("student", None, "The student HF directory whose responses --samples holds.")
_SAMPLES = flags.DEFINE_string("samples", None, "A run's samples.jsonl (held-out greedy responses).")
_STEP = flags.DEFINE_integer("step", -1, "The evaluation step to read; -1 = the last.")
_OUT = flags.DEFINE_string("out", None, "Write the report here (JSON).")


def run():
  import jax
  import numpy as np

  from opd_jax.errors import InputError
  from opd_jax.files import check_output_file
  from opd_jax.experiments.files import read_jsonl, write_json
  from opd_jax.models import load_pretrained
  from opd_jax.models.tokenizer import encode_prompt, load_tokenizer
  from study.analysis.loops import loop_report

  config = _CONFIG.value
  for role, path in (("teacher", config.teacher), ("--student", _STUDENT.value)):
    if not os.path.isfile(os.path.join(path, "config.json")):
      raise InputError(f"{role} {path!r} is not an HF directory (a run's export/, or the config's prepared student)")
  rows = [r for r in read_jsonl(_SAMPLES.value) if r.get("model") == "student"]
  steps = sorted({r["step"] for r in rows})
  if not steps:
    raise InputError(f"--samples={_SAMPLES.value!r} holds no student responses (a run's samples.jsonl does)")
  step = steps[-1] if _STEP.value < 0 else _STEP.value
  if step not in steps:
    raise InputError(f"--step={step}: --samples has evaluations at steps {steps}")
  if _OUT.value:
    check_output_file(_OUT.value, "--out", (_SAMPLES.value,))
  tokenizer = load_tokenizer(config.teacher)
  models = {"student": load_pretrained(_STUDENT.value), "teacher": load_pretrained(config.teacher)}
  forward = {name: (lambda tokens, m=m: jax.nn.log_softmax(m(tokens)[0], axis=-1)) for name, m in models.items()}
  responses = [(encode_prompt(tokenizer, r["prompt"], config.data.use_chat_template),
                tokenizer.encode(r["response"], add_special_tokens=False)) for r in rows if r["step"] == step]
  score = lambda ids: {name: np.asarray(f(np.asarray([ids]))) for name, f in forward.items()}
  home = os.path.expanduser("~")
  shown = _STUDENT.value.replace(home, "~", 1) if _STUDENT.value.startswith(home) else _STUDENT.value
  report = {"config": config.pair, "student": shown, "samples": _SAMPLES.value, "step": step,
            **loop_report(responses, score)}
  print(f"{report['looping']} of {report['responses']} greedy responses at step {step} repeat an 8-token run")
  for where in ("in_loop", "elsewhere"):
    for name, s in report[where].items():
      print(f"  {where:<9} {name:<7} p(greedy token) mean {s.get('mean', float('nan')):.3f} median "
            f"{s.get('median', float('nan')):.3f} over {s['tokens']} tokens")
  if _OUT.value:
    write_json(_OUT.value, report)
    print(f"wrote {_OUT.value}")


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main, required=("config", "student", "samples"))
