"""Layer-selection schedules side by side: how close each pruned model stays to the full one, and what it costs.

  python launch/bench/prune.py --model=DIR --keep_layers=20 [--drops_per_round=10,5,1] [--prompts=16]
      [--check_prompts=32] [--out=results/smollm2_prune.json]

For each schedule (layers dropped per scoring round; 1 = greedy, >= the layers to drop = one-shot), it chooses
the layers on the first --prompts training prompts (as launch/prune.py does) and reports the KL from the full
model to the pruned one on those calibration responses and on the full model's greedy responses to
--check_prompts other training prompts, with the cost of the choice: layer subsets scored (each one forward
over the calibration set; independent of the machine's load) and seconds. Writes nothing but --out.
"""

import os
import time

from absl import flags

from launch import _cli

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_MODEL = flags.DEFINE_string("model", None, "HF checkpoint directory to prune.")
_KEEP = flags.DEFINE_integer("keep_layers", None, "Layers to keep.")
_SCHEDULES = flags.DEFINE_list("drops_per_round", ["10", "5", "1"], "Schedules to compare.")
_PROMPTS_FILE = flags.DEFINE_string("prompts_file", os.path.join(_REPO, "opd_jax", "assets", "chat", "train.jsonl"),
                                    "JSONL prompts: calibration from the start, the check set after --check_offset.")
_PROMPTS = flags.DEFINE_integer("prompts", 16, "Calibration prompts (the file's first N).")
_CHECK = flags.DEFINE_integer("check_prompts", 32, "Check prompts (from --check_offset on).")
_CHECK_OFFSET = flags.DEFINE_integer("check_offset", 200, "Where the check prompts start in the file.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 48, "Length of the full model's greedy responses.")
_OUT = flags.DEFINE_string("out", None, "JSON file for the rows (optional).")


def run():
  import jax.numpy as jnp
  import numpy as np
  from opd_jax.data.problems import load_jsonl
  from opd_jax.errors import InputError
  from opd_jax.files import check_output_file
  from opd_jax.models import load_pretrained, load_tokenizer
  from opd_jax.prepare.prune import CalibrationSet, LayerScorer, choose_layers
  try:
    schedules = [int(s) for s in _SCHEDULES.value]
  except ValueError:
    raise InputError(f"--drops_per_round must be comma-separated integers, got {_SCHEDULES.value}") from None
  if _OUT.value:
    check_output_file(_OUT.value, "--out")
  model = load_pretrained(_MODEL.value, jnp.float32, attention="xla", scan_layers=True)
  layers = model.config.num_hidden_layers
  if not 1 <= _KEEP.value < layers or min(schedules) < 1:
    raise InputError(f"need 1 <= --keep_layers < {layers} and --drops_per_round >= 1")
  tokenizer, problems = load_tokenizer(_MODEL.value), load_jsonl(_PROMPTS_FILE.value)
  make = lambda rows: CalibrationSet.make(model, tokenizer, rows, max_prompt_tokens=64, max_new_tokens=_MAX_NEW.value,
                                          use_chat_template=True, batch_size=16)
  calibration = make(problems[:_PROMPTS.value])
  check = LayerScorer(model, make(problems[_CHECK_OFFSET.value:_CHECK_OFFSET.value + _CHECK.value]))
  rows = []
  print(f"{'drops/round':>11} {'KL calibration':>15} {'KL check':>9} {'subsets scored':>14} {'seconds':>8}  kept")
  for schedule in schedules:
    start = time.time()
    choice = choose_layers(model, calibration, _KEEP.value, drops_per_round=schedule)
    seconds = time.time() - start
    keep = np.zeros(layers, bool)
    keep[choice["kept"]] = True
    row = {"keep_layers": _KEEP.value, "drops_per_round": schedule, "kl_calibration": choice["kl_to_source"],
           "kl_check": check(keep), "seconds": seconds, "subsets_scored": choice["subsets_scored"],
           "kept": choice["kept"], "dropped": choice["dropped"],
           "prompts": _PROMPTS.value, "check_prompts": _CHECK.value, "max_new_tokens": _MAX_NEW.value}
    rows.append(row)
    print(f"{schedule:>11} {row['kl_calibration']:>15.4f} {row['kl_check']:>9.4f} {row['subsets_scored']:>14} "
          f"{seconds:>8.0f}  {choice['kept']}", flush=True)
  if _OUT.value:
    from opd_jax.experiments.files import write_json  # .tmp then rename: never a half-written file
    write_json(_OUT.value, {"model": _MODEL.value, "rows": rows})


def main(argv):
  del argv
  _cli.log_devices()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main, required=("model", "keep_layers"))
