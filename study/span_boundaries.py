"""How a cross-tokenizer pair's views split real answers into spans, settled-only against corrected boundaries:

  python -m study.span_boundaries --pair=gemma3_to_smollm2 \
      --samples=results/gemma3/marginal_run_seed0/samples.jsonl --step=0 --out=results/gemma3/boundaries.json

Each sample's response (the student's greedy answer at --step, as a run's samples.jsonl ships it) is tokenized by
the student, ended with its EOS, and read by the run's own CrossTokenizerView twice: with spans ending only at
settled boundaries, and with corrected boundaries (opd_jax/crosstok/cover.py). Reports each view's alignment
counts (opd_jax.crosstok.view.STATS) and student tokens per scored span. Tokenizers only: no model runs.
"""

from absl import flags

from launch import _cli

_PAIR = flags.DEFINE_string("pair", "gemma3_to_smollm2", "The pair: configs/<pair>.py (its teacher, student and "
                            "cross_tokenizer section).")
_SAMPLES = flags.DEFINE_string("samples", None, "A run's samples.jsonl (its responses are the texts read).")
_STEP = flags.DEFINE_integer("step", 0, "Which evaluation's samples.")
_OUT = flags.DEFINE_string("out", None, "JSON file to write.")


def measure(config, responses: list[str]) -> dict:
  import dataclasses

  import numpy as np
  from opd_jax.crosstok.scoring import _covers
  from opd_jax.crosstok.view import CrossTokenizerView
  from opd_jax.models import load_tokenizer
  from opd_jax.spec import RunSpec
  spec = RunSpec.from_config(config)
  student, teacher = load_tokenizer(config.student), load_tokenizer(config.teacher)
  eos = (student.eos_token_id,)
  ids = [student.encode(text, add_special_tokens=False) + list(eos) for text in responses]
  width = max(map(len, ids))
  response = np.zeros((len(ids), width), np.int32)
  mask = np.zeros((len(ids), width), np.float32)
  for b, row in enumerate(ids):
    response[b, :len(row)], mask[b, :len(row)] = row, 1.0
  prompt, length = spec.cross.lengths(spec.data.max_prompt_tokens, spec.rollout.max_new_tokens)
  out = {}
  for mode in ("settled", "corrected"):
    covers = _covers(dataclasses.replace(spec.cross, boundaries=mode), student, teacher, eos,
                     spec.vocab.student_vocab_size, spec.vocab.teacher_vocab_size)
    view = CrossTokenizerView(student, teacher, spec.cross.teacher_format, [""], eos,
                              teacher_end=spec.cross.teacher_end, response_prefix=spec.cross.teacher_response_prefix,
                              max_prompt=prompt, max_response=max(length, 4 * width), covers=covers)
    _, stats = view.build(np.zeros(len(ids), np.int64), response, mask)
    out[mode] = {**stats, "student_tokens_per_span": stats["tokens_scored"] / max(stats["spans_scored"], 1)}
  return out


def run():
  import json
  from configs import common
  from opd_jax.errors import InputError
  from opd_jax.files import check_output_file
  from opd_jax.experiments.files import read_jsonl, write_json
  from opd_jax.experiments.run_identity import code_version
  rows = [r for r in read_jsonl(_SAMPLES.value, "samples file") if r.get("step") == _STEP.value
          and r.get("model", "student") == "student"]
  if not rows:
    raise InputError(f"{_SAMPLES.value} has no student sample at step {_STEP.value}; give --step=<an evaluated step>")
  check_output_file(_OUT.value, "--out", (_SAMPLES.value,))
  config = common.config_for(_PAIR.value)
  result = {"pair": _PAIR.value, "samples": _SAMPLES.value, "step": _STEP.value, "responses": len(rows),
            "code_version": code_version(), **measure(config, [r["response"] for r in rows])}
  write_json(_OUT.value, result)
  for mode in ("settled", "corrected"):
    print(f"{mode:>9}: {json.dumps({k: round(v, 3) for k, v in result[mode].items()})}")


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main, required=("samples", "out"))
