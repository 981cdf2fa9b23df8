"""Tiny GGUF checkpoints written by the tests themselves (with the `gguf` package), laid out as llama.cpp's
converter lays them out: quantized projections (Q4_1), a Q8_0 embedding, llama's q / k rows permuted for
interleaved RoPE, and a byte-level BPE tokenizer with a ChatML template in the metadata; or gemma3 (`write_gemma3_gguf`):
Gemma's (1 + weight) norms stored with the 1 folded in, four norms per block, a sliding window, and a SentencePiece
vocabulary (byte fallback, no merges: the converter rebuilds them from the token order)."""

from __future__ import annotations

import numpy as np

CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                 "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                 "{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "Ġ c", "a p", "Ġc ap"]
SHAPE = dict(hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16, ffn=128)


def byte_alphabet() -> list[str]:
  """GPT-2's printable stand-in for each byte 0..255, in byte order."""
  printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
      range(ord("®"), ord("ÿ") + 1))
  out, extra = {}, 0
  for b in range(256):
    if b in printable:
      out[b] = chr(b)
    else:
      out[b] = chr(256 + extra)
      extra += 1
  return [out[b] for b in range(256)]


def tokens() -> tuple[list[str], list[int]]:
  merged = ["".join(m.split(" ")) for m in MERGES]
  vocab = SPECIAL + byte_alphabet() + merged
  return vocab, [3] * len(SPECIAL) + [1] * (len(vocab) - len(SPECIAL))


def permute_rope(weight: np.ndarray, heads: int) -> np.ndarray:
  """What llama.cpp's converter does to llama's q / k rows (HF rotate-half -> interleaved pairs)."""
  rows = weight.shape[0]
  return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _writer(path: str, arch: str, s: dict, rope_base: float):
  """(GGUFWriter with the shape metadata of `s` written, put(name, array, kind): adds a tensor, quantized unless
  kind is F32)."""
  import gguf
  w = gguf.GGUFWriter(path, arch)
  w.add_block_count(s["layers"])
  w.add_context_length(256)
  w.add_embedding_length(s["hidden"])
  w.add_feed_forward_length(s["ffn"])
  w.add_head_count(s["heads"])
  w.add_head_count_kv(s["kv_heads"])
  w.add_rope_freq_base(rope_base)
  w.add_layer_norm_rms_eps(1e-6)

  def put(name, array, kind):
    array = array.astype(np.float32)
    if kind == gguf.GGMLQuantizationType.F32:
      w.add_tensor(name, array)
    else:
      w.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)

  return w, put


