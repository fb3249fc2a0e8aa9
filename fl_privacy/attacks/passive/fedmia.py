"""FedMIA's per-round test against the non-target clients (Zhu et al., CVPR 2025, Eqs. 8-12).

Equation numbers as we read arXiv:2402.06289; not re-checked against the paper's text in
this revision (unverified).

For a query (x, y), a target client and a round t, the other clients' measurements
M(I_j^t | x, y), j != target (the "shadows"), estimate the distribution of the measurement of a
client that did not train on (x, y): N(mu_t, sigma_t^2) after removing shadows that look like
they did (Eq. 8), and the round's score is Phi((M(I_target^t | x, y) - mu_t) / sigma_t)
(Eq. 11, the one-tailed likelihood of Eq. 4 under that Gaussian); Eq. 12 averages it over
rounds. Any measurement plugs in (Remark 3): FedMIA-I uses -loss, FedMIA-II the gradient cosine.

Outlier filters (`FILTERS`), applied to each (query, round) column of shadows:
- `paper` (Eqs. 8-9; the default of `scores`: `fedmia_ii` without a suffix): remove j when
  M_j > mu + 3 sigma with mu, sigma the mean and population
  standard deviation of all K - 1 shadows including j. With m shadows the largest possible
  z-score is (m - 1) / sqrt(m - 1) = sqrt(m - 1) (one value against m - 1 equal ones), so with
  m <= 10 shadows (K <= 11 clients) it can never exceed 3 and the filter never fires.
- `leave_one_out` (ours, `fedmia_ii@leave_one_out`): remove j when M_j > mu_{-j} +
  3 sigma_{-j}, the mean and
  population standard deviation of the other m - 1 shadows. This is the test the paper's
  argument needs (is client j's value extreme among the clients that did not train on the
  query?) and a shadow that owns the query can fail it at any K.
- `none`: keep every shadow.
If a filter would remove every shadow of a column, the column keeps them all.

sigma_t^2 is the population variance of the kept shadows plus 1e-8, as the authors' code has it
(`mia_attack_auto.py`), so that equal shadows do not divide by zero.
"""

from __future__ import annotations

import numpy as np
from scipy import special

FILTERS = ('paper', 'leave_one_out', 'none')
SIGMAS = 3.0
VARIANCE_FLOOR = 1e-8


def outlier_mask(shadows: np.ndarray, method: str) -> np.ndarray:
  """Which shadow values to remove (True = outlier), column by column.

  Eq. (8)-(9) of the FedMIA paper (`paper`) or its leave-one-out correction (module docstring).

  Args:
    shadows: [m, n] measurements of the m non-target clients for n (query) columns; higher
      means "more member-like" (the filter is one-tailed, as Eq. 8).
    method: one of `FILTERS`.

  Returns:
    bool [m, n], True where the value is removed.
  """
  s = np.asarray(shadows, np.float64)
  m = s.shape[0]
  if method == 'none' or m < 2:
    if method not in FILTERS:
      raise ValueError(f'outlier filter must be one of {FILTERS} (got {method!r})')
    return np.zeros(s.shape, bool)
  if method == 'paper':
    mu = s.mean(axis=0)
    sd = s.std(axis=0)
    out = s > mu + SIGMAS * sd
  elif method == 'leave_one_out':
    if m < 3:
      # One other value has no spread to test against.
      return np.zeros(s.shape, bool)
    out = _leave_one_out(s)
  else:
    raise ValueError(f'outlier filter must be one of {FILTERS} (got {method!r})')
  # A column may not lose every shadow: keep them all there.
  everything = out.all(axis=0)
  out[:, everything] = False
  return out


