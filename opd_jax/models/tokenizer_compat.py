"""Does a teacher/student pair share a tokenizer? OPD scores the student's tokens with the teacher, so every
token id must mean the same text to both models.

`check_pair` compares the tokenizers themselves (token -> id for every token, and the special tokens) and
works out the common vocabulary: model vocab sizes (embedding rows) may be padded past the tokenizer, e.g.
Qwen2.5-7B has 152,064 rows and Qwen2.5-1.5B 151,936, over one tokenizer of 151,665 tokens. Such a pair is
accepted and both models are scored over the smaller size (`PairVocab.vocab_size`): load the larger one with
`load_pretrained(..., vocab_size=pair.slice_to(role))`, which keeps only its first rows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

from opd_jax.errors import InputError
from opd_jax.models.config import ModelConfig
from opd_jax.models.tokenizer import has_tokenizer, load_tokenizer

_SPECIAL_NAMES = ("bos_token", "eos_token", "pad_token", "unk_token")
# Files that define a tokenizer's vocabulary and special tokens: byte-identical sets need no second load.
_DEFINING_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt",
                   "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
_EXAMPLES = 3  # differing tokens shown in an error


@dataclasses.dataclass(frozen=True)
class PairVocab:
  """How the teacher's and student's vocabularies line up."""

  vocab_size: int  # common vocabulary both models are scored over: min of the two models' vocab_size
  teacher_vocab_size: int  # the checkpoints' own vocab_size (embedding rows)
  student_vocab_size: int
  tokenizer_size: int | None  # the data tokenizer's max token id + 1; None when it has no tokenizer files
  tokenizers_compared: bool  # False: a model dir has no tokenizer files, so only vocab sizes were checked
  cross_tokenizer: bool = False  # each model keeps its own tokenizer and vocabulary (opd_jax/crosstok)

  def slice_to(self, role: str) -> int | None:
    """`vocab_size=` for load_pretrained of 'teacher' or 'student': the common size where that model's is
    larger, else None (load it whole; always with cross_tokenizer)."""
    if self.cross_tokenizer:
      return None
    own = {"teacher": self.teacher_vocab_size, "student": self.student_vocab_size}[role]
    return self.vocab_size if own > self.vocab_size else None


@dataclasses.dataclass(frozen=True)
class _Summary:
  """What of a tokenizer must match: token -> id over its whole vocabulary, and its special tokens."""

  vocab: dict[str, int]
  specials: dict[str, tuple[str, int | None] | None]  # bos/eos/pad/unk -> (token, id) or None
  added_special: dict[int, str]  # id -> text of every added special token

  @property
  def size(self) -> int:
    return max(self.vocab.values()) + 1


def _summarize(path: str) -> _Summary:
  tokenizer = load_tokenizer(path)
  vocab = tokenizer.get_vocab()  # includes added tokens
  specials = {}
  for name in _SPECIAL_NAMES:
    token = getattr(tokenizer, name, None)
    specials[name] = None if token is None else (str(token), vocab.get(str(token)))
  added = {int(i): str(t) for i, t in tokenizer.added_tokens_decoder.items() if getattr(t, "special", False)}
  return _Summary(vocab, specials, added)


def _fingerprint(path: str) -> tuple:
  """Digests of the files that define the tokenizer in `path` (equal fingerprints: the same tokenizer)."""
  out = []
  for name in _DEFINING_FILES:
    file = os.path.join(path, name)
    if os.path.isfile(file):
      with open(file, "rb") as f:
        out.append((name, hashlib.sha256(f.read()).hexdigest()))
  return tuple(out)


def _token_id(summary: _Summary, token: str) -> str:
  return str(summary.vocab[token]) if token in summary.vocab else "none"


def _compare(reference: _Summary, other: _Summary, ref_label: str, other_label: str, ref_role: str,
             other_role: str) -> None:
  """Raises unless `other` gives every token of `reference` the same id and has the same special tokens."""
  what_to_do = ("OPD scores the student's tokens with the teacher, so pick a pair that shares a tokenizer "
                "(e.g. two sizes of one model family), or set cross_tokenizer.enabled=True to score the student's "
                "text with the teacher's own tokenizer")
  other_vocab = other.vocab
  differ = [token for token, i in reference.vocab.items() if other_vocab.get(token) != i]
  if differ:
    differ.sort(key=reference.vocab.get)
    examples = "; ".join(f"{token!r}: {other_role} {_token_id(other, token)}, {ref_role} {reference.vocab[token]}"
                         for token in differ[:_EXAMPLES])
    more = "; ..." if len(differ) > _EXAMPLES else ""
    raise InputError(f"the tokenizers of {other_label} and {ref_label} give {len(differ)} of "
                     f"{len(reference.vocab)} tokens different ids ({examples}{more}): {what_to_do}")
  for name in _SPECIAL_NAMES:
    if reference.specials[name] != other.specials[name]:
      show = lambda s: "none" if s is None else f"{s[0]!r} ({s[1]})"
      raise InputError(f"the tokenizers of {other_label} and {ref_label} have different special tokens: "
                       f"{name} {other_role} {show(other.specials[name])}, {ref_role} "
                       f"{show(reference.specials[name])}: {what_to_do}")
  if reference.added_special != other.added_special:
    only = lambda a, b: ", ".join(f"{a[i]!r} ({i})" for i in sorted(a) if b.get(i) != a[i]) or "none"
    raise InputError(f"the tokenizers of {other_label} and {ref_label} have different added special tokens "
                     f"(only {other_role}: {only(other.added_special, reference.added_special)}; only "
                     f"{ref_role}: {only(reference.added_special, other.added_special)}): {what_to_do}")


def _check_covers(role: str, vocab_size: int, tokenizer_size: int, tokenizer_label: str) -> None:
  if vocab_size < tokenizer_size:
    raise InputError(f"{role} vocab_size {vocab_size} is below the size of {tokenizer_label} ({tokenizer_size}, "
                     f"its max token id + 1): token ids >= {vocab_size} have no embedding row in the {role}; "
                     "pick a checkpoint whose vocabulary covers the tokenizer")


def check_pair(teacher_dir: str, student_dir: str, teacher_config: ModelConfig, student_config: ModelConfig,
               tokenizer_dir: str | None = None) -> PairVocab:
  """Checks that teacher and student share a tokenizer; returns the common vocabulary to score over.

  The data tokenizer is `tokenizer_dir` when given, else the student's. When both model dirs hold tokenizer
  files, the data tokenizer's every token must have the same id in the teacher's (and the student's, when
  `tokenizer_dir` is separate), with the same bos/eos/pad/unk and added special tokens; then the two models'
  vocab sizes may differ (padded embedding rows) as long as both cover the tokenizer (max token id + 1), and
  the common size is the smaller one. When a model dir has no tokenizer files the tokenizers cannot be
  compared, so this falls back to requiring equal vocab sizes (the data tokenizer, if any, must still fit).
  Each distinct tokenizer is loaded once (byte-identical tokenizer files count as one); the comparison is a
  pass over dicts (~0.1 s for a 152k-token vocabulary). Errors are InputError naming what differs.
  """
  labels = {"teacher": f"teacher {teacher_dir!r}", "student": f"student {student_dir!r}",
            "tokenizer": f"tokenizer {tokenizer_dir!r}"}
  roles = {"teacher": teacher_dir, "student": student_dir}
  data_role = "student"
  if tokenizer_dir and os.path.realpath(tokenizer_dir) != os.path.realpath(student_dir):
    roles["tokenizer"] = tokenizer_dir
    data_role = "tokenizer"
  present = {role: path for role, path in roles.items() if has_tokenizer(path)}
  if data_role == "tokenizer" and "tokenizer" not in present:
    raise InputError(f"tokenizer dir {tokenizer_dir!r} has no tokenizer files; point it at a dir with the "
                     "pair's tokenizer (or leave it unset to use the student's)")
  summaries, by_fingerprint = {}, {}
  for role, path in present.items():
    key = _fingerprint(path) or (os.path.realpath(path),)
    if key not in by_fingerprint:
      by_fingerprint[key] = _summarize(path)
    summaries[role] = by_fingerprint[key]

  compared = "teacher" in present and "student" in present
  tokenizer_size = summaries[data_role].size if data_role in present else None
  sizes = {"teacher": teacher_config.vocab_size, "student": student_config.vocab_size}
  if compared:
    reference = summaries[data_role]
    for role in ("teacher", "student"):
      if role != data_role and summaries[role] is not reference:
        _compare(reference, summaries[role], labels[data_role], labels[role], data_role, role)
  elif sizes["teacher"] != sizes["student"]:
    missing = [labels[r] for r in ("teacher", "student") if r not in present]
    raise InputError(f"teacher vocab_size {sizes['teacher']} != student vocab_size {sizes['student']}, and "
                     f"{' and '.join(missing)} {'has' if len(missing) == 1 else 'have'} no tokenizer files to "
                     "check that the padded vocabularies share a tokenizer: copy the tokenizer files into both "
                     "checkpoint dirs, or pick a pair that shares a tokenizer")
  if tokenizer_size is not None:
    for role in ("teacher", "student"):
      _check_covers(role, sizes[role], tokenizer_size, f"the tokenizer of {labels[data_role]}")
  return PairVocab(vocab_size=min(sizes.values()), teacher_vocab_size=sizes["teacher"],
                   student_vocab_size=sizes["student"], tokenizer_size=tokenizer_size,
                   tokenizers_compared=compared)
