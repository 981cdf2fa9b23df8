"""The parts of a run spec, one frozen dataclass per config section, each checked where it is made.

`from_section(section)` turns one ConfigDict section into its part: an unknown field is an error naming it, a
missing one takes the default below (the same as configs/common.py's), and every check that needs only that
section runs here, each error naming its field. Checks that join parts live in opd_jax/spec/run_spec.py.
"""

from __future__ import annotations

import dataclasses
import os

from opd_jax.data.problems import parse_mix
from opd_jax.data.task import ArithmeticTask
from opd_jax.errors import InputError

MODES = ("sync", "async")  # train.mode
EVAL_WEIGHTS = ("learner", "sampler")  # train.eval_weights: what the evaluation decodes with
EXPORT_DTYPES = ("", "float32", "bfloat16")  # train.export_dtype ("" = no export)
PREFLIGHT = ("refuse", "warn", "off")  # served_teacher.preflight
DATA_SOURCES = ("arithmetic", "jsonl")


def _values(cls, section, name: str) -> dict:
  """The section's values for `cls`; an unknown field is an error naming it."""
  fields = {f.name for f in dataclasses.fields(cls)}
  values = dict(section)
  unknown = sorted(set(values) - fields)
  if unknown:
    raise InputError(f"config.{name} has unknown field(s) {unknown}; known: {sorted(fields)}")
  return values


def _is_number(value) -> bool:
  return not isinstance(value, bool) and isinstance(value, (int, float))


def _is_int(value) -> bool:
  return not isinstance(value, bool) and isinstance(value, int)


@dataclasses.dataclass(frozen=True)
class ModelOptions:
  """How both models execute (config.model; opd_jax/models/decoder.py)."""
  attention: str = "xla"
  remat: str = "none"
  scan_layers: bool = True


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """The prompts (config.data): the embedded task or local JSONL files."""
  source: str = "arithmetic"
  train_file: str = ""
  heldout_file: str = ""
  train_size: int = 50_000
  min_terms: int = 3
  max_terms: int = 6
  min_digits: int = 1
  max_digits: int = 2
  use_chat_template: bool = False
  prompt_format: str = ""  # "" (as use_chat_template says) | "chat" | "plain" | a template (models/prompt_format.py)
  max_prompt_tokens: int = 20
  seed: int = 0
  mix: str = ""

  @classmethod
  def from_section(cls, section, check_files: bool = True) -> "DataSpec":
    """check_files=False: the JSONL files may be elsewhere (planning a run)."""
    spec = cls(**_values(cls, section, "data"))
    if not isinstance(spec.mix, str):
      raise InputError(f"data.mix must be a string 'source=weight,...' ('' = no mix), got {spec.mix!r}")
    parse_mix(spec.mix)
    if not isinstance(spec.prompt_format, str):
      raise InputError(f"data.prompt_format must be a string ('' = as data.use_chat_template says), got "
                       f"{spec.prompt_format!r}")
    if spec.prompt_format:
      from opd_jax.models.prompt_format import check_format
      check_format(spec.prompt_format, "data.prompt_format")
      if spec.use_chat_template:
        raise InputError(f"data.prompt_format={spec.prompt_format!r} and data.use_chat_template=True both say how "
                         "the student's prompts look; set one (prompt_format='chat' is the chat template)")
    for field, value in (("data.max_prompt_tokens", spec.max_prompt_tokens), ("data.train_size", spec.train_size)):
      if not _is_int(value) or value < 1:
        raise InputError(f"{field} must be a positive integer, got {value!r}")
    if spec.source not in DATA_SOURCES:
      raise InputError(f"data.source must be 'arithmetic' or 'jsonl', got {spec.source!r}")
    if spec.source == "jsonl" and check_files:
      for field in ("train_file", "heldout_file"):
        if not os.path.isfile(getattr(spec, field)):
          raise InputError(f"data.{field}={getattr(spec, field)!r} is not a file (data.source='jsonl' needs it)")
    return spec

  @property
  def task(self) -> ArithmeticTask:
    return ArithmeticTask(self.min_terms, self.max_terms, self.min_digits, self.max_digits)

  @property
  def mix_weights(self) -> dict[str, float]:
    return parse_mix(self.mix)


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
  """AdamW with warmup and cosine decay (config.optimizer; opd_jax/train/optimizer.py)."""
  learning_rate: float = 1e-3
  warmup_steps: int = 10
  end_lr_fraction: float = 0.1
  weight_decay: float = 0.0
  grad_clip_norm: float = 1.0

  @classmethod
  def from_section(cls, section) -> "OptimizerSpec":
    spec = cls(**_values(cls, section, "optimizer"))
    for field, ok, want in (
        ("learning_rate", lambda v: v > 0, "a number > 0"),
        ("warmup_steps", lambda v: v >= 0, "an integer >= 0"),
        ("end_lr_fraction", lambda v: 0 <= v <= 1, "a number in [0, 1]"),
        ("weight_decay", lambda v: v >= 0, "a number >= 0"),
        ("grad_clip_norm", lambda v: v >= 0, "a number >= 0 (0 = off)")):
      value = getattr(spec, field)
      if not _is_number(value) or not ok(value):
        raise InputError(f"optimizer.{field} must be {want}, got {value!r}")
    return spec


