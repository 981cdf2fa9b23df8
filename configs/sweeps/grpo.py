"""The GRPO baseline on pair1 under the mismatch OPD tolerates (fp8 weights + fp8 KV, staleness up to 32) and
under the weight noise that starts to cost OPD quality.

  python launch/sweep.py --config=configs/sweeps/grpo.py --workdir=runs/sweep_grpo

Every point, the baseline included, trains with objective grpo; deltas are against that GRPO baseline, and
the OPD side of the comparison is configs/sweeps/{quantization,staleness,noise}.py (same pair, sampler,
knobs, 64 responses per update, run length). GRPO samples 8 prompts x 8 responses and learns from graded answers instead of the
teacher. Its learning rate is 1e-4: at OPD's 1e-3 it collapsed on pair1 (reward 0.21 -> 0 within 40
updates); 3e-4 reached 43.0% and 1e-4 45.3% after 150 steps.
"""

import ml_collections

from configs.sweeps.common import SHORT_RUN

SIGMAS = (0.1, 0.15, 0.2, 0.3)  # where OPD starts to lose quality (configs/sweeps/noise.py)
GRPO = (("objective.name", "grpo"), ("objective.group_size", 8), ("optimizer.learning_rate", 1e-4))


def get_config(arg=None):
  del arg
  c = ml_collections.ConfigDict()
  c.name = "grpo"
  c.pairs = ("pair1",)
  c.base_overrides = SHORT_RUN + GRPO
  c.points = ((("baseline", ()),
               ("w_fp8_kv_fp8", (("rollout.weights", "fp8"), ("rollout.kv_cache", "fp8_e4m3"))),
               ("stale_8", (("rollout.staleness_steps", 8),)),
               ("stale_32", (("rollout.staleness_steps", 32),)))
              + tuple((f"noise_{s:g}", (("rollout.noise_sigma", s),)) for s in SIGMAS)
              + (("noise_0.2_tis", (("rollout.noise_sigma", 0.2), ("objective.importance", "tis"))),))
  return c
