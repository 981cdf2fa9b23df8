"""What the shipped real-scale configs share: every setting a run at Qwen3 scale needs, with why.

A real-scale config names its teacher / student as HF checkpoint directories given by the user
(`:teacher=DIR,student=DIR` after the file name); until then they hold shipped shape names
(opd_jax.models.shapes), which the memory planner reads and the trainer refuses with a message saying what to
give. Data is the user's JSONL (`:train_file=...,heldout_file=...`).
"""

from configs.common import base_config, parse_arg


def real_config(name: str, arg, *, teacher_shape: str, student_shape: str, settings=None):
  """Arguments after the file name (comma-separated): teacher=DIR, student=DIR, train_file=, heldout_file=, and
  `smoke`: the same run shrunk to minutes on a laptop CPU (see shrink_for_smoke), to try a pair before a GPU.
  settings(c): the config file's own settings (mesh, micro-batch), applied before the smoke shrink."""
  args = parse_arg(arg, teacher=teacher_shape, student=student_shape, train_file="train.jsonl",
                   heldout_file="heldout.jsonl", smoke=False)
  c = base_config(name)
  c.teacher = args.teacher  # an HF directory to train; a shipped shape name (opd_jax/assets/model_shapes) plans only
  c.student = args.student
  # bf16 compute for both models (float32 master weights and Adam state, float32 logits from the head); the
  # teacher is fixed, so its weights are stored in bf16 too.
  c.teacher_param_dtype = "bfloat16"
  c.teacher_compute_dtype = "bfloat16"
  c.student_compute_dtype = "bfloat16"
  c.model.attention = "xla"  # jax's fused attention (set "cudnn" for cuDNN flash attention on NVIDIA GPUs)
  c.model.scan_layers = True  # one compiled layer body: compile time flat in depth
  c.model.remat = "full"  # keep only layer inputs for the backward: activations are the memory peak at 1k tokens
  c.data.source = "jsonl"
  c.data.train_file = args.train_file  # {"prompt"[, "answer"]} per line; OPD needs no answers
  c.data.heldout_file = args.heldout_file
  c.data.use_chat_template = True
  c.data.max_prompt_tokens = 256
  c.rollout.max_new_tokens = 1024
  c.rollout.split_mismatch = False  # no dense learner copies per lagged version
  # Sampled-token reverse KL: the teacher hands over one log-prob per token, not its hidden states, so no
  # [B, R, D] teacher tensor crosses to the learner; exact and *_topk objectives are a config field away.
  c.objective.name = "reverse_kl_pg"
  c.optimizer.learning_rate = 1e-6  # full fine-tuning of a pretrained instruct model
  c.optimizer.warmup_steps = 10
  c.train.steps = 200
  c.train.batch_size = 64  # responses per update
  c.train.logits_chunk = 512  # tokens per vocabulary chunk: 512 x 151,936 x 4 bytes = 0.3 GB of float32 logits
  c.train.eval_every = 50
  c.train.eval_size = 128
  c.train.eval_batch_size = 32
  c.train.checkpoint_every = 50
  c.train.export_dtype = "bfloat16"
  c.train.progress_bar = True
  if settings is not None:
    settings(c)
  if args.smoke:
    shrink_for_smoke(c)
  return c


def shrink_for_smoke(c) -> None:
  """`:smoke`: every program of the real run (sampler, teacher scoring, train step, evaluation, checkpoint,
  export) at the shipped model shapes and settings, but a batch of 4 x (<= 128 prompt + 32 response) tokens, 3 steps
  and an 8-prompt evaluation: minutes on a laptop CPU with the user's own checkpoints. Shapes only shrink; the
  objective, precisions, attention and remat stay those of the real run; the mesh shrinks to one device."""
  c.data.max_prompt_tokens = 128
  c.rollout.max_new_tokens = 32
  c.train.steps = 3
  c.train.batch_size = 4
  c.train.micro_batch_size = 2
  c.mesh.fsdp = c.mesh.tensor = c.rollout.tensor_parallel = 1
  c.train.log_every = 1
  c.train.eval_every = 3
  c.train.eval_size = 8
  c.train.eval_batch_size = 8
  c.train.checkpoint_every = 3
  c.optimizer.warmup_steps = 1
