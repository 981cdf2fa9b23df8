"""The embedded pairs' character-level tokenizer, written as a tokenizer.json that AutoTokenizer loads.

Its WordLevel model maps a character outside CHARS to <pad> (its unk token), which would silently corrupt a
prompt, so text is checked first: `check_text` raises naming the characters, and `is_char_tokenizer` tells
callers (opd_jax.data.batching) when the check applies.
"""

from __future__ import annotations

from opd_jax.errors import InputError

PAD, EOS = "<pad>", "<eos>"
CHARS = "0123456789+-=#\n "  # every character the embedded task writes
VOCAB = {PAD: 0, EOS: 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
_CHARSET = frozenset(CHARS)
_SHOWN_CHARS = 80  # characters of an offending text quoted in an error


def build_char_tokenizer(out_dir: str) -> None:
  """Writes tokenizer.json + tokenizer_config.json to `out_dir`: ids 0 <pad>, 1 <eos>, then CHARS."""
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  tokenizer = Tokenizer(models.WordLevel(dict(VOCAB), unk_token=PAD))
  tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
  tokenizer.decoder = decoders.Fuse()
  PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=PAD).save_pretrained(out_dir)


def vocab_size() -> int:
  return len(VOCAB)


def is_char_tokenizer(tokenizer) -> bool:
  """Whether `tokenizer` is this character tokenizer (cheap for any tokenizer: its length is checked first)."""
  return len(tokenizer) == len(VOCAB) and tokenizer.get_vocab() == VOCAB


def unknown_characters(text: str) -> str:
  """The characters of `text` the tokenizer lacks, each once, in order of appearance ('' when none)."""
  if _CHARSET.issuperset(text):
    return ""
  return "".join(dict.fromkeys(c for c in text if c not in _CHARSET))


def check_text(text: str, what: str = "text") -> None:
  """Raises InputError naming the characters of `text` outside the vocabulary; `what` names the text."""
  unknown = unknown_characters(text)
  if unknown:
    shown = text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."
    raise InputError(f"{what} {shown!r} has characters outside the tokenizer's vocabulary: "
                     f"{', '.join(map(repr, unknown))} (the embedded character tokenizer writes only "
                     f"{CHARS!r}; use a checkpoint with a general tokenizer for other data)")
