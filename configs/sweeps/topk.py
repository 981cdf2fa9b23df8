"""Top-k transport: how many of the teacher's log-probs per token OPD needs (a served teacher sends K of them).

Every point trains pair1's student with the teacher's top-k support only (reverse_kl_topk: the k most likely
tokens plus one tail bin), against the exact full-vocabulary reverse KL (baseline; K = V = 32 is the same
objective) and the sampled-token policy gradient, which needs no top-k at all (reverse_kl_pg: K = 0, only the
sampled token's log-prob crosses the wire). The loss / gradient error per K at a real vocabulary and the bytes
per token on the wire: launch/bench/topk_transport.py.

  for s in 0 1 2; do python launch/sweep.py --config=configs/sweeps/topk.py:seed=$s \\
      --workdir=runs/sweep_topk_seed$s; done

(copied to results/topk_pair1_seed<S>.jsonl; docs/results.md renders them)
"""

from configs.sweeps.common import sweep_config

TOP_K = (1, 2, 4, 8, 16)

POINTS = (
    ("baseline", ()),  # exact reverse KL over the whole vocabulary (pair1's objective)
    ("sampled_token", (("objective.name", "reverse_kl_pg"),)),
    *((f"top{k}", (("objective.name", "reverse_kl_topk"), ("objective.top_k", k))) for k in TOP_K),
)


def get_config(arg=None):
  return sweep_config("topk", arg, ("pair1",), POINTS)
