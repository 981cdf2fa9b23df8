"""A GGUF file's tokenizer metadata -> tokenizer.json + tokenizer_config.json.

A SentencePiece vocabulary (`tokenizer.ggml.model` "llama": Gemma, Llama 2) is converted by transformers' own GGUF
tokenizer code (`sentencepiece_tokenizer`), so the import tokenizes exactly as transformers' GGUF loading does;
byte-level BPE is rebuilt here, as follows.

llama.cpp stores a BPE vocabulary as `tokenizer.ggml.tokens` (already spelled in the byte-level alphabet,
`Ġ` for a space), `tokenizer.ggml.merges` ("a b" strings), `tokenizer.ggml.token_type` (3 = control, e.g.
`<|im_end|>`; 4 = user-defined) and names the pre-tokenizer (`tokenizer.ggml.pre`: how text is split before
the merges apply). We rebuild the same tokenizer with the `tokenizers` library. The pre-tokenizer split rules
below are the published ones of each family (HF tokenizer.json files / llama.cpp's `llama-vocab.cpp`); an
unknown name is an error rather than a silent GPT-2 fallback, since a wrong split changes token ids.
"""

from __future__ import annotations

from opd_jax.models.config import CheckpointError

_CONTROL, _USER_DEFINED = 3, 4

# Split rules of the pre-tokenizers we know, applied before byte-level mapping (see the module docstring).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# name -> (split digits one by one first, regex split or None for GPT-2's own byte-level regex)
PRE_TOKENIZERS = {
    "gpt2": (False, None), "default": (False, None),
    "smollm": (True, None),  # SmolLM / SmolLM2: single digits, then GPT-2's byte-level split
    "llama-bpe": (False, _LLAMA3_SPLIT), "llama3": (False, _LLAMA3_SPLIT),
    "qwen2": (False, _QWEN2_SPLIT),
}


def sentencepiece_tokenizer(source: str) -> tuple[str, dict]:
  """(tokenizer.json text, tokenizer_config.json dict) of the SentencePiece vocabulary of the GGUF at `source`,
  through transformers' GGUF tokenizer conversion (the file is read again by transformers' own reader)."""
  try:
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer
  except ImportError:
    raise CheckpointError(f"{source}: a SentencePiece GGUF vocabulary needs transformers' GGUF tokenizer conversion "
                          "(transformers 5.24, as constraints.txt pins)") from None
  architecture, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(source)
  backend, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
  bos = tokenizer_config.get("bos_token")
  if tokenizer_config.get("add_bos_token") and bos is not None:  # what transformers' tokenizer class adds itself
    from tokenizers import processors
    bos_id = backend.token_to_id(bos)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)])
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
            **{k: v for k, v in tokenizer_config.items() if v is not None}}
  return backend.to_str(), config


def build_tokenizer(meta: dict, source: str) -> tuple[str, dict]:
  """(tokenizer.json text, tokenizer_config.json dict) from the GGUF metadata `meta` (key -> value) of the file at
  `source`."""
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
  kind = meta.get("tokenizer.ggml.model")
  if kind == "llama":
    return sentencepiece_tokenizer(source)
  if kind != "gpt2":
    raise CheckpointError(f"{source}: tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2' or "
                          "SentencePiece 'llama'); import the model's HF directory instead")
  pre = meta.get("tokenizer.ggml.pre") or "default"
  if pre not in PRE_TOKENIZERS:
    raise CheckpointError(f"{source}: pre-tokenizer {pre!r} is not known (known: {', '.join(sorted(PRE_TOKENIZERS))});"
                          " its split rule decides token ids, so it cannot be guessed")
  tokens = list(meta.get("tokenizer.ggml.tokens") or [])
  merges = list(meta.get("tokenizer.ggml.merges") or [])
  if not tokens or not merges:
    raise CheckpointError(f"{source}: the file has no tokenizer vocabulary or merges (tokenizer.ggml.tokens / "
                          "tokenizer.ggml.merges)")
  types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
  pairs = []
  for merge in merges:
    left, sep, right = merge.partition(" ")
    if not sep:
      raise CheckpointError(f"{source}: merge {merge!r} is not two tokens separated by a space")
    pairs.append((left, right))
  vocab = {token: index for index, token in enumerate(tokens)}
  tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
  digits, split = PRE_TOKENIZERS[pre]
  steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
  if split is None:
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
  else:
    steps += [pre_tokenizers.Split(Regex(split), behavior="isolated"),
              pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
  tokenizer.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
  tokenizer.decoder = decoders.ByteLevel()
  tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
  tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, kind in zip(tokens, types) if kind == _CONTROL])
  tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, kind in zip(tokens, types) if kind == _USER_DEFINED])

  def token(key: str):
    index = meta.get(f"tokenizer.ggml.{key}")
    return tokens[index] if isinstance(index, int) and 0 <= index < len(tokens) else None

  config = {
      "tokenizer_class": "PreTrainedTokenizerFast",  # tokenizer.json as written (opd_jax.models.tokenizer)
      "bos_token": token("bos_token_id"),
      "eos_token": token("eos_token_id"),
      "unk_token": token("unknown_token_id"),
      "pad_token": token("padding_token_id"),
      "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
      "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
      "clean_up_tokenization_spaces": False,
  }
  if meta.get("tokenizer.chat_template"):
    config["chat_template"] = meta["tokenizer.chat_template"]
  return tokenizer.to_str(), {k: v for k, v in config.items() if v is not None}
