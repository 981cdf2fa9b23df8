"""Shared config pieces: `parse_arg` for `--config=configs/pairN.py:key=value,...` and the base OPD config.

Every field a user may change lives here (or in the pair file that adjusts it) with a comment; library code
reads fields directly and hides no defaults.
"""

from __future__ import annotations

import os

import ml_collections

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASSETS = os.path.join(REPO, "opd_jax", "assets")


def parse_arg(arg: str | None, **spec) -> ml_collections.ConfigDict:
  """Parses 'runlocal,seed=3' against typed defaults: parse_arg(arg, runlocal=False, seed=0).

  A bare name sets a bool to True; key=value is converted to the default's type. Unknown keys are an error.
  """
  result = ml_collections.ConfigDict(spec)
  for part in filter(None, (arg or "").split(",")):
    key, _, value = part.partition("=")
    if key not in spec:
      raise ValueError(f"config argument {key!r} is unknown; known: {sorted(spec)}")
    default = spec[key]
    if isinstance(default, bool):
      if value.lower() not in ("", "1", "true", "yes", "0", "false", "no"):
        raise ValueError(f"config argument {key!r} is a switch; give {key}, {key}=true or {key}=false")
      result[key] = value.lower() not in ("0", "false", "no")
    elif not value:
      raise ValueError(f"config argument {key!r} needs a value ({key}=...)")
    else:
      try:
        result[key] = type(default)(value)
      except ValueError:
        raise ValueError(f"config argument {key}={value!r} must be a {type(default).__name__}") from None
  return result


