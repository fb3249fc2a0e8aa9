"""The data's known value grid, and recoveries rounded to it (issue 49).

Digits' pixels take 17 values (k / 16 stored as 8-bit grey levels); CIFAR's 256. A server
that knows this rounds each recovered value to the nearest grid value, for free: a recovery
within half a grid step of the truth everywhere then becomes the truth exactly. "Exact" (max
abs error < 1/255) measured before rounding reports float error the server removes, so the
metrics report exactness after rounding beside it (`metrics.trial_scores`: `exact_grid`).

The grid is learnt from data the server knows (the public split), never from the clients'.
Rounding to the nearest grid value moves a recovered value r to a grid value g with |g - r|
<= |t - r| for every grid value t, so for a true value t on the grid the error after rounding
is at most twice the error before (|g - t| <= |g - r| + |r - t|), and 0 when the error before
is under half the grid's smallest gap. It is not monotone pixel by pixel: with the grid {0, 1},
t = 0 and r = 0.6, rounding moves the error from 0.6 to 1. So `exact_grid` can be lower than
`exact` only where the grid's smallest gap is under 2 / 255 (a recovery within 1/255 of the
truth can then round to a neighbour), and a grid that fine is not learnt (`learn`: None).
"""

from __future__ import annotations

import numpy as np

# A learnt grid has at most this many values (8-bit images: 256): data with more distinct
# values (features, floats) have no grid to round to.
MAX_VALUES = 256
# Values closer than this are one grid value (8-bit / 255 in float32 and float64 differ by
# 1e-8).
_TOLERANCE = 1e-6
# The grid's smallest gap must leave an exact recovery (error < 1/255) on its own grid value.
MIN_GAP = 2.0 / 255.0


def learn(public: np.ndarray) -> np.ndarray | None:
  """The sorted distinct values of the public inputs (float64), merged within 1e-6; None
  when there are more than `MAX_VALUES` or two lie closer than `MIN_GAP` (rounding could then
  turn an exact recovery into its neighbour)."""
  v = np.unique(np.asarray(public, np.float64).ravel())
  if v.size == 0:
    return None
  keep = np.concatenate([[True], np.diff(v) > _TOLERANCE])
  v = v[keep]
  if v.size > MAX_VALUES or (v.size > 1 and float(np.min(np.diff(v))) < MIN_GAP):
    return None
  return v


def round_to(x: np.ndarray, grid: np.ndarray | None) -> np.ndarray:
  """Each value of `x` replaced by the nearest grid value (ties: the lower); `x` unchanged
  (as float64) when `grid` is None."""
  x = np.asarray(x, np.float64)
  if grid is None:
    return x
  g = np.asarray(grid, np.float64)
  hi = np.clip(np.searchsorted(g, x, side='left'), 1, len(g) - 1) if len(g) > 1 else None
  if hi is None:
    return np.full_like(x, g[0])
  lo = hi - 1
  nearer_low = (x - g[lo]) <= (g[hi] - x)
  return np.where(nearer_low, g[lo], g[hi])
