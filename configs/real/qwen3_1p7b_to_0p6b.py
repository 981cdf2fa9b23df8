"""Qwen3-1.7B -> Qwen3-0.6B on one 80 GB GPU: batch 64 x (256 prompt + 1,024 response) tokens.

Plan (no GPU, no weights; shapes from opd_jax/assets/model_shapes):
  python launch/plan_memory.py --config=configs/real/qwen3_1p7b_to_0p6b.py
Smoke run first (minutes on a laptop CPU, the same programs at a small batch; add `smoke` to the arguments):
  python launch/train.py --config=configs/real/qwen3_1p7b_to_0p6b.py:teacher=DIR,student=DIR,train_file=train.jsonl,heldout_file=test.jsonl,smoke --workdir=runs/smoke
Train (HF checkpoint directories and JSONL prompts of your own):
  python launch/train.py --config=configs/real/qwen3_1p7b_to_0p6b.py:teacher=/ckpt/Qwen3-1.7B,student=/ckpt/Qwen3-0.6B,train_file=train.jsonl,heldout_file=test.jsonl --workdir=runs/qwen3_0p6b
"""

from configs.real.common import real_config


def settings(c):
  c.train.micro_batch_size = 8  # 8 passes of 8 rows; planned train step 18.0 GiB (55.2 at 64 rows: it fits either way)


def get_config(arg=None):
  return real_config("qwen3_1p7b_to_0p6b", arg, teacher_shape="qwen3-1.7b", student_shape="qwen3-0.6b",
                     settings=settings)
