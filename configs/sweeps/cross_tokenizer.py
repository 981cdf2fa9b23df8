"""The cross-tokenizer objectives on the embedded cross-tokenizer pair (configs/pairx.py: pair1's student, digits one
by one; a teacher that writes two-digit numbers as one token), each pair1's main 700 steps, one seed per sweep run:

  python launch/sweep.py --config=configs/sweeps/cross_tokenizer.py:seed=S --workdir=runs/sweep_xtok_seedS  # S = 0, 1, 2

Points: the span form of the policy gradient (reverse_kl_pg), next-character marginals at span starts (reverse_kl,
configs/pairx.py's default; the point named baseline, which the others are listed against), the ULD baseline
(uld) and reverse_kl with the chain split (chain; a rerun of a finished sweep runs only it). pair1's own main run
(same student, a teacher trained with the same recipe on the student's tokenizer) is the same-tokenizer reference
(results/pair1_main). Copy each results.jsonl to results/cross_tokenizer/.
"""

from configs.sweeps.common import sweep_config

MAIN_STEPS = 700  # configs/pair1.py's train.steps
POINTS = (
    ("baseline", (("objective.name", "reverse_kl"),)),  # next-character marginals
    ("span_pg", (("objective.name", "reverse_kl_pg"),)),
    ("uld", (("objective.name", "uld"),)),
    # the chain split: the marginals' first-character KL plus a policy gradient on the rest given that character,
    # whose expected gradient is the exact reverse KL's (docs/cross_tokenizer.md); added after the three above ran
    ("chain", (("objective.name", "reverse_kl"), ("objective.marginal_span", "chain"))),
)


def get_config(arg=None):
  # the sampled evaluation measures the held-out span KL to the teacher (eval/span_reverse_kl)
  return sweep_config("cross_tokenizer", arg, ("pairx",), POINTS, base=(("train.eval_sampled", True),),
                      default_steps=MAIN_STEPS)
