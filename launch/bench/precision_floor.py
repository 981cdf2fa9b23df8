"""Mixed-precision mismatch floor: k3 of a float32 / bfloat16 sampler against a float32 / bfloat16 learner with
identical weights, with and without int8 / fp8 weight recipes.

  python launch/bench/precision_floor.py --config=configs/pair1.py [--prompts=256] [--out=FILE.json]

Goal: a bfloat16-compute learner against a float32 sampler stays at k3 <= 1e-4 on pair1.
"""

from absl import flags
from ml_collections import config_flags

from launch import _cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Pair config, e.g. configs/pair1.py.", lock_config=True)
_PROMPTS = flags.DEFINE_integer("prompts", 256, "Calibration prompts (held-out split).")
_OUT = flags.DEFINE_string("out", "", "JSON file to write the rows to (with the config and prompts), e.g. "
                           "results/precision_floor_pair1.json; written whole or not at all.")


def run():
  from opd_jax.bench.precision_floor import measure_floor
  from opd_jax.prepare.pair import prepare_pair
  from opd_jax.spec import screening_spec
  if _OUT.value:
    from opd_jax.files import check_output_file
    check_output_file(_OUT.value, "--out")
  prepare_pair(_CONFIG.value)
  rows = measure_floor(screening_spec(_CONFIG.value), _PROMPTS.value)
  print(f"{'sampler':<9} {'learner':<9} {'weights':<8} {'k3':>10} {'k1':>10} {'vocab KL':>10}")
  for r in rows:
    print(f"{r['sampler_compute']:<9} {r['learner_compute']:<9} {r['weights']:<8} {r['k3']:>10.3g} {r['k1']:>10.3g} "
          f"{r['vocab_kl']:>10.3g}")
  if _OUT.value:
    from opd_jax.bench.precision_floor import write_floor
    write_floor(_OUT.value, _CONFIG.value.pair, _PROMPTS.value, rows)
    print(f"wrote {_OUT.value}")


def main(argv):
  del argv
  _cli.log_devices()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main, required=("config",))
