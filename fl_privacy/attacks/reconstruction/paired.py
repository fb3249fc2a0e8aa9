"""Two servers' recovery on the same clients: the paired difference and its interval (issue 49).

The fixed and the adaptive server attack the same private clients (common keys), so their
difference is measured per client: d_t = (successes of the adaptive server - successes of the
fixed one) / n_t for client t. The clients are independent; a client's examples are not (they
share bins and noise), so the client is the unit and the interval is over the T differences:
Student's t (`scipy.stats.ttest_1samp(...).confidence_interval`, T - 1 degrees of freedom),
which rests on the mean of T bounded, independent d_t being near normal (T = 1,000 in the
default; at the smoke's 8 clients it is a rough guide). Separate intervals for each server,
compared by overlap, ignore that pairing: the common clients' variation cancels in d_t.

Where every difference is the same d0 (0, say) the t interval has width 0, which would claim
certainty. Then the interval is [d0 - u (1 + d0), d0 + u (1 - d0)], u the Clopper-Pearson upper
bound on the share of clients whose difference is not d0 after 0 of T (theirs lie in [-1, 1]);
[-u, u] for d0 = 0.
"""

from __future__ import annotations

import numpy as np
from scipy import stats as sp_stats


def difference(adaptive, fixed, sizes, confidence: float = 0.95
               ) -> tuple[float, float, float]:
  """(mean difference, low, high) of the per-client rates `adaptive / sizes - fixed / sizes`.

  Args:
    adaptive, fixed: successes per client [T] of the two servers on the same clients.
    sizes: examples per client [T] (or one number).
    confidence: of the interval.

  Raises:
    ValueError: shapes differ, fewer than 2 clients, or counts outside [0, sizes].
  """
  a = np.asarray(adaptive, np.float64)
  f = np.asarray(fixed, np.float64)
  n = np.broadcast_to(np.asarray(sizes, np.float64), a.shape)
  if a.ndim != 1 or a.shape != f.shape:
    raise ValueError(f'adaptive and fixed must be 1-D of one shape (got {a.shape}, {f.shape})')
  if a.size < 2:
    raise ValueError(f'a paired interval needs at least 2 clients (got {a.size})')
  if np.any(n <= 0) or np.any((a < 0) | (a > n)) or np.any((f < 0) | (f > n)):
    raise ValueError('counts must lie in [0, sizes] and sizes be > 0')
  d = (a - f) / n
  mean = float(np.mean(d))
  if np.all(d == d[0]):
    # No spread to estimate: the share of clients whose difference is not d0 is at most u
    # (Clopper-Pearson after 0 of T), and theirs lies in [-1, 1].
    d0 = float(d[0])
    u = float(sp_stats.beta.ppf(1 - (1 - confidence) / 2, 1, d.size))
    return d0, d0 - u * (1 + d0), d0 + u * (1 - d0)
  ci = sp_stats.ttest_1samp(d, 0.0).confidence_interval(confidence)
  return mean, float(max(ci.low, -1.0)), float(min(ci.high, 1.0))


def fields(name: str, adaptive, fixed, sizes) -> dict[str, float]:
  """`{name}_diff`, `{name}_diff_ci_low/high`: `difference` as metric fields."""
  mean, low, high = difference(adaptive, fixed, sizes)
  return {f'{name}_diff': mean, f'{name}_diff_ci_low': low, f'{name}_diff_ci_high': high}
