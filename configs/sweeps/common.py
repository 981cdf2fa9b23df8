"""What every sweep config shares: the short run each point trains, and the arguments that vary it.

Arguments (after the file name, comma-separated), on every sweep:
  pairs=pair1+pair2   the pairs to run ("all" = the three embedded pairs; default: the sweep's own)
  steps=150           learner updates per point (the horizon a calibrated budget is for)
  lr=0.001            AdamW peak learning rate of every point
  objective=NAME      OPD objective of every point (default: the pair config's, reverse_kl)
  seed=0              sampling / data-order seed of every point, and its weight-noise draw (rollout.noise_seed)
  only=a+b            run only these points (e.g. only=baseline+w_int4_kv_int4 to repeat one with more seeds)
A non-default argument is appended to the sweep's name ("noise[steps=75]"), so its rows never mix with
the default run's in one results.jsonl, and rows record steps / lr / objective / seed themselves.
"""

import os

import ml_collections

from configs.common import REPO, parse_arg

PAIRS = ("pair1", "pair2", "pair3")
REAL_PAIRS = ("smollm2",)  # pairs prepared from a real pretrained model (configs/<name>.py); not in "all"
STEPS = 150  # learner updates per point; evaluations at the start and the end only

SHORT_RUN = (  # shared by every sweep: each point trains this long and evaluates at its start and end
    ("train.steps", STEPS),
    ("train.log_every", 10),
    ("train.eval_every", STEPS),
    ("train.eval_size", 256),
    ("train.eval_sampled", False),
    ("train.checkpoint_every", STEPS),
)


def sweep_config(name: str, arg: str | None, default_pairs: tuple[str, ...], points,
                 base=(), default_steps: int = STEPS) -> ml_collections.ConfigDict:
  """A sweep: `points` ((name, ((dotted field, value), ...)), ...) over pairs, varied by the arguments above;
  `base`: the sweep's own overrides of every point (the arguments win over them); `default_steps`: the sweep's own
  run length (steps=N differing from it is appended to the name)."""
  args = parse_arg(arg, pairs="", steps=default_steps, lr=0.0, objective="", seed=0, only="")
  pairs = PAIRS if args.pairs == "all" else tuple(filter(None, args.pairs.split("+"))) or default_pairs
  unknown = [p for p in pairs if p not in PAIRS + REAL_PAIRS and not os.path.isfile(os.path.join(REPO, "configs",
                                                                                               f"{p}.py"))]
  if unknown:
    raise ValueError(f"config argument pairs={args.pairs!r}: unknown pair(s) {unknown}; known: "
                     f"{list(PAIRS + REAL_PAIRS)}, all, or the name of a configs/<name>.py of your own pair")
  if args.steps < 1:
    raise ValueError(f"config argument steps={args.steps} must be >= 1")
  overrides = dict(SHORT_RUN + tuple(base))
  overrides.update({"train.steps": args.steps, "train.eval_every": args.steps, "train.checkpoint_every": args.steps})
  tags = [f"steps={args.steps}"] if args.steps != default_steps else []
  if args.lr:
    overrides["optimizer.learning_rate"] = args.lr
    tags.append(f"lr={args.lr:g}")
  if args.objective:
    overrides["objective.name"] = args.objective
    tags.append(f"objective={args.objective}")
  if args.seed:
    overrides["seed"] = args.seed
    overrides["rollout.noise_seed"] = args.seed  # a seed varies the noise draw too, not only the sampling
    tags.append(f"seed={args.seed}")
  points = tuple(points)
  if args.only:
    wanted = args.only.split("+")
    unknown = sorted(set(wanted) - {p[0] for p in points})
    if unknown:
      raise ValueError(f"config argument only={args.only!r}: no point(s) {unknown}; points: {[p[0] for p in points]}")
    points = tuple(p for p in points if p[0] in wanted)
  c = ml_collections.ConfigDict()
  c.name = name + (f"[{','.join(tags)}]" if tags else "")
  c.pairs = pairs
  c.base_overrides = tuple(overrides.items())
  c.points = points
  return c
