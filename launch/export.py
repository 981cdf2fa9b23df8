"""Export a training run's student as a Hugging Face checkpoint (safetensors, config, tokenizer).

  python launch/export.py --workdir=DIR --out=OUT [--step=N] [--dtype=float32|bfloat16]

Reads DIR/config.json and the orbax checkpoint of step N (default: the latest) under DIR/checkpoints, and writes
OUT (replaced only once the new export is complete), which transformers' AutoModelForCausalLM, launch/sample.py
--checkpoint=OUT and --config.student=OUT read. Exit code 2 on bad input (one `error:` line).
"""

from absl import flags

from launch import _cli

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory of launch/train.py.")
_OUT = flags.DEFINE_string("out", None, "Directory to write the HF checkpoint to (replaced if it exists).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the latest).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "dtype of the exported tensors.")


def export():
  from opd_jax.errors import InputError
  from opd_jax.train import export as export_lib
  if _STEP.value is not None and _STEP.value < 0:  # flags first: checked before the workdir is read
    raise InputError(f"--step must be a checkpoint step >= 0, got {_STEP.value} (omit it for the latest)")
  step = export_lib.resolve_step(_WORKDIR.value, _STEP.value)
  out = export_lib.export_from_workdir(_WORKDIR.value, _OUT.value, step, dtype=_DTYPE.value)
  print(f"exported step {step} to {out}")


def main(argv):
  del argv
  _cli.quiet_logs()
  _cli.run_or_exit(export)


if __name__ == "__main__":
  _cli.run(main, required=("workdir", "out"))