def base_config(pair: str) -> ml_collections.ConfigDict:
  """OPD of an embedded pair's student from its teacher, with no mismatch knobs."""
  c = ml_collections.ConfigDict()
  c.pair = pair  # name used in logs, sweep results and budgets
  c.teacher = os.path.join(ASSETS, pair, "teacher")  # HF checkpoint dir of the fixed teacher
  c.student = os.path.join(ASSETS, pair, "student")  # HF checkpoint dir the student starts from
  c.tokenizer = ""  # dir with tokenizer files; "" = the student dir
  # The budget file launch/admit.py judges this pair's rollout configurations against when no --budget is given:
  # the embedded pairs' calibration (per-pair and pooled budgets, with their step-0 / run-mean k3 factors).
  c.admission_budget = os.path.join(REPO, "results", "budget.json")
  # "" = the teacher scores rollouts in this process. An http(s) URL ending in /v1 = a served teacher scores them
  # over a vLLM-compatible logprob API (python launch/serve_teacher.py, vLLM, SGLang; opd_jax/serving): only the
  # sampled tokens' log-probs and the objective's top-k cross the wire. config.teacher stays the same model's
  # dir: held-out evaluation (exact KL, teacher accuracy) still runs it in this process.
  c.teacher_endpoint = ""
  c.served_teacher = ml_collections.ConfigDict()  # the client of a served teacher (opd_jax/serving/client.py)
  c.served_teacher.model = ""  # the name the server serves the teacher under; "" = the first GET /v1/models lists
  c.served_teacher.rows_per_request = 8  # responses scored per HTTP request
  c.served_teacher.max_in_flight = 4  # requests of one batch sent at once
  c.served_teacher.timeout_s = 120.0  # one request's limit; a timeout counts as an outage and is retried
  # An outage (refused connections, timeouts, HTTP 429 / 5xx) is retried with backoff while the batch waits; one
  # that lasts longer than this stops the run (exit 1, last checkpoint kept; rerun the command to resume).
  c.served_teacher.retry_for_s = 300.0
  # Preflight, on the first batch: the served scores against config.teacher's own in this process (k3, the same
  # scale as sampler-learner mismatch) and against a second served scoring (is the server deterministic?). Above
  # preflight_max_k3: "refuse" stops the run before its first update (exit 2), "warn" warns; "off" skips it.
  c.served_teacher.preflight = "refuse"
  c.served_teacher.preflight_max_k3 = 1e-4  # float32 noise between two XLA programs is ~1e-9; bf16 serving ~1e-4
  # A teacher with its own tokenizer and prompt format (opd_jax/crosstok): the student's sampled text is decoded,
  # re-tokenized by the teacher's tokenizer after the prompt in the teacher's own format, and scored exactly span
  # by span (a span: characters both tokenizations delimit). objective.name: reverse_kl_pg (span form), reverse_kl
  # (both next-token distributions marginalized onto the next character, at span starts) or uld (the ULD baseline);
  # one teacher, in this process. False: the pair must share a tokenizer (opd_jax/models/tokenizer_compat.py).
  c.cross_tokenizer = ml_collections.ConfigDict()
  c.cross_tokenizer.enabled = False
  c.cross_tokenizer.teacher_format = "chat"  # "chat" (its chat template) | "plain" | a template with {prompt}
  c.cross_tokenizer.teacher_end = ""  # teacher token the student's EOS is scored against; "" = its tokenizer's EOS
  # Text between the teacher's prompt and the response, tokenized with the response (e.g. " " after a few-shot
  # "A:", so the teacher reads "A: chat" as its examples spell it); tokens of prefix only are context, not scored.
  c.cross_tokenizer.teacher_response_prefix = ""
  c.cross_tokenizer.max_teacher_prompt_tokens = 0  # the teacher's prompt length; 0 = 2 x data.max_prompt_tokens
  c.cross_tokenizer.max_teacher_response_tokens = 0  # its response length; 0 = 2 x rollout.max_new_tokens; spans
  # past it are not scored (counted: cross_tokenizer/spans_truncated)
  # Where spans may end: "settled" = only where both tokenizations mean the same event (exact; between two large
  # vocabularies few word ends are); "corrected" = every shared boundary, each side's span log-prob turned into a
  # character-level one with its cover (opd_jax/crosstok/cover.py), and the next-character marginals made
  # character-level there too (opd_jax/crosstok/projection.py); span form or reverse_kl, one in-process teacher.
  c.cross_tokenizer.boundaries = "settled"
  # Multi-teacher OPD (opd_jax/train/teachers.py): teachers besides config.teacher, by name, each a dict
  # {"checkpoint": HF dir, "endpoint": "" (scored in this process) or a served teacher's URL}; {} = config.teacher
  # scores every prompt. A prompt is scored by the teacher its JSONL row names in "teacher", else by the first of
  # routing.rules whose regex is found in its text, else by config.teacher. Every teacher shares the student's
  # tokenizer; objectives train on the teachers' log-probs / top-k (an exact one becomes top-k over a small
  # vocabulary). Example: configs/multi_teacher.py.
  c.teachers = ml_collections.ConfigDict()
  c.routing = ml_collections.ConfigDict()
  c.routing.teacher_name = "teacher"  # config.teacher's name in routes, JSONL "teacher" fields and metrics
  c.routing.rules = ()  # ordered ((regex searched in the prompt text, teacher name), ...); first match routes
  # Mixed precision. The learner keeps float32 master params and optimizer state; compute may be bfloat16
  # (real scale: halves activation memory, ~2x matmul speed on GPU/TPU). The LM head always accumulates and
  # returns float32 logits. The embedded pairs compute in float32: CPU bfloat16 matmuls are emulated and slow,
  # and a float32 learner keeps the sweeps' sampler-learner k3 free of a bf16 floor (see README).
  c.teacher_param_dtype = "float32"  # teacher params: float32 | bfloat16 (no master copy needed: it is fixed)
  c.teacher_compute_dtype = "float32"  # teacher activations: float32 | bfloat16
  c.student_param_dtype = "float32"  # learner (master) params and optimizer state: float32 | bfloat16
  c.student_compute_dtype = "float32"  # learner and sampler activations: float32 | bfloat16

  c.model = ml_collections.ConfigDict()  # execution of both models (opd_jax/models/decoder.py)
  c.model.attention = "xla"  # reference (einsum) | xla (jax.nn.dot_product_attention) | cudnn (GPU flash) | auto
  c.model.remat = "none"  # per-layer rematerialization: none | full | dots_saveable
  c.model.scan_layers = True  # run identical layers under one lax.scan (compile time flat in depth)
  c.seed = 0  # sampling keys and everything random in the run

  c.data = ml_collections.ConfigDict()
  c.data.source = "arithmetic"  # "arithmetic" (embedded generator) | "jsonl" (local files below)
  c.data.train_file = ""  # JSONL {"prompt"[, "answer", "grader"]} for data.source="jsonl" (answers optional)
  c.data.heldout_file = ""  # JSONL held-out set for evaluation when data.source="jsonl"
  c.data.train_size = 50_000  # embedded task: training prompts generated (the grain pipeline repeats them)
  c.data.min_terms = 3  # embedded task difficulty (see opd_jax/data/task.py)
  c.data.max_terms = 6
  c.data.min_digits = 1
  c.data.max_digits = 2
  c.data.use_chat_template = False  # wrap prompts as a user turn when the tokenizer has a chat template
  # The student's prompt format instead: "chat", "plain" or a template such as "Q: {prompt}\nA:" for a base model
  # (rendered with the tokenizer's special tokens; opd_jax/models/prompt_format.py); "" = use_chat_template decides.
  c.data.prompt_format = ""
  c.data.max_prompt_tokens = 20  # prompts are left-padded (or cut from the left) to this length
  c.data.seed = 0  # problem generation and shuffling
  # Training mix by the rows' "source" field (JSONL): "name=weight,..." draws each source in proportion to its
  # weight, whatever its size (every source of the set needs a weight; 0 leaves it out); "" = every prompt
  # equally often.
  c.data.mix = ""

  c.rollout = ml_collections.ConfigDict()  # every mismatch knob; see opd_jax/rollout/config.py
  c.rollout.weights = "none"  # sampler weight recipe: none | bf16 | int8 | int4 | int3 | int2 | fp8 | fp8_e5m2
  # | fp8_tensor
  c.rollout.weight_rules = ()  # ordered ((regex, precision), ...) over param paths; overrides `weights`
  c.rollout.quantize_embedding = False  # int8/fp8 shorthands: store the embedding table at that precision too
  c.rollout.kv_cache = "native"  # sampler KV cache: native | bf16 | int8 | int4 | fp8 | fp8_e5m2 (+ "_bf16scale")
  c.rollout.staleness_steps = 0  # sync mode: sampler uses learner version t - staleness_steps
  c.rollout.noise_sigma = 0.0  # relative Gaussian noise on sampler weights, ||noise|| / ||W|| per tensor
  c.rollout.noise_order = "before_quant"  # before_quant | after_quant
  c.rollout.noise_seed = 0  # noise for version v uses fold_in(key(noise_seed), v)
  c.rollout.temperature = 1.0  # sampling temperature (teacher and learner log-probs use the same one)
  c.rollout.top_k = 0  # 0 = off
  c.rollout.top_p = 1.0  # 1 = off
  c.rollout.max_new_tokens = 64  # response budget; the embedded task needs <= 64
  c.rollout.stop_text = ""  # student tokens whose text contains this end a response as EOS does; "" = none
  # Rollout engine layout and memory (README "Scaling the rollout engine"); none of these changes a number.
  c.rollout.placement = "colocated"  # colocated (time-share all devices) | disaggregated (sampler on its own)
  c.rollout.devices = 0  # disaggregated: the first N devices form the sampler's mesh, the learner the rest
  c.rollout.tensor_parallel = 1  # sampler mesh tensor axis (weights over heads / MLP / vocab, KV over heads)
  c.rollout.snapshots_on = "device"  # staleness snapshots, kept at the recipe's precision: device | host
  c.rollout.samples_per_prompt = 1  # responses per distinct prompt (prefilled once); grpo uses group_size
  # The decoding engine: static (one padded batch; every row runs to the longest) | paged (paged KV cache and
  # continuous batching, opd_jax/rollout/engine.py; each row drawn under its own key, so samples differ from static's)
  c.rollout.engine = "static"
  c.rollout.page_size = 16  # paged: tokens per KV page
  c.rollout.engine_rows = 0  # paged: rows decoded at once per sampler device; 0 = the batch's rows per device
  c.rollout.decode_steps = 8  # paged: decode steps per host round trip
  c.rollout.kv_pages = 0  # paged: pages in the KV pool; 0 = room for every row at its longest
  # paged + async: rows running when a new version is published continue on it (each token's version lag logged)
  c.rollout.inflight_updates = False
  # How decoding reads the sampler's weights: auto (dense_layers on CPU, stored on GPU / TPU) | stored (as
  # stored: quantized, stacked; no copy held) | dense_layers (a dense per-layer copy per generate call: XLA:CPU)
  c.rollout.weight_layout = "auto"
  c.rollout.split_mismatch = True  # lagged runs: also keep the dense learner version to split precision vs
  #                                  staleness in the metrics (one learner-dtype copy per lag; off at scale)

  c.objective = ml_collections.ConfigDict()  # see opd_jax/objectives/losses.py
  c.objective.name = "reverse_kl_pg"  # reverse_kl_pg | reverse_kl | forward_kl | jsd | *_topk | grpo (RL baseline)
  c.objective.student_logp = "learner"  # reverse_kl_pg advantage uses the learner's or the sampler's log pi_S
  # reverse_kl_pg / grpo weights from pi_theta / mu: none | tis | mis (per token) | seq_tis | geo_tis | geo_reject
  # (per sequence; see opd_jax/objectives/losses.py)
  c.objective.importance = "none"
  c.objective.is_cap = 2.0  # C for tis / mis / seq_tis / geo_tis
  c.objective.geo_lo = 0.9  # geo_reject keeps a sequence whose geometric-mean ratio is in [geo_lo, geo_hi]
  c.objective.geo_hi = 1.1
  c.objective.min_ess = 0.0  # skip an update whose importance weights' ESS share is below this (0 = never)
  c.objective.beta = 0.5  # jsd interpolation
  c.objective.top_k = 16  # support of the *_topk objectives
  c.objective.temperature = 1.0  # full-vocabulary objectives divide both logits by this
  c.objective.group_size = 8  # grpo: responses per prompt (train.batch_size / group_size distinct prompts)
  # reverse_kl with a teacher of another tokenizer: "first" scores a span's first character by its marginals and
  # its later tokens by the span's policy gradient; "chain" adds the rest of the span given its first character
  # (opd_jax/objectives/losses.py). No effect with one tokenizer (the exact reverse KL).
  c.objective.marginal_span = "first"

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.learning_rate = 1e-3  # AdamW peak learning rate
  c.optimizer.warmup_steps = 10  # linear warmup, then cosine decay to end_lr_fraction * peak
  c.optimizer.end_lr_fraction = 0.1
  c.optimizer.weight_decay = 0.0
  c.optimizer.grad_clip_norm = 1.0  # global-norm clipping

  c.train = ml_collections.ConfigDict()
  c.train.steps = 200  # learner updates; 0 = only the step-0 evaluation (teacher and student as they are)
  c.train.batch_size = 64  # prompts per update (one response each); divisible by mesh data*fsdp
  c.train.mode = "sync"  # sync: sample -> score -> update | async: rollouts produced ahead of the learner
  c.train.max_staleness = 2  # async: a batch may come from a learner version up to this many updates old
  c.train.log_every = 10  # steps between metrics.jsonl rows (metrics are averaged over the interval)
  c.train.eval_every = 50  # steps between held-out evaluations (and one before training, one at the end)
  c.train.eval_size = 256  # held-out prompts per evaluation
  c.train.eval_batch_size = 128
  c.train.eval_sampled = True  # also report accuracy of temperature-1 samples (greedy is always reported)
  # Also score the teacher's greedy held-out responses (made once, graded as eval/teacher_accuracy) with the
  # student: eval/teacher_forced_kl = KL(teacher || student) at the teacher's own prefixes.
  c.train.eval_teacher_forced = False
  # Which weights the evaluation decodes with: "learner" (its parameters as they are, on the learner's mesh: the
  # policy being trained) | "sampler" (the rollout engine's synced weights, recipe applied, on the sampler's
  # mesh: what a deployment with this engine would answer). The reverse KL is always the learner's.
  c.train.eval_weights = "learner"
  c.train.eval_samples = 4  # held-out prompts whose greedy responses each evaluation writes to samples.jsonl
  c.train.checkpoint_every = 100  # steps between orbax checkpoints (and one at the end)
  c.train.keep_checkpoints = 2
  c.train.resume = True  # continue from the newest checkpoint in workdir when one exists
  c.train.stop_after_steps = 0  # end this process (checkpointed) after this many steps; 0 = run to train.steps
  c.train.target_accuracy = 0.0  # end the run (checkpointed) at the first evaluation with greedy accuracy >= this
  c.train.vocab_metrics_top_k = 64  # sampler top-k log-probs for vocab mismatch metrics; -1 = full vocab, 0 = off
  # Tokens (rows x positions) per device per vocabulary chunk of logits, losses, metrics and scores: a float32
  # chunk of logits is logits_chunk x vocab x 4 bytes on each device (0.3 GB at 512 x 151,936) at any batch size
  # and device count (the whole batch's chunk is logits_chunk x the data x fsdp devices); 0 = whole batch at once.
  c.train.logits_chunk = 512
  c.train.micro_batch_size = 0  # rows per gradient-accumulation micro-batch (divides batch_size); 0 = whole batch
  c.train.progress_bar = True
  # Non-finite guard: a step whose loss or gradient is NaN/inf is skipped (state unchanged) and reported; after
  # this many in a row the run stops with exit code 1, keeping its last good checkpoint.
  c.train.max_skipped_steps = 10
  # glibc malloc arenas (Linux; 0 = glibc's default of 8 per core), set by launch/train.py before jax starts:
  # bounds the freed memory threads keep, so the peak RSS varies less between runs; 1, which malloc_keep_freed
  # needs (opd_jax/train/malloc.py)
  c.train.malloc_arena_max = 1
  # glibc malloc asks for transparent huge pages (GLIBC_TUNABLES glibc.malloc.hugetlb=1; launch/train.py starts
  # itself once more with it): a step's large temporaries are not page-faulted in 4 KiB at a time; the real
  # pair's train step ran about 1.5x faster on 2 cores (opd_jax/train/malloc.py). A GLIBC_TUNABLES that names
  # glibc.malloc.hugetlb itself wins.
  c.train.malloc_huge_pages = True
  # glibc malloc keeps freed memory (GLIBC_TUNABLES glibc.malloc.mmap_max=0 and a 1 TiB trim_threshold, added like
  # the huge pages): each step reuses the last step's pages instead of faulting in fresh zeroed ones. The real
  # pair's loop ran 1.57x faster on 2 cores with a 13% higher peak RSS, pair1's 1.25x (results/bench/malloc*.json);
  # the process keeps its high-water mark until it exits. A GLIBC_TUNABLES that names either tunable itself wins.
  c.train.malloc_keep_freed = True
  # Each checkpoint save is waited for before the next step, and malloc_trim hands free memory back after each save
  # and evaluation and before the export, so what those phases allocate does not stack on the kept heap
  # (opd_jax/train/malloc.py; docs/benchmarks.md has the peak RSS with and without).
  c.train.malloc_trim = True
  # With malloc_trim, also trim after a step whose resident size rose more than this many GB above the level the
  # heap settled at after the last trim (a fragmented kept heap grows by a whole ~2 GB block at once on the real
  # pair; opd_jax/train/malloc.py); 0 = off. On the real-pair seed that grew it took the peak from 10.15 to 7.43 GB
  # with two trims of about 5.5 s each in 320 steps and the same numbers (results/smollm2/heap_trim_growth/).
  c.train.malloc_trim_growth_gb = 1.0
  # At the end of training the student is written to workdir/export as an HF checkpoint (safetensors, config,
  # generation config, tokenizer) in this dtype: float32 (the master params) | bfloat16 | "" = no export.
  # Any checkpointed step: python launch/export.py --workdir=W [--step=N] --out=DIR.
  c.train.export_dtype = "float32"

  c.distributed = ml_collections.ConfigDict()  # multi-process runs (opd_jax/train/distributed.py)
  # "" = one process; "host:port" of process 0; "auto" = TPU pod / SLURM detection; "jobset" = a pod of the GKE
  # JobSet launch/gke_launch.py renders (coordinator, processes and this pod's index from its environment)
  c.distributed.coordinator = ""
  c.distributed.num_processes = 1  # with an explicit coordinator: processes in the run
  c.distributed.process_id = 0  # with an explicit coordinator: this process, 0 .. num_processes - 1

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # data-parallel ways; -1 = all devices left after fsdp * tensor
  c.mesh.fsdp = 1  # parameter/optimizer sharding ways (batch is also split over it)
  c.mesh.tensor = 1  # tensor-parallel ways (heads / MLP / vocab)
  return c