def _close(w) -> None:
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def write_gguf(path: str, arch: str = "llama", seed: int = 0, pre: str = "smollm", tie: bool = True,
               vocab_tokens=None) -> None:
  """A random model of `arch` (llama | qwen2 | qwen3, or any name for error tests) at SHAPE."""
  import gguf
  Q4, Q8, F32 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F32
  s = SHAPE
  vocab, types = vocab_tokens or tokens()
  rng = np.random.default_rng(seed)
  w, put = _writer(path, arch, s, 10000.0)
  w.add_rope_dimension_count(s["head_dim"])
  if arch == "qwen3":
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre(pre)
  w.add_token_list(vocab)
  w.add_token_types(types)
  w.add_token_merges(MERGES)
  w.add_bos_token_id(1)
  w.add_eos_token_id(2)
  w.add_pad_token_id(2)
  w.add_add_bos_token(False)
  w.add_chat_template(CHAT_TEMPLATE)

  d, h, q, kv = s["hidden"], s["head_dim"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
  put("token_embd.weight", rng.normal(0, 0.5, (len(vocab), d)), Q8)
  put("output_norm.weight", 1 + rng.normal(0, 0.1, d), F32)
  if not tie:
    put("output.weight", rng.normal(0, 0.2, (len(vocab), d)), Q8)
  for i in range(s["layers"]):
    wq, wk = rng.normal(0, d ** -0.5, (q, d)), rng.normal(0, d ** -0.5, (kv, d))
    if arch == "llama":
      wq, wk = permute_rope(wq, s["heads"]), permute_rope(wk, s["kv_heads"])
    put(f"blk.{i}.attn_q.weight", wq, Q4)
    put(f"blk.{i}.attn_k.weight", wk, Q4)
    put(f"blk.{i}.attn_v.weight", rng.normal(0, d ** -0.5, (kv, d)), Q4)
    put(f"blk.{i}.attn_output.weight", rng.normal(0, q ** -0.5, (d, q)), Q4)
    put(f"blk.{i}.ffn_gate.weight", rng.normal(0, d ** -0.5, (s["ffn"], d)), Q4)
    put(f"blk.{i}.ffn_up.weight", rng.normal(0, d ** -0.5, (s["ffn"], d)), Q4)
    put(f"blk.{i}.ffn_down.weight", rng.normal(0, s["ffn"] ** -0.5, (d, s["ffn"])), Q4)
    put(f"blk.{i}.attn_norm.weight", 1 + rng.normal(0, 0.1, d), F32)
    put(f"blk.{i}.ffn_norm.weight", 1 + rng.normal(0, 0.1, d), F32)
    if arch == "qwen2":
      for name, n in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
        put(f"blk.{i}.{name}.bias", rng.normal(0, 0.1, n), F32)
    if arch == "qwen3":
      put(f"blk.{i}.attn_q_norm.weight", 1 + rng.normal(0, 0.1, h), F32)
      put(f"blk.{i}.attn_k_norm.weight", 1 + rng.normal(0, 0.1, h), F32)
  _close(w)


GEMMA_SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
GEMMA_PIECES = ["\u2581", "\u2581t", "he", "\u2581the", "in", "\u2581a", "ca", "\u2581ca", "\u2581cap", "12", "\u258112"]
# layers 0-4 sliding, layer 5 full (llama.cpp's gemma3 pattern); head_dim 256 as in Gemma 3 270M (transformers'
# GGUF loading assumes query_pre_attn_scalar 256, llama.cpp scales by head_dim: they agree only there)
GEMMA_SHAPE = dict(SHAPE, layers=6, window=4, head_dim=256)


def gemma_tokens() -> tuple[list[str], list[int], list[float]]:
  """(tokens, token types, scores): specials (control; <unk> unknown), the 256 byte-fallback tokens, single
  characters, then merged pieces."""
  chars = sorted(set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+=?:,.!\n\t"))
  vocab = GEMMA_SPECIAL + [f"<0x{b:02X}>" for b in range(256)] + chars + GEMMA_PIECES
  types = [3, 3, 3, 2, 3, 3] + [6] * 256 + [1] * (len(chars) + len(GEMMA_PIECES))
  return vocab, types, [0.0] * len(vocab)


def write_gemma3_gguf(path: str, seed: int = 0) -> None:
  """A random gemma3 model at GEMMA_SHAPE, laid out as llama.cpp's converter writes one."""
  import gguf
  Q4, Q8, F32 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F32
  s = GEMMA_SHAPE
  vocab, types, scores = gemma_tokens()
  rng = np.random.default_rng(seed)
  w, put = _writer(path, "gemma3", s, 1000000.0)
  w.add_key_length(s["head_dim"])
  w.add_value_length(s["head_dim"])
  w.add_sliding_window(s["window"])
  w.add_tokenizer_model("llama")
  w.add_tokenizer_pre("default")
  w.add_token_list(vocab)
  w.add_token_types(types)
  w.add_token_scores(scores)
  w.add_bos_token_id(2)
  w.add_eos_token_id(1)
  w.add_unk_token_id(3)
  w.add_pad_token_id(0)
  w.add_add_bos_token(True)
  w.add_add_space_prefix(False)

  d, h, q, kv = s["hidden"], s["head_dim"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
  norm = lambda n: 1 + rng.normal(0, 0.1, n)  # llama.cpp writes Gemma's norm weights + 1
  put("token_embd.weight", rng.normal(0, 0.5, (len(vocab), d)), Q8)
  put("output_norm.weight", norm(d), F32)
  for i in range(s["layers"]):
    put(f"blk.{i}.attn_q.weight", rng.normal(0, d ** -0.5, (q, d)), Q4)
    put(f"blk.{i}.attn_k.weight", rng.normal(0, d ** -0.5, (kv, d)), Q4)
    put(f"blk.{i}.attn_v.weight", rng.normal(0, d ** -0.5, (kv, d)), Q4)
    put(f"blk.{i}.attn_output.weight", rng.normal(0, q ** -0.5, (d, q)), Q4)
    put(f"blk.{i}.ffn_gate.weight", rng.normal(0, d ** -0.5, (s["ffn"], d)), Q4)
    put(f"blk.{i}.ffn_up.weight", rng.normal(0, d ** -0.5, (s["ffn"], d)), Q4)
    put(f"blk.{i}.ffn_down.weight", rng.normal(0, s["ffn"] ** -0.5, (d, s["ffn"])), Q4)
    for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
      put(f"blk.{i}.{name}.weight", norm(d), F32)
    put(f"blk.{i}.attn_q_norm.weight", norm(h), F32)
    put(f"blk.{i}.attn_k_norm.weight", norm(h), F32)
  _close(w)
