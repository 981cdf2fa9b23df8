"""A second tokenizer for the embedded task's text: two-digit numbers as one token, other characters one by one.

With the embedded character tokenizer (opd_jax/data/char_tokenizer.py) on the other side, every multi-digit
number is tokenized differently by the two models -- the case where methods that keep only the tokens both
sides share lose every number -- while the text is the same: the cross-tokenizer pair's second tokenizer
(opd_jax/crosstok). Digits pair up from the left ("123" -> "12", "3"). Ids differ from the character
tokenizer's for every token but <pad>.
"""

from __future__ import annotations

from opd_jax.data.char_tokenizer import CHARS

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
PAIRS = [f"{a}{b}" for a in "0123456789" for b in "0123456789"]
VOCAB = {PAD: 0, UNK: 1, EOS: 2, **{t: i + 3 for i, t in enumerate(PAIRS + list(CHARS))}}


def build_number_tokenizer(out_dir: str) -> None:
  """Writes tokenizer.json + tokenizer_config.json to `out_dir` (module docstring)."""
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  tokenizer = Tokenizer(models.WordLevel(dict(VOCAB), unk_token=UNK))
  tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"\d\d|[\s\S]"), behavior="isolated")
  tokenizer.decoder = decoders.Fuse()
  PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=PAD, unk_token=UNK).save_pretrained(
      out_dir)