@dataclasses.dataclass(frozen=True)
class TrainSpec:
  """The loop's own settings (config.train; each field's comment is in configs/common.py)."""
  steps: int = 200
  batch_size: int = 64
  mode: str = "sync"
  max_staleness: int = 2
  log_every: int = 10
  eval_every: int = 50
  eval_size: int = 256
  eval_batch_size: int = 128
  eval_sampled: bool = True
  eval_teacher_forced: bool = False
  eval_weights: str = "learner"
  eval_samples: int = 4
  checkpoint_every: int = 100
  keep_checkpoints: int = 2
  resume: bool = True
  stop_after_steps: int = 0
  target_accuracy: float = 0.0
  vocab_metrics_top_k: int = 64
  logits_chunk: int = 512
  micro_batch_size: int = 0
  progress_bar: bool = True
  max_skipped_steps: int = 10
  malloc_arena_max: int = 1
  malloc_huge_pages: bool = True
  malloc_keep_freed: bool = True
  malloc_trim: bool = True
  malloc_trim_growth_gb: float = 1.0
  export_dtype: str = "float32"

  @classmethod
  def from_section(cls, section) -> "TrainSpec":
    t = cls(**_values(cls, section, "train"))
    if t.mode not in MODES:
      raise InputError(f"train.mode must be one of {MODES}, got {t.mode!r}")
    if not _is_int(t.steps) or t.steps < 0:
      raise InputError(f"train.steps must be an integer >= 0 (0 = evaluate the pair only), got {t.steps!r}")
    for field in ("batch_size", "log_every", "eval_every", "eval_size", "eval_batch_size", "checkpoint_every",
                  "keep_checkpoints", "max_skipped_steps"):
      if not _is_int(getattr(t, field)) or getattr(t, field) < 1:
        raise InputError(f"train.{field} must be a positive integer, got {getattr(t, field)!r}")
    for field in ("logits_chunk", "micro_batch_size", "max_staleness", "stop_after_steps", "eval_samples",
                  "malloc_arena_max"):
      if not _is_int(getattr(t, field)) or getattr(t, field) < 0:
        raise InputError(f"train.{field} must be an integer >= 0 (0 = off), got {getattr(t, field)!r}")
    if not _is_number(t.target_accuracy) or not 0 <= t.target_accuracy <= 1:
      raise InputError(f"train.target_accuracy must be a number in [0, 1] (0 = off), got {t.target_accuracy!r}")
    if t.micro_batch_size and t.batch_size % t.micro_batch_size:
      raise InputError(f"train.micro_batch_size={t.micro_batch_size} does not divide train.batch_size="
                       f"{t.batch_size}; pick a divisor (or 0 for no micro-batching)")
    if not isinstance(t.malloc_trim, bool):
      raise InputError(f"train.malloc_trim must be True or False, got {t.malloc_trim!r}")
    if not _is_number(t.malloc_trim_growth_gb) or t.malloc_trim_growth_gb < 0:
      raise InputError(f"train.malloc_trim_growth_gb must be a number >= 0 (GB; 0 = off), got "
                       f"{t.malloc_trim_growth_gb!r}")
    if t.eval_weights not in EVAL_WEIGHTS:
      raise InputError(f"train.eval_weights must be one of {EVAL_WEIGHTS}, got {t.eval_weights!r}")
    if t.export_dtype not in EXPORT_DTYPES:
      raise InputError(f"train.export_dtype must be 'float32', 'bfloat16' or '' (no export), got "
                       f"{t.export_dtype!r}")
    return t

  def sampler_top_k(self, vocab_size: int) -> int:
    """Top-k log-probs the rollout sampler returns for the vocabulary metrics (-1 = the whole vocabulary)."""
    return vocab_size if self.vocab_metrics_top_k == -1 else self.vocab_metrics_top_k

  def is_due(self, every: int, step: int) -> bool:
    """Periodic work (log rows, evaluations, checkpoints) runs every `every` steps and after the last one."""
    return step % every == 0 or step == self.steps


