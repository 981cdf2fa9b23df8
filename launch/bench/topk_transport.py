"""Top-k transport of a served teacher: bytes per token on the wire and the *_topk objective's error, per K.

  python launch/bench/topk_transport.py --config=configs/smollm2.py [--prompts=16] [--ks=1,8,32,64,256]
      [--out=results/topk_transport.jsonl]

On a calibration batch of the config's pair (the student's temperature-1 samples of held-out prompts), prints per
K: request + response bytes per scored token in vLLM's completions format, and the relative error of the loss and
of the gradient of reverse_kl_topk against the exact reverse KL, side by side (opd_jax/bench/topk_transport.py).
K = 0 is the sampled token only (reverse_kl_pg), K = V the whole distribution. --out keeps one row per (pair, K)
(a rerun replaces them). The training outcome per K: configs/sweeps/topk.py.
"""

import shlex
import sys

from absl import flags
from ml_collections import config_flags

from launch import _cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config of the pair, e.g. configs/smollm2.py.")
_PROMPTS = flags.DEFINE_integer("prompts", 16, "Held-out prompts in the calibration batch.")
_KS = flags.DEFINE_list("ks", ["1", "8", "32", "64", "256"], "Top-k sizes (0 and the vocabulary are added).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed of the calibration batch.")
_OUT = flags.DEFINE_string("out", "", "JSONL file to keep the rows in (one per pair and K).")


def run():
  from opd_jax.bench.host_rss import write_row
  from opd_jax.bench.topk_transport import measure
  from opd_jax.errors import InputError
  from opd_jax.files import check_output_file
  from opd_jax.prepare.pair import prepare_pair
  from opd_jax.screening.calibration import Calibration
  from opd_jax.spec import screening_spec

  try:
    ks = [int(k) for k in _KS.value]
  except ValueError:
    raise InputError(f"--ks must be comma-separated integers, got {','.join(_KS.value)!r}") from None
  if _PROMPTS.value < 1 or min(ks, default=1) < 0:
    raise InputError(f"--prompts must be >= 1 and --ks >= 0, got {_PROMPTS.value} and {ks}")
  if _OUT.value:
    check_output_file(_OUT.value, "--out")
  config = _CONFIG.value
  prepare_pair(config)
  cal = Calibration.from_spec(screening_spec(config), _PROMPTS.value, seed=_SEED.value)
  ks = [k for k in ks if k <= cal.vocab_size]
  rows = measure(cal, ks, config.rollout.max_new_tokens, seed=_SEED.value)
  print(f"{config.pair}: {rows[0]['rows']} responses, {rows[0]['scored_tokens']} tokens, vocabulary {cal.vocab_size}")
  print("| K | bytes / token | loss rel. error | gradient rel. error | gradient cosine |")
  print("|---|---|---|---|---|")
  for row in rows:
    errors = (f"{row['loss_rel_error']:.2e} | {row['grad_rel_error']:.2e} | {row['grad_cosine']:.5f}"
              if "loss" in row else "(sampled token only) | | ")
    print(f"| {row['k']} | {row['bytes_per_token']:.0f} | {errors} |")
    if _OUT.value:
      write_row(_OUT.value, {"name": f"{config.pair}_k{row['k']}", "pair": config.pair, **row,
                             "command": "python " + shlex.join(sys.argv)})


def main(argv):
  del argv
  _cli.log_devices()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main, required=("config",))
