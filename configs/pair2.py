"""Pair 2 (Llama-style, embedded): OPD of the pair2 student from the pair2 teacher on the arithmetic task.

Run (about 8 minutes on 2 CPU cores; README lists the measured before/after accuracy):
  python launch/train.py --config=configs/pair2.py --workdir=runs/pair2
Smoke run (seconds):   --config=configs/pair2.py:runlocal
Sensitivity recipe:    --config=configs/pair2.py:recipe=runs/sensitivity_pair2/recipe_fp8.json
Mismatch knobs:        --config.rollout.weights=fp8 --config.rollout.kv_cache=fp8 --config.rollout.staleness_steps=2
Real checkpoints:      --config.teacher=/ckpt/Llama-3.1-8B-Instruct --config.student=/ckpt/Llama-3.2-1B-Instruct
                       --config.teacher_param_dtype=bfloat16 --config.teacher_compute_dtype=bfloat16
                       --config.student_compute_dtype=bfloat16 --config.model.remat=full --config.data.source=jsonl
                       --config.data.train_file=gsm8k_train.jsonl --config.data.heldout_file=gsm8k_test.jsonl
                       --config.data.use_chat_template=True --config.data.max_prompt_tokens=256
                       --config.rollout.max_new_tokens=1024 --config.train.micro_batch_size=8
                       (check the fit first: python launch/plan_memory.py --teacher=DIR --student=DIR --batch=64 ...)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root, for configs.common

from configs import common  # noqa: E402


def get_config(arg=None):
  """arg: 'runlocal' and/or 'recipe=PATH' (see configs.common.pair_config)."""
  return common.pair_config("pair2", arg)
