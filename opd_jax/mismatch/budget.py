"""Mismatch budget: how much sampler-learner mismatch OPD tolerates, calibrated from sweep runs.

Each sweep point gives (mismatch m, quality loss q): m is a run-averaged metric on one scale (k3 by default;
k1 uses |k1| and mult_prob_error uses mult_prob_error - 1 so that 0 means no mismatch), q is the quality loss
against the pair's baseline run of the same seed (`QUALITIES`): by default the drop in final held-out accuracy
(accuracy points, 0..1; negative = better); with quality="reverse_kl" the rise of the final held-out reverse KL to
the teacher, as a fraction of the baseline's (a real pair's measure: continuous, so less noisy than a few dozen
graded answers).

Fit: a hinge in log-mismatch, q(m) = b * max(0, log10(m / m0)): no loss below a knee m0, then a loss that
grows b per decade. m0 is chosen on a grid over the observed mismatches and b >= 0 by least squares.
Budget: the largest m with q(m) <= tolerance, m0 * 10^(tolerance / b) (tolerance absolute, or relative to the
baseline's accuracy), capped at the largest mismatch tested: nothing beyond it was observed, so when the fit
predicts no loss beyond tolerance there (b = 0 included) the budget is that largest mismatch and
`bounded` is False. The budget is also never beyond what the points themselves show: with q made monotone in
m (isotonic regression), the tolerance crossing lies between the last point within tolerance and the first one
beyond it, interpolated in log m; the hinge, rigid above its knee, can otherwise overshoot a point that
already lost more than the tolerance. A 90% interval comes from refitting on bootstrap resamples of the points.
`set_by` records which rule set the point budget (for the crossing: the two points it interpolates between) and
the empty k3 range it lies in (the nearest calibration points below and above it); the hinge's parameters are
labelled not used when the crossing sets the budget.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from opd_jax.errors import InputError

SCALES = {"k3": lambda m: m["mismatch/k3"], "k1": lambda m: abs(m["mismatch/k1"]), "tv": lambda m: m["mismatch/tv"],
          "mult_prob_error": lambda m: m["mismatch/mult_prob_error"] - 1.0}
_FLOOR = 1e-12  # mismatch values below this are treated as exactly zero


@dataclasses.dataclass(frozen=True)
class HingeFit:
  knee: float  # m0
  slope: float  # b: quality loss per decade of mismatch above the knee
  r2: float
  n: int

  def predict(self, m: np.ndarray) -> np.ndarray:
    m = np.maximum(np.asarray(m, float), _FLOOR)
    return self.slope * np.maximum(0.0, np.log10(m / self.knee))

  def budget(self, tolerance: float, max_observed: float) -> float:
    """Largest m with predicted loss <= tolerance, never beyond the largest mismatch tested."""
    if self.slope <= 0 or max_observed <= self.knee or tolerance / self.slope >= math.log10(max_observed / self.knee):
      return max_observed
    return self.knee * 10 ** (tolerance / self.slope)


def fit_hinge(m: np.ndarray, q: np.ndarray) -> HingeFit:
  m = np.maximum(np.asarray(m, float), _FLOOR)
  q = np.asarray(q, float)
  positive = m[m > _FLOOR]
  if positive.size == 0:
    return HingeFit(knee=_FLOOR, slope=0.0, r2=0.0, n=len(m))
  candidates = np.unique(np.concatenate([positive, np.geomspace(positive.min(), positive.max(), 25)]))
  best = None
  for knee in candidates:
    x = np.maximum(0.0, np.log10(m / knee))
    slope = max(0.0, float(x @ q / (x @ x))) if x @ x > 0 else 0.0
    sse = float(np.sum((q - slope * x) ** 2))
    if best is None or sse < best[0] - 1e-15:
      best = (sse, knee, slope)
  sse, knee, slope = best
  total = float(np.sum((q - q.mean()) ** 2))
  return HingeFit(knee=float(knee), slope=slope, r2=1 - sse / total if total > 0 else 0.0, n=len(m))


def isotonic(q_sorted: np.ndarray) -> np.ndarray:
  """Non-decreasing least-squares fit (pool adjacent violators) of values already sorted by mismatch."""
  blocks = []  # [mean, weight]
  for value in np.asarray(q_sorted, float):
    blocks.append([value, 1.0])
    while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
      (v2, w2), (v1, w1) = blocks.pop(), blocks.pop()
      blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2])
  return np.concatenate([np.full(int(w), v) for v, w in blocks])


def crossing_bracket(m: np.ndarray, q: np.ndarray, tolerance: float) -> tuple[int | None, int] | None:
  """Indices into `m` of the two points the observed crossing interpolates between: the last one whose monotone
  (isotonic) loss is within the tolerance (None when the first point is already beyond it) and the first one
  beyond it; None when no point is beyond it."""
  order = np.argsort(m, kind="stable")
  q_iso = isotonic(np.asarray(q, float)[order])
  beyond = np.nonzero(q_iso > tolerance)[0]
  if beyond.size == 0:
    return None
  i = int(beyond[0])
  return (None if i == 0 else int(order[i - 1])), int(order[i])


def observed_crossing(m: np.ndarray, q: np.ndarray, tolerance: float) -> float:
  """Where the monotone envelope of the points first exceeds the tolerance (inf if it never does)."""
  order = np.argsort(m, kind="stable")
  m_sorted, q_iso = np.maximum(np.asarray(m, float)[order], _FLOOR), isotonic(np.asarray(q, float)[order])
  beyond = np.nonzero(q_iso > tolerance)[0]
  if beyond.size == 0:
    return math.inf
  i = beyond[0]
  if i == 0:
    return float(m_sorted[0])
  m0, m1, q0, q1 = m_sorted[i - 1], m_sorted[i], q_iso[i - 1], q_iso[i]
  if m1 <= m0:
    return float(m0)
  frac = (tolerance - q0) / (q1 - q0)
  return float(m0 * (m1 / m0) ** frac)


def monotone_losses(m: np.ndarray, q: np.ndarray) -> np.ndarray:
  """Each point's isotonic (monotone in m) quality loss, in the points' own order."""
  order = np.argsort(m, kind="stable")
  out = np.empty(len(m))
  out[order] = isotonic(np.asarray(q, float)[order])
  return out


def how_set(rows: list[dict], m: np.ndarray, q: np.ndarray, tolerance: float, fit: HingeFit, budget: float) -> dict:
  """What sets `budget` (budget.json's `set_by`): the observed crossing (the two points it interpolates between,
  with their mismatch and seed-mean and monotone losses), the hinge fit (its knee and slope) or the largest
  mismatch tested (unbounded); and `empty_range`, the nearest calibration points below and above the budget,
  between which no point was measured (their ratio says how far the budget is from any measurement)."""
  name = lambda i: f"{rows[i]['pair']}/{rows[i]['point']}"
  iso = monotone_losses(m, q)
  point = lambda i: {"point": name(i), "mismatch": float(m[i]), "quality_loss": float(q[i]),
                     "monotone_loss": float(iso[i])}
  crossing = observed_crossing(m, q, tolerance)
  if budget >= float(m.max()) and crossing > budget:
    entry = {"rule": "largest mismatch tested (no point lost more than the tolerance)",
             "point": point(int(np.argmax(m)))}
  elif crossing <= budget:
    below, above = crossing_bracket(m, q, tolerance)
    entry = {"rule": "observed crossing: log-m interpolation of the monotone (isotonic) quality loss between the "
                     "last point within the tolerance and the first beyond it",
             "between": [point(i) for i in (below, above) if i is not None]}
  else:
    entry = {"rule": "hinge fit: knee * 10^(tolerance / slope)", "knee": fit.knee, "slope": fit.slope}
  under, over = np.nonzero(m <= budget)[0], np.nonzero(m > budget)[0]
  low = int(under[np.argmax(m[under])]) if under.size else None
  high = int(over[np.argmin(m[over])]) if over.size else None
  entry["empty_range"] = {"below": None if low is None else point(low), "above": None if high is None else point(high),
                          "ratio": (float(m[high] / m[low]) if low is not None and high is not None and m[low] > 0
                                    else None)}
  return entry


def _budget(m: np.ndarray, q: np.ndarray, tolerance: float) -> tuple[HingeFit, float]:
  fit = fit_hinge(m, q)
  return fit, min(fit.budget(tolerance, float(m.max())), observed_crossing(m, q, tolerance))


# quality -> (the sweep-row field its loss needs, how to read the loss of a row, the unit of its tolerance).
QUALITIES = {
    "accuracy": ("delta_final_accuracy", lambda r: -r["delta_final_accuracy"], "accuracy points"),
    "reverse_kl": ("delta_final_reverse_kl",
                   lambda r: r["delta_final_reverse_kl"] / (r["final_reverse_kl"] - r["delta_final_reverse_kl"]),
                   "of the baseline's reverse KL"),
}


def check_quality(quality: str, relative: bool = False) -> None:
  if quality not in QUALITIES:
    raise InputError(f"quality {quality!r} is not one of {sorted(QUALITIES)}")
  if relative and quality != "accuracy":
    raise InputError(f"quality={quality!r} is already relative to the baseline; drop --relative")


def has_quality(row: dict, quality: str = "accuracy") -> bool:
  """A finished sweep row whose quality loss against its baseline is known."""
  return row.get("status") == "ok" and row.get(QUALITIES[quality][0]) is not None


def quality_losses(rows: list[dict], tolerance: float, relative: bool,
                   quality: str = "accuracy") -> tuple[np.ndarray, float]:
  """(quality loss per row, absolute tolerance in the quality's unit)."""
  q = np.array([QUALITIES[quality][1](r) for r in rows], dtype=np.float64)
  if relative:
    baseline = np.mean([r["final_accuracy"] - r["delta_final_accuracy"] for r in rows])
    return q, tolerance * baseline
  return q, tolerance


def calibrate(rows: list[dict], *, scale: str = "k3", tolerance: float = 0.02, relative: bool = False,
              bootstrap: int = 1000, seed: int = 0, quality: str = "accuracy") -> dict:
  """Budget on one scale from sweep rows (status ok, with deltas). Returns a JSON-ready dict."""
  check_quality(quality, relative)
  rows = [r for r in rows if has_quality(r, quality)]
  if len(rows) < 3:
    raise InputError(f"budget calibration needs >= 3 finished sweep points with a baseline, got {len(rows)}")
  if scale not in SCALES:
    raise InputError(f"scale {scale!r} is not one of {sorted(SCALES)}")
  m = np.array([SCALES[scale](r["mismatch"]) for r in rows])
  q, tol = quality_losses(rows, tolerance, relative, quality)
  # Points that are seed means (calibrate_report's seed_means) carry their seeds' runs: the bootstrap resamples the
  # points, then each drawn point's seeds (a point of one seed draws nothing more, so single runs bootstrap as before).
  seed_m = [np.array([SCALES[scale](s["mismatch"]) for s in r.get("seed_rows", [r])]) for r in rows]
  seed_q = [quality_losses(r.get("seed_rows", [r]), tolerance, relative, quality)[0] for r in rows]
  fit, budget = _budget(m, q, tol)
  bounded = budget < float(m.max())
  set_by = how_set(rows, m, q, tol, fit, budget)
  rng = np.random.default_rng(seed)
  samples = []
  for _ in range(bootstrap):
    idx = rng.integers(0, len(m), len(m))
    m_b, q_b = m[idx].copy(), q[idx].copy()
    for j, i in enumerate(idx):
      if len(seed_m[i]) > 1:
        pick = rng.integers(0, len(seed_m[i]), len(seed_m[i]))
        m_b[j], q_b[j] = seed_m[i][pick].mean(), seed_q[i][pick].mean()
    samples.append(_budget(m_b, q_b, tol)[1])
  samples = np.array(samples)
  return {"scale": scale, "quality": quality, "tolerance": tolerance, "tolerance_relative": relative,
          "tolerance_abs": tol,
          "budget": budget, "interval": [float(np.percentile(samples, 5)), float(np.percentile(samples, 95))],
          "bootstrap_budgets": np.sort(samples).tolist(),
          "set_by": set_by,
          "fit": {"model": "q = slope * max(0, log10(m / knee))", "knee": fit.knee, "slope": fit.slope,
                  "r2": fit.r2, "n": fit.n, "sets_budget": set_by["rule"].startswith("hinge"),
                  **({} if set_by["rule"].startswith("hinge") else
                     {"note": "not used: the point budget is set as `set_by` says; the hinge enters the interval's "
                              "resamples only"})},
          "bounded": bounded,
          "points": [{"pair": r["pair"], "point": r["point"], "mismatch": float(mi), "quality_loss": float(qi),
                      **({"seeds": len(sm), "seed_quality_losses": sq.tolist()} if "seed_rows" in r else {})}
                     for r, mi, qi, sm, sq in zip(rows, m, q, seed_m, seed_q)]}


def verdict(measured: float, budget: dict) -> dict:
  """ADMIT when the measured mismatch is within the budget; confidence = share of bootstrap budgets that agree."""
  samples = np.asarray(budget["bootstrap_budgets"])
  admit = measured <= budget["budget"]
  agree = float(np.mean(samples >= measured)) if admit else float(np.mean(samples < measured))
  margin = (budget["budget"] - measured) / budget["budget"] if budget["budget"] > 0 else -math.inf
  return {"admit": bool(admit), "measured": float(measured), "budget": budget["budget"],
          "interval": budget["interval"], "margin": float(margin), "confidence": agree}
