"""Per-layer / per-module quantization sensitivity and a model-specific recipe.

  python launch/sensitivity.py --config=configs/pair1.py --weights=fp8 [--target_k3=X] [--out=DIR]

Prints a ranked table, writes DIR/sensitivity_<weights>.json, DIR/sensitivity_<weights>.png and
DIR/recipe_<weights>.json; the recipe is used with --config=configs/pair1.py:recipe=DIR/recipe_<weights>.json.
No training: a calibration batch of held-out prompts only.
"""

import os

from absl import flags
from ml_collections import config_flags

from launch import _cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Pair config, e.g. configs/pair1.py.", lock_config=True)
_WEIGHTS = flags.DEFINE_string("weights", "fp8", "Precision to scan: int8 | fp8 | fp8_e5m2 | bf16.")
_PROMPTS = flags.DEFINE_integer("prompts", 128, "Calibration prompts (held-out split).")
_TARGET = flags.DEFINE_float("target_k3", -1.0, "Recipe target k3; <0 = half the all-quantized k3.")
_OUT = flags.DEFINE_string("out", None, "Output dir (default runs/sensitivity_<pair>).")
_SEED = flags.DEFINE_integer("seed", 0, "Calibration prompts and sampling key.")


def run():
  from opd_jax.experiments import sensitivity_report
  from opd_jax.files import check_output_dir
  from opd_jax.prepare.pair import prepare_pair
  from opd_jax.spec import screening_spec
  from opd_jax.rollout import precision
  config = _CONFIG.value
  out = _OUT.value or os.path.join("runs", f"sensitivity_{config.pair}")
  precision.canonical_precision(_WEIGHTS.value)  # flags first, then files
  check_output_dir(out, "--out")
  prepare_pair(config)
  sensitivity_report.run(screening_spec(config), _WEIGHTS.value, out, num_prompts=_PROMPTS.value, target_k3=_TARGET.value,
                         seed=_SEED.value)


def main(argv):
  del argv
  _cli.log_devices()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main, required=("config",))