def _leave_one_out_direct(s: np.ndarray) -> np.ndarray:
  """s_j > mu_{-j} + 3 sigma_{-j}, each column's m x m deviations summed: O(m^2 n), the
  reference `_leave_one_out` falls back on where its shortcut cannot decide."""
  m = s.shape[0]
  with np.errstate(over='ignore', invalid='ignore'):
    mu = (s.sum(axis=0)[None, :] - s) / (m - 1)
    # Centred sums of squares of the others: sum_i (s_i - mu_{-j})^2 over i != j.
    sq = ((s[None, :, :] - mu[:, None, :]) ** 2).sum(axis=1) - (s - mu) ** 2
    return s > mu + SIGMAS * np.sqrt(np.maximum(sq, 0.0) / (m - 1))


# Columns whose shortcut margin is within this fraction of the column's spread are decided by
# `_leave_one_out_direct`: the shortcut's sum of squares loses about m^2 * 1e-16 of the
# spread's square, hence about 1e-7 of the spread on sigma; float32 measurements put exact
# ties (x_j - mu_{-j} = 3 sigma_{-j}) on real columns (one in 1.5e9 entries of a default run).
_NEAR = 1e-5


def _leave_one_out(s: np.ndarray) -> np.ndarray:
  """The leave-one-out test of every shadow in O(m n), with the same decisions as
  `_leave_one_out_direct`: columns centred on their mean, then
  sum_{i != j} (c_i - mu_{-j})^2 = sum_i c_i^2 - c_j^2 - (m - 1) mu_{-j}^2.
  Scoring spent most of its time in the direct form (the FedMIA default: 20 targets x 12
  rounds x 2 filtered attacks per replicate)."""
  m = s.shape[0]
  with np.errstate(over='ignore', invalid='ignore'):  # squares past 1e154: decided directly
    c = s - s.mean(axis=0)
    mu = (c.sum(axis=0)[None, :] - c) / (m - 1)
    sq = (c * c).sum(axis=0)[None, :] - c * c - (m - 1) * mu * mu
    gap = c - mu - SIGMAS * np.sqrt(np.maximum(sq, 0.0) / (m - 1))
    out = gap > 0
    decided = np.abs(gap) > _NEAR * np.abs(c).max(axis=0)  # False where gap is nan
  near = np.flatnonzero(~decided.all(axis=0))
  if near.size:
    out[:, near] = _leave_one_out_direct(s[:, near])
  return out


def mean_over_rounds(round_scores: np.ndarray, upto: int | None = None) -> np.ndarray:
  """Final scores: the mean of the per-round scores [R, N] over rounds 0 .. upto - 1.

  Eq. (12) of the FedMIA paper (Zhu et al., CVPR 2025) averages its per-round scores this way;
  the series attacks, LiRA and RMIA combine their rounds the same way here.
  """
  round_scores = np.asarray(round_scores, np.float64)
  upto = round_scores.shape[0] if upto is None else upto
  return round_scores[:upto].mean(axis=0)


def round_scores(values: np.ndarray, target: int, method: str) -> tuple[np.ndarray, np.ndarray]:
  """One round of FedMIA for every column: Phi((M_target - mu_t) / sigma_t).

  Eqs. (8), (9) and (11) of the FedMIA paper (Algorithm 1, lines 6-10), with `method` the
  outlier filter (`FILTERS`).

  Args:
    values: [K, n] the K clients' measurements of n columns in one round (higher = member).
    target: the row of the target client.
    method: outlier filter.

  Returns:
    (scores [n] in [0, 1], removed [K - 1, n] bool: which shadows the filter removed, rows in
    client order without the target).
  """
  v = np.asarray(values, np.float64)
  shadows = np.delete(v, target, axis=0)
  removed = outlier_mask(shadows, method)
  keep = ~removed
  count = keep.sum(axis=0)
  mu = np.where(keep, shadows, 0.0).sum(axis=0) / count
  var = np.where(keep, (shadows - mu) ** 2, 0.0).sum(axis=0) / count + VARIANCE_FLOOR
  return special.ndtr((v[target] - mu) / np.sqrt(var)), removed
