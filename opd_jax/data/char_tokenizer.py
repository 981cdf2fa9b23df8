"""The embedded pairs' character-level tokenizer, written as a tokenizer.json that AutoTokenizer loads."""

from __future__ import annotations

PAD, EOS = "<pad>", "<eos>"
CHARS = "0123456789+-=#\n "  # every character the embedded task writes


def build_char_tokenizer(out_dir: str) -> None:
  """Writes tokenizer.json + tokenizer_config.json to `out_dir`: ids 0 <pad>, 1 <eos>, then CHARS."""
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  vocab = {PAD: 0, EOS: 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
  tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
  tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
  tokenizer.decoder = decoders.Fuse()
  PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=PAD).save_pretrained(out_dir)


def vocab_size() -> int:
  return 2 + len(CHARS)
