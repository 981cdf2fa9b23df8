"""Prefix-shift analysis of sampler weight noise (see opd_jax/screening/prefix_shift.py).

  python -m study.prefix_shift --config=configs/pair1.py --noise=0.01,0.03,0.1 [--out=DIR]

Prints a table over the sigma grid and writes DIR/prefix_shift.json and DIR/prefix_shift.png.
"""

import os

from absl import flags
from ml_collections import config_flags

from launch import _cli
from opd_jax.errors import InputError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Pair config, e.g. configs/pair1.py.", lock_config=True)
_NOISE = flags.DEFINE_list("noise", ["0.003", "0.01", "0.03", "0.1"], "Noise sigma grid.")
_PROMPTS = flags.DEFINE_integer("prompts", 256, "Calibration prompts (held-out split).")
_OUT = flags.DEFINE_string("out", None, "Output dir (default runs/prefix_shift_<pair>).")
_SEED = flags.DEFINE_integer("seed", 0, "Calibration prompts and sampling key.")


def run():
  from opd_jax.prepare.pair import prepare_pair
  from opd_jax.spec import screening_spec
  from study.analysis import prefix_shift
  from opd_jax.files import check_output_dir
  try:
    sigmas = [float(s) for s in _NOISE.value]
  except ValueError:
    raise InputError(f"--noise must be comma-separated numbers, got {','.join(_NOISE.value)!r}") from None
  if not sigmas or min(sigmas) < 0:
    raise InputError("--noise needs one or more sigma >= 0")
  config = _CONFIG.value
  out = _OUT.value or os.path.join("runs", f"prefix_shift_{config.pair}")
  check_output_dir(out, "--out")
  prepare_pair(config)
  prefix_shift.run(screening_spec(config), sigmas, out, num_prompts=_PROMPTS.value, seed=_SEED.value)


def main(argv):
  del argv
  _cli.log_devices()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main, required=("config",))
