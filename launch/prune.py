"""Depth-prune a model: drop whole layers chosen by their measured importance, write the smaller HF directory.

  python launch/prune.py --model=DIR --keep_layers=N --out=DIR [--prompts_file=opd_jax/assets/chat/train.jsonl]
      [--prompts=16] [--max_new_tokens=48] [--max_prompt_tokens=64] [--chat_template] [--drops_per_round=1]

A layer's importance is the KL from the full model to the model without it, on the full model's own greedy
responses to calibration prompts; layers are removed greedily (opd_jax/prepare/prune.py). Prints what it dropped
and why, and writes DIR/prune.json with the same. Exit code 2 on bad input (one `error:` line).
"""

import os

from absl import flags

from launch import _cli

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MODEL = flags.DEFINE_string("model", None, "HF checkpoint directory to prune.")
_KEEP = flags.DEFINE_integer("keep_layers", None, "Layers to keep.")
_OUT = flags.DEFINE_string("out", None, "HF directory to write (must not exist, or be this same pruning).")
_PROMPTS_FILE = flags.DEFINE_string("prompts_file", os.path.join(_REPO, "opd_jax", "assets", "chat", "train.jsonl"),
                                    "JSONL calibration prompts (a 'prompt' per row).")
_PROMPTS = flags.DEFINE_integer("prompts", 16, "Calibration prompts (the file's first N).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 48, "Length of the full model's greedy calibration responses.")
_MAX_PROMPT = flags.DEFINE_integer("max_prompt_tokens", 64, "Prompts are left-padded (or cut) to this length.")
_CHAT = flags.DEFINE_bool("chat_template", True, "Wrap prompts as a user turn with the tokenizer's chat template.")
_DROPS = flags.DEFINE_integer("drops_per_round", 1, "Layers dropped per scoring round (1 = greedy).")


def run():
  from opd_jax.data.problems import load_jsonl
  from opd_jax.errors import InputError
  from opd_jax.prepare.prune import prune
  for flag in (_KEEP, _PROMPTS, _MAX_NEW, _MAX_PROMPT, _DROPS):  # flags first: no file is read before these
    if flag.value < 1:
      raise InputError(f"--{flag.name} must be a positive integer, got {flag.value}")
  problems = load_jsonl(_PROMPTS_FILE.value)[:_PROMPTS.value]
  report = prune(_MODEL.value, _OUT.value, _KEEP.value, problems, max_prompt_tokens=_MAX_PROMPT.value,
                 max_new_tokens=_MAX_NEW.value, use_chat_template=_CHAT.value, drops_per_round=_DROPS.value,
                 log=lambda message: print(message, flush=True))
  if report["skipped"]:
    print(f"{_OUT.value} already holds this pruning; nothing to do")
    return
  print(f"kept {len(report['kept'])} of {report['layers']} layers {report['kept']}; KL to the full model on the "
        f"calibration responses {report['kl_to_source']:.4f}; wrote {_OUT.value} in {report['seconds']:.0f} s")
  print("layer  KL removed alone  KL removed with the earlier drops")
  for row in report["dropped"]:
    print(f"{row['layer']:>5}  {row['kl_alone']:>16.4f}  {row['kl_removed_with_earlier']:>33.4f}")


def main(argv):
  del argv
  _cli.log_devices()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main, required=("model", "keep_layers", "out"))