@dataclasses.dataclass(frozen=True)
class MeshSpec:
  """The learner's mesh (config.mesh): data x fsdp x tensor ways; data -1 = every device left."""
  data: int = -1
  fsdp: int = 1
  tensor: int = 1

  @classmethod
  def from_section(cls, section) -> "MeshSpec":
    return cls(**_values(cls, section, "mesh"))


@dataclasses.dataclass(frozen=True)
class ServedSpec:
  """The client of a served teacher (config.served_teacher; opd_jax/serving/client.py)."""
  model: str = ""
  rows_per_request: int = 8
  max_in_flight: int = 4
  timeout_s: float = 120.0
  retry_for_s: float = 300.0
  preflight: str = "refuse"
  preflight_max_k3: float = 1e-4

  @classmethod
  def from_section(cls, section) -> "ServedSpec":
    return cls(**_values(cls, section, "served_teacher"))

  def check(self) -> None:
    """Checked only where a teacher is served (an unused section is not an error)."""
    if self.preflight not in PREFLIGHT:
      raise InputError(f"served_teacher.preflight must be one of {PREFLIGHT}, got {self.preflight!r}")
    if not _is_number(self.preflight_max_k3) or not self.preflight_max_k3 >= 0:
      raise InputError(f"served_teacher.preflight_max_k3 must be a number >= 0, got {self.preflight_max_k3!r}")
    for field in ("rows_per_request", "max_in_flight"):
      if not _is_int(getattr(self, field)) or getattr(self, field) < 1:
        raise InputError(f"served_teacher.{field} must be a positive integer, got {getattr(self, field)!r}")
    if not _is_number(self.timeout_s) or not self.timeout_s > 0:
      raise InputError(f"served_teacher.timeout_s must be a number > 0, got {self.timeout_s!r}")
    if not _is_number(self.retry_for_s) or not self.retry_for_s >= 0:
      raise InputError(f"served_teacher.retry_for_s must be a number >= 0, got {self.retry_for_s!r}")


