"""Builds the embedded teacher-student pairs: python -m study.build_pairs [--pairs=pair1,pair2,pair3]

Deterministic (seeded init, data and XLA CPU numerics); overwrites opd_jax/assets/<pair>/{teacher,student} and
build_info.json with the measured held-out accuracies. docs/study.md lists the run time on 2 CPU cores.
"""

from absl import flags

from launch import _cli

_PAIRS = flags.DEFINE_list("pairs", ["pair1", "pair2", "pair3"], "Which pairs to build.")
_ROLES = flags.DEFINE_list("roles", ["teacher", "student"], "Which models of each pair to (re)build.")
_OUT = flags.DEFINE_string("out", None, "Output root (default: opd_jax/assets).")


def main(argv):
  del argv
  _cli.log_devices()
  from opd_jax.files import check_output_dir
  from opd_jax.train import pairs
  def check():  # the flags first (the pair names), then the output folder, before any pair is built
    from opd_jax.errors import InputError
    unknown = [name for name in _PAIRS.value if name not in pairs.PAIRS]
    if unknown:
      raise InputError(f"unknown pair {unknown[0]!r}; known: {sorted(pairs.PAIRS)}")
    check_output_dir(_OUT.value or pairs.ASSETS, "--out")
  _cli.run_or_exit(check)
  for name in _PAIRS.value:
    _cli.run_or_exit(lambda: pairs.build_pair(name, _OUT.value or pairs.ASSETS, tuple(_ROLES.value)))


if __name__ == "__main__":
  _cli.run(main)