def pair_config(pair: str, arg: str | None) -> ml_collections.ConfigDict:
  """What every configs/pairN.py returns. Arguments (comma-separated after the file name):

  runlocal        shrink to a smoke run (seconds)
  recipe=PATH     use the weight rules of a recipe JSON written by launch/sensitivity.py
  """
  args = parse_arg(arg, runlocal=False, recipe="")
  config = base_config(pair)
  # The embedded pairs' tuned run (<= 10 minutes on 2 CPU cores, README has the measured before/after).
  # Exact reverse KL over the 32-token vocabulary on the student's own samples: at equal steps it closed the
  # gap ~3x faster than the sampled-token reverse_kl_pg (which at lr 1e-3 first raised the KL, see README).
  config.objective.name = "reverse_kl"
  config.train.steps = 700
  config.optimizer.learning_rate = 1e-3
  # 3-4-layer models on CPU: the einsum attention and an unrolled layer loop run a pair1 step in ~0.53 s; the
  # fused-attention + scan defaults (for real depths and accelerators) took ~0.65 s here (same numbers to 1e-5).
  config.model.attention = "reference"
  config.model.scan_layers = False
  if args.runlocal:
    shrink_for_local_run(config)
  if args.recipe:
    config.rollout.weight_rules = load_recipe_rules(args.recipe)
  return config


