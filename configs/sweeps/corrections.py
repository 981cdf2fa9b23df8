"""Importance corrections under sampler weight noise: per token (tis, mis) and per sequence (seq_tis, geo_tis,
geo_reject), on the sampled-token OPD objective reverse_kl_pg (the only OPD objective that weights tokens by
pi / mu; the exact-vocabulary objectives have no sampled-token estimate to correct), at noise 0.15, where
reverse_kl on pair1 starts to lose quality (configs/sweeps/noise.py). The two sequence-level kinds that
collapse run once more with the ESS guard (objective.min_ess=0.1: an update whose weights keep an effective
tenth of the batch's tokens or less is skipped).

  python launch/sweep.py --config=configs/sweeps/corrections.py --workdir=runs/sweep_corrections
  python launch/sweep.py --config=configs/sweeps/corrections.py:objective=grpo,lr=0.0001,only=baseline+\
noise_0.15_none+noise_0.15_tis+noise_0.15_mis+noise_0.15_seq_tis+noise_0.15_geo_tis+noise_0.15_geo_reject \
      --workdir=runs/sweep_corrections_grpo        # the same for GRPO at its learning rate (results/corrections_grpo.jsonl)
"""

from configs.sweeps.common import sweep_config

KINDS = ("none", "tis", "mis", "seq_tis", "geo_tis", "geo_reject")
SIGMAS = (0.15,)
GUARDED = ("seq_tis", "geo_reject")
MIN_ESS = 0.1


def get_config(arg=None):
  points = (("baseline", ()),) + tuple(
      (f"noise_{s:g}_{kind}", (("rollout.noise_sigma", s), ("objective.importance", kind)))
      for s in SIGMAS for kind in KINDS) + tuple(
      (f"noise_{s:g}_{kind}_min_ess{MIN_ESS:g}", (("rollout.noise_sigma", s), ("objective.importance", kind),
                                                  ("objective.min_ess", MIN_ESS)))
      for s in SIGMAS for kind in GUARDED)
  return sweep_config("corrections", arg, ("pair1",), points, base=(("objective.name", "reverse_kl_pg"),))
