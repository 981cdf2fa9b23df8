"""The rollout engines on the main pair1 run (issue 37): the static engine (the baseline point), the paged engine,
and the paged engine in async mode with and without in-flight weight updates, each the main command's full 700
steps (what "reaches the static engine's accuracy" is judged on), one seed per sweep run:

  python launch/sweep.py --config=configs/sweeps/engines.py:seed=S --workdir=runs/sweep_engines_seedS   # S = 0, 1, 2

Each point is `python launch/train.py --config=configs/pair1.py` with its overrides (about 8 minutes on 2 CPU
cores). The paged engine draws each row under its own key, so its samples differ from the static engine's: the
comparison is of accuracy across seeds, not of tokens. Copy each results.jsonl to results/engines/.
"""

from configs.sweeps.common import sweep_config

MAIN_STEPS = 700  # configs/pair1.py's train.steps
POINTS = (
    ("baseline", ()),  # the static engine (the default), what the others are measured against
    ("paged", (("rollout.engine", "paged"),)),
    ("paged_async_inflight", (("rollout.engine", "paged"), ("train.mode", "async"),
                              ("rollout.inflight_updates", True))),
    ("paged_async", (("rollout.engine", "paged"), ("train.mode", "async"))),  # rows finish on their version
)


def get_config(arg=None):
  return sweep_config("engines", arg, ("pair1",), POINTS, default_steps=MAIN_STEPS)