def config_for(pair: str) -> ml_collections.ConfigDict:
  """The config a sweep point of `pair` starts from: an embedded pair's, or configs/<pair>.py for a real pair."""
  if pair in ("pair1", "pair2", "pair3"):
    return pair_config(pair, None)
  import importlib.util
  path = os.path.join(REPO, "configs", f"{pair}.py")
  if not os.path.isfile(path):
    raise ValueError(f"pair {pair!r} has no config file {path}")
  spec = importlib.util.spec_from_file_location(f"configs.{pair}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def load_recipe_rules(path: str) -> tuple:
  import json
  if not os.path.isfile(path):
    raise ValueError(f"recipe file {path!r} does not exist (write one with launch/sensitivity.py)")
  try:
    with open(path) as f:
      recipe = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"recipe file {path!r} cannot be read as JSON ({type(e).__name__}); write it again with "
                     "launch/sensitivity.py") from None
  rules = recipe.get("rules") if isinstance(recipe, dict) else None
  if not rules or not isinstance(rules, list) or not all(isinstance(r, list) and len(r) == 2 for r in rules):
    raise ValueError(f"recipe file {path!r} has no 'rules' list of [regex, precision] pairs (launch/sensitivity.py "
                     "writes one)")
  return tuple(tuple(rule) for rule in rules)


def shrink_for_local_run(c: ml_collections.ConfigDict) -> None:
  """The `runlocal` shrink: a smoke run in well under a minute on a laptop CPU."""
  c.train.steps = 6
  c.train.batch_size = 16
  c.train.log_every = 2
  c.train.eval_every = 3
  c.train.eval_size = 32
  c.train.eval_batch_size = 32
  c.train.checkpoint_every = 3
  c.data.train_size = 512
