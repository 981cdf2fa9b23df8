"""95% intervals that hold at the study's sample sizes.

- `t_interval`: the seed mean +- t(0.975, n - 1) * sd / sqrt(n). With three seeds a percentile bootstrap of the
  mean is the seeds' [min, max] (it covers the median about 75% of the time); the t-interval is the standard one
  for a mean of a few roughly normal values.
- `wilson_interval`: a binomial proportion over independent units (here: configurations).
- `cluster_interval`: a proportion over runs grouped in clusters (the seeds of one configuration share its
  mismatch, so they are not independent trials): a t-interval on the mean of the clusters' shares.
"""

from __future__ import annotations

import math

import numpy as np

from opd_jax.errors import InputError

# Student's t, 0.975 quantile, degrees of freedom 1..30 (scipy.stats.t.ppf(0.975, df); tests check them).
T_975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788, 2.1604,
         2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555,
         2.0518, 2.0484, 2.0452, 2.0423)
T_INTERVAL = "95% t-interval of the seed mean"  # how tables and decisions name t_interval


def t_quantile(df: int) -> float:
  """t(0.975, df); beyond the table, the normal 1.96 (within 4% of t from df 31 on)."""
  if df < 1:
    raise InputError(f"a t-interval needs >= 2 values (df >= 1), got df={df}")
  return T_975[df - 1] if df <= len(T_975) else 1.96


def t_interval(values: list[float]) -> list[float]:
  """95% t-interval of the mean of `values` (>= 2 of them)."""
  x = np.asarray(values, dtype=np.float64)
  if x.size < 2:
    raise InputError(f"a t-interval needs >= 2 values, got {x.size}")
  half = t_quantile(x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
  return [float(x.mean()) - half, float(x.mean()) + half]


def wilson_interval(successes: int, n: int, z: float = 1.96) -> list[float]:
  """95% Wilson score interval of a binomial proportion (sound at 0 / n and n / n, unlike the normal one)."""
  if n == 0:
    return [0.0, 1.0]
  p = successes / n
  center = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return [0.0 if successes == 0 else max(0.0, center - half), 1.0 if successes == n else min(1.0, center + half)]


def cluster_interval(successes: list[int], sizes: list[int]) -> list[float]:
  """95% interval of a proportion over clustered runs: a t-interval on the clusters' shares (successes / size),
  weighted equally, clipped to [0, 1]. With equal cluster sizes its centre is the pooled share."""
  shares = [s / n for s, n in zip(successes, sizes)]
  lo, hi = t_interval(shares)
  return [max(0.0, lo), min(1.0, hi)]
