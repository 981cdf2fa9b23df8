"""The prefix-shift analysis as a command: table over sigma, JSON and a two-panel plot."""

from __future__ import annotations

import os

from opd_jax.experiments.files import write_json
from opd_jax.screening.calibration import Calibration
from opd_jax.screening.prefix_shift import analyze
from opd_jax.spec import RunSpec

_COLUMNS = (("sigma", "sigma", "{:.3g}"), ("same_prefix_k3", "k3 same", "{:.3g}"),
            ("own_tokens_k3", "k3 own", "{:.3g}"), ("prefix_kl_clean", "KL clean", "{:.4f}"),
            ("prefix_kl_noisy", "KL noisy", "{:.4f}"), ("k1_naive_error", "naive err", "{:+.4f}"),
            ("k1_tis_error", "TIS err", "{:+.4f}"), ("accuracy_clean", "acc clean", "{:.3f}"),
            ("accuracy_noisy", "acc noisy", "{:.3f}"), ("first_divergence_mean", "1st diff", "{:.1f}"))


def run(spec: RunSpec, sigmas: list[float], out: str, *, num_prompts: int, seed: int) -> list[dict]:
  rollout = spec.rollout
  cal = Calibration.from_spec(spec, num_prompts, seed)
  rows = [analyze(cal, rollout, sigma, seed) for sigma in sigmas]
  print(f"{spec.pair.name}: prefix shift from sampler weight noise, {num_prompts} held-out prompts")
  print("  ".join(f"{title:>10}" for _, title, _ in _COLUMNS))
  for row in rows:
    print("  ".join(f"{fmt.format(row[key]):>10}" for key, _, fmt in _COLUMNS))
  print(format_corrections(rows))
  os.makedirs(out, exist_ok=True)
  write_json(os.path.join(out, "prefix_shift.json"), {"pair": spec.pair.name, "prompts": num_prompts, "rows": rows})
  plot(rows, spec.pair.name, os.path.join(out, "prefix_shift.png"))
  print(f"wrote {out}/prefix_shift.json and prefix_shift.png")
  return rows


def format_corrections(rows: list[dict]) -> str:
  """Per sigma and correction: error of the weighted OPD estimate vs the clean sampler's prefix KL, the prefix
  shift left after reweighting, share of responses kept, effective sample size."""
  lines = ["corrections on the noisy rollouts (vs KL on the clean sampler's prefixes):",
           f"{'sigma':>6}  {'correction':<11} {'k1 error':>9} {'shift left':>10} {'kept':>6} {'ESS':>6}"]
  for row in rows:
    for kind, c in row["corrections"].items():
      signed = lambda x, width: f"{'n/a':>{width}}" if x is None else f"{x:>+{width}.4f}"
      lines.append(f"{row['sigma']:>6.3g}  {kind:<11} {signed(c['k1_error'], 9)} {signed(c['shift'], 10)} "
                   f"{c['kept']:>6.0%} {c['ess']:>6.0%}")
  return "\n".join(lines)


def plot(rows: list[dict], pair: str, path: str) -> str:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  sigma = [r["sigma"] for r in rows]
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
  left.plot(sigma, [r["prefix_shift"] for r in rows], "o-", label="prefix shift (KL noisy - KL clean prefixes)")
  left.plot(sigma, [abs(r["k1_naive_error"]) for r in rows], "s--", label="|per-token error|, no correction")
  left.plot(sigma, [abs(r["k1_tis_error"]) for r in rows], "^--", label="|per-token error| after TIS")
  left.set_xscale("log")
  left.set_xlabel("weight noise sigma (relative, per tensor)")
  left.set_ylabel("nats / token")
  left.set_title(f"{pair}: what per-token IS repairs")
  left.legend(fontsize=8)
  right.plot(sigma, [r["accuracy_clean"] for r in rows], "o-", label="clean sampler")
  right.plot(sigma, [r["accuracy_noisy"] for r in rows], "s-", label="noisy sampler")
  right.set_xscale("log")
  right.set_xlabel("weight noise sigma (relative, per tensor)")
  right.set_ylabel("held-out accuracy (fraction)")
  right.set_title(f"{pair}: quality of the prefixes reached")
  right.legend(fontsize=8)
  fig.tight_layout()
  tmp = path + ".tmp.png"
  fig.savefig(tmp, dpi=110)
  plt.close(fig)
  os.replace(tmp, path)
  return path
