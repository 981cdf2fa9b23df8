"""Multi-teacher OPD on the embedded pairs: pair1's student learns short chains (3-4 terms) from pair1's teacher
and long chains (5-6 terms) from pair3's teacher, each prompt scored by one of them (opd_jax/train/teachers.py).

Run (about 9 minutes on 2 CPU cores; results/multi_teacher/ holds a shipped run):
  python launch/train.py --config=configs/multi_teacher.py --workdir=runs/multi_teacher
Smoke run (seconds):   --config=configs/multi_teacher.py:runlocal
A served second teacher: python launch/serve_teacher.py --config=configs/pair3.py --port=8001 &, then
  --config.teachers.pair3.endpoint=http://127.0.0.1:8001/v1

The two teachers share the embedded character tokenizer (checked at start, as for any pair). Routing here is a
rule on the prompt text; JSONL prompt sets (data.source="jsonl") can name a row's teacher in a "teacher" field
instead. Logged per teacher: its tokens, and the k1 / k3 estimates of KL(student || teacher) on them
(teachers/<name>/*), and each held-out prompt's reverse KL to its own teacher (eval/teachers/<name>/reverse_kl).
"""

import os

from configs import common


def get_config(arg=None):
  """arg: 'runlocal' (see configs.common.pair_config)."""
  config = common.pair_config("pair1", arg)
  config.pair = "pair1_multi_teacher"  # its own name in logs and checkpoints (no budget is calibrated for it)
  config.routing.teacher_name = "pair1"  # config.teacher (pair1's) scores what no rule routes elsewhere
  config.teachers.pair3 = {"checkpoint": os.path.join(common.ASSETS, "pair3", "teacher"),
                           "endpoint": ""}  # "" = scored in this process
  # Chains of 5 or 6 terms (4 or more operators) go to pair3's teacher, the rest to pair1's.
  config.routing.rules = ((r"([+-]\d+){4}", "pair3"),)
  # pair1's objective, reverse KL, needs one teacher's head; with several teachers it trains as reverse_kl_topk
  # over the whole 32-token vocabulary (no tail bin: the same divergence), which every teacher can feed.
  return config
