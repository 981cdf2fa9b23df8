"""Pair x (embedded, cross-tokenizer): OPD of pair1's student, which writes every digit as its own token, from a
teacher that writes two-digit numbers as one token (opd_jax/data/number_tokenizer.py), trained with pair1's teacher
recipe; only the tokenizer differs from pair1's teacher. The teacher scores the student's decoded text re-tokenized
its own way, span by span (opd_jax/crosstok).

Run (about 10 minutes on 2 CPU cores):
  python launch/train.py --config=configs/pairx.py --workdir=runs/pairx
Objectives (the comparison of configs/sweeps/cross_tokenizer.py):
  --config=configs/pairx.py:objective=reverse_kl_pg   the span form of the policy gradient
  --config=configs/pairx.py:objective=reverse_kl      next-character marginals at span starts (the default)
  --config=configs/pairx.py:objective=uld             the ULD baseline (sorted top-k probabilities)
Smoke run (seconds): --config=configs/pairx.py:runlocal
"""

import os

from configs import common


def get_config(arg=None):
  """arg: 'runlocal' and/or 'objective=NAME' (reverse_kl_pg | reverse_kl | uld)."""
  args = common.parse_arg(arg, runlocal=False, objective="reverse_kl")
  config = common.pair_config("pair1", "runlocal" if args.runlocal else None)  # pair1's tuned run
  config.pair = "pairx"
  config.teacher = os.path.join(common.ASSETS, "pairx", "teacher")  # number tokenizer
  config.student = os.path.join(common.ASSETS, "pair1", "student")  # character tokenizer
  config.cross_tokenizer.enabled = True
  config.cross_tokenizer.teacher_format = "plain"  # the teacher was trained on the task's own prompt text
  config.objective.name = args.objective
  return config
