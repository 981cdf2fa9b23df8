"""Qwen3-8B -> Qwen3-1.7B on 8 x 80 GB GPUs: batch 64 x (256 prompt + 1,024 response) tokens, fsdp over 8.

Plan (no GPU, no weights; shapes from opd_jax/assets/model_shapes):
  python launch/plan_memory.py --config=configs/real/qwen3_8b_to_1p7b.py --devices=8
Smoke run first (minutes on a laptop CPU, the same programs at a small batch; add `smoke` to the arguments):
  python launch/train.py --config=configs/real/qwen3_8b_to_1p7b.py:teacher=DIR,student=DIR,train_file=train.jsonl,heldout_file=test.jsonl,smoke --workdir=runs/smoke
Train (HF checkpoint directories and JSONL prompts of your own):
  python launch/train.py --config=configs/real/qwen3_8b_to_1p7b.py:teacher=/ckpt/Qwen3-8B,student=/ckpt/Qwen3-1.7B,train_file=train.jsonl,heldout_file=test.jsonl --workdir=runs/qwen3_1p7b
"""

from configs.real.common import real_config


def settings(c):
  c.mesh.fsdp = 8  # parameters, Adam state and the teacher sharded over the 8 devices; batch split over them too
  c.train.micro_batch_size = 16  # 2 rows per device per pass, 4 passes
  c.rollout.tensor_parallel = 8  # the sampler's weights over heads / MLP / vocab, its KV cache over KV heads


def get_config(arg=None):
  return real_config("qwen3_8b_to_1p7b", arg, teacher_shape="qwen3-8b", student_shape="qwen3-1.7b",
                     settings=settings)