@dataclasses.dataclass(frozen=True)
class CrossTokenizerSpec:
  """A teacher with its own tokenizer and prompt format (config.cross_tokenizer; opd_jax/crosstok)."""
  enabled: bool = False
  teacher_format: str = "chat"  # "chat" | "plain" | a template with {prompt} (opd_jax/models/prompt_format.py)
  teacher_end: str = ""  # the teacher token the student's EOS is scored against; "" = its tokenizer's EOS
  teacher_response_prefix: str = ""  # text the teacher reads between its prompt and the student's response
  max_teacher_prompt_tokens: int = 0  # Pt; 0 = 2 x data.max_prompt_tokens
  max_teacher_response_tokens: int = 0  # Rt; 0 = 2 x rollout.max_new_tokens
  boundaries: str = "settled"  # "settled" | "corrected": span ends at unsettled boundaries too (opd_jax/crosstok)

  @classmethod
  def from_section(cls, section) -> "CrossTokenizerSpec":
    spec = cls(**_values(cls, section or {}, "cross_tokenizer"))
    if not isinstance(spec.enabled, bool):
      raise InputError(f"cross_tokenizer.enabled must be True or False, got {spec.enabled!r}")
    for field in ("teacher_format", "teacher_end", "teacher_response_prefix"):
      if not isinstance(getattr(spec, field), str):
        raise InputError(f"cross_tokenizer.{field} must be a string, got {getattr(spec, field)!r}")
    if spec.boundaries not in ("settled", "corrected"):
      raise InputError(f"cross_tokenizer.boundaries={spec.boundaries!r}: use 'settled' (spans end only where both "
                       "tokenizations mean the same event) or 'corrected' (every shared boundary, with cover "
                       "corrections; the span form)")
    if spec.enabled:
      from opd_jax.models.prompt_format import check_format
      check_format(spec.teacher_format)
    for field in ("max_teacher_prompt_tokens", "max_teacher_response_tokens"):
      if not _is_int(getattr(spec, field)) or getattr(spec, field) < 0:
        raise InputError(f"cross_tokenizer.{field} must be an integer >= 0 (0 = twice the student's), got "
                         f"{getattr(spec, field)!r}")
    return spec

  def lengths(self, max_prompt_tokens: int, max_new_tokens: int) -> tuple[int, int]:
    """(Pt, Rt): the teacher's static prompt and response lengths."""
    return (self.max_teacher_prompt_tokens or 2 * max_prompt_tokens,
            self.max_teacher_response_tokens or 2 * max_new_tokens)


@dataclasses.dataclass(frozen=True)
class TeacherSpec:
  """One teacher: config.teacher (named routing.teacher_name) or an entry of config.teachers."""
  name: str
  checkpoint: str  # HF dir (in-process scoring, evaluation, a served teacher's preflight)
  endpoint: str = ""  # "" = scored in this process; else a served teacher's base URL (.../v1)
  # with cross_tokenizer.enabled, this teacher's own prompt format and end token ("" = cross_tokenizer's)
  format: str = ""
  end: str = ""


@dataclasses.dataclass(frozen=True)
class PairSpec:
  """The two models (config.teacher / .student / .tokenizer and their dtypes) and how they execute."""
  name: str
  teacher: str
  student: str
  tokenizer: str  # dir of the data tokenizer; "" = the student's
  teacher_param_dtype: str = "float32"
  teacher_compute_dtype: str = "float32"
  student_param_dtype: str = "float32"
  student_compute_dtype: str = "float32"
  model: ModelOptions = ModelOptions()

  @classmethod
  def from_config(cls, config) -> "PairSpec":
    """From a run config, or its stored form (a run directory's config.json, as a dict)."""
    dtypes = {f"{role}_{kind}_dtype": config[f"{role}_{kind}_dtype"] for role in ("teacher", "student")
              for kind in ("param", "compute")}
    return cls(config["pair"], config["teacher"], config["student"], config["tokenizer"], **dtypes,
               model=ModelOptions(**_values(ModelOptions, config["model"], "model")))

  @property
  def tokenizer_dir(self) -> str:
    return self.tokenizer or self.student

  def path(self, role: str) -> str:
    return {"teacher": self.teacher, "student": self.student}[role]

  def param_dtype(self, role: str) -> str:
    return getattr(self, f"{role}_param_dtype")

  def compute_dtype(self, role: str) -> str:
    return getattr(self, f"{role}_compute_dtype")
