"""Held-out configurations near the budget, for validating the admission check where it can be wrong: noise
levels between the calibration sweep's points (configs/sweeps/sources.py trains 0.1, 0.15, 0.2, 0.3), aimed
at k3 within 3x of the budget (default pair1; pairs=pair3 etc. for the others). Run once per seed;
`study/report.py --validate --heldout_results=...` judges each configuration by its seed-mean quality loss
(each seed against the same seed's baseline).

  for s in 0 1 2; do for p in pair1 pair3; do python launch/sweep.py \
      --config=configs/sweeps/boundary.py:seed=$s,pairs=$p --workdir=runs/sweep_boundary_${p}_seed$s; done; done

(results/boundary_*.jsonl; the same sigmas on both pairs. pair3's budget turned out lower than pair1's, so
sigmas=0.09+0.11+0.13 would aim closer to it.)
"""

from configs.sweeps.common import sweep_config

SIGMAS = (0.125, 0.16, 0.19)  # sigmas=a+b+c to aim at another pair's budget


def get_config(arg=None):
  parts = [p for p in (arg or "").split(",") if p]
  given = next((p.split("=", 1)[1] for p in parts if p.startswith("sigmas=")), "")
  try:
    sigmas = tuple(float(x) for x in given.split("+")) if given else SIGMAS
  except ValueError:
    raise ValueError(f"config argument sigmas={given!r} must be numbers joined by +, e.g. sigmas=0.09+0.11") from None
  rest = ",".join(p for p in parts if not p.startswith("sigmas="))
  points = (("baseline", ()),) + tuple((f"noise_{s:g}", (("rollout.noise_sigma", s),)) for s in sigmas)
  return sweep_config("boundary", rest, ("pair1",), points)
