"""Confidence intervals and bounds for rates, empirical epsilon and means.

Every rate in fl-privacy is reported with its trial count and an exact
(Clopper-Pearson) interval; every empirical epsilon with a one-sided lower bound.
Functions take counts (not rates) wherever an interval depends on the sample size.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special


def _check_counts(k, n) -> tuple[int, int]:
  k, n = int(k), int(n)
  if n < 0 or not 0 <= k <= max(n, 0):
    raise ValueError(f'need 0 <= k <= n (got k={k}, n={n})')
  return k, n


def _check_confidence(confidence: float) -> float:
  confidence = float(confidence)
  if not 0.0 < confidence < 1.0:
    raise ValueError(f'confidence must be in (0, 1) (got {confidence})')
  return confidence


def _lower_quantile(k: int, n: int, tail: float) -> float:
  """The p with P[Binomial(n, p) >= k] = tail (0 for k = 0)."""
  if k == 0:
    return 0.0
  return float(special.betaincinv(k, n - k + 1, tail))


def _upper_quantile(k: int, n: int, tail: float) -> float:
  """The p with P[Binomial(n, p) <= k] = tail (1 for k = n)."""
  if k == n:
    return 1.0
  return float(special.betaincinv(k + 1, n - k, 1.0 - tail))


def clopper_pearson(k: int, n: int,
                    confidence: float = 0.95) -> tuple[float, float]:
  """Two-sided exact binomial interval for a rate (Clopper & Pearson, 1934).

  Each tail holds at most `(1 - confidence) / 2`: the lower end is the
  `alpha/2` quantile of Beta(k, n - k + 1) (0 when k = 0), the upper end the
  `1 - alpha/2` quantile of Beta(k + 1, n - k) (1 when k = n). Coverage is at
  least `confidence` for every true rate.

  Args:
    k: number of successes.
    n: number of trials; n = 0 gives the uninformative interval (0, 1).
    confidence: two-sided confidence level.

  Returns:
    `(low, high)` as floats.
  """
  k, n = _check_counts(k, n)
  alpha = 1.0 - _check_confidence(confidence)
  if n == 0:
    return 0.0, 1.0
  return _lower_quantile(k, n, alpha / 2), _upper_quantile(k, n, alpha / 2)


def clopper_pearson_one_sided(k: int, n: int, confidence: float = 0.95,
                              side: str = 'upper') -> float:
  """One-sided exact binomial bound: the whole `1 - confidence` in one tail.

  Args:
    k: number of successes.
    n: number of trials (n = 0 gives the trivial bound 1 or 0).
    confidence: one-sided confidence level.
    side: `'upper'` (true rate <= bound with probability >= confidence) or
      `'lower'` (true rate >= bound).

  Returns:
    The bound as a float.
  """
  k, n = _check_counts(k, n)
  alpha = 1.0 - _check_confidence(confidence)
  if side not in ('upper', 'lower'):
    raise ValueError(f"side must be 'upper' or 'lower' (got {side!r})")
  if n == 0:
    return 1.0 if side == 'upper' else 0.0
  if side == 'upper':
    return _upper_quantile(k, n, alpha)
  return _lower_quantile(k, n, alpha)


def rate(name: str, k: int, n: int,
         confidence: float = 0.95) -> dict[str, float]:
  """A rate `k / n` as the three flat metrics `name`, `name_ci_low`, `name_ci_high`.

  The interval is `clopper_pearson(k, n, confidence)`. With n = 0 the rate is NaN
  and the interval (0, 1). Store the trial count beside it (`n_trials` of the
  results point, or an explicit count metric when rates have different counts).
  """
  low, high = clopper_pearson(k, n, confidence)
  value = k / n if n else math.nan
  return {name: float(value), f'{name}_ci_low': low, f'{name}_ci_high': high}


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
  """Two-sided Wilson score interval for a rate k / n (Wilson, 1927); (0, 1) for n = 0."""
  k, n = _check_counts(k, n)
  z = float(special.ndtri(0.5 + _check_confidence(confidence) / 2))
  if n == 0:
    return 0.0, 1.0
  p = k / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_difference(k1: int, n1: int, k2: int, n2: int,
                        confidence: float = 0.95) -> tuple[float, float, float]:
  """Difference p1 - p2 of two rates with Newcombe's hybrid score interval.

  Method 10 of Newcombe (1998), "Interval estimation for the difference between independent
  proportions: comparison of eleven methods", Stat. Med. 17:873-890: with Wilson intervals
  (l_i, u_i) of each rate, low = d - sqrt((p1 - l1)^2 + (u2 - p2)^2) and high = d +
  sqrt((u1 - p1)^2 + (p2 - l2)^2). It assumes independent samples; for rates on the same
  trials that are positively correlated it is conservative (wider than needed).

  Returns:
    (p1 - p2, low, high); NaN difference with (-1, 1) when a count of trials is 0.
  """
  l1, u1 = wilson(k1, n1, confidence)
  l2, u2 = wilson(k2, n2, confidence)
  if n1 == 0 or n2 == 0:
    return math.nan, -1.0, 1.0
  p1, p2 = k1 / n1, k2 / n2
  d = p1 - p2
  return (d, d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2),
          d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2))


def _epsilon_term(numerator: float, denominator: float) -> float:
  # log(0 / x) is no evidence (-inf, also for 0 / 0); log(x / 0), x > 0, is a
  # perfect distinguisher (+inf).
  if numerator <= 0.0:
    return -math.inf
  if denominator <= 0.0:
    return math.inf
  return math.log(numerator / denominator)


def empirical_epsilon(fp: float, fn: float) -> float:
  """Empirical epsilon from a distinguisher's error rates (Eq. 3 of the LDP-audit paper).

  `max(log((1 - FP) / FN), log((1 - FN) / FP))`, from the two epsilon-LDP
  inequalities of its Eq. 2. FP is the rate of guessing x' when the input was x,
  FN the rate of guessing x when it was x'.

  Conventions: a term with numerator 0 gives no evidence (-inf, also 0/0); a
  positive numerator over 0 gives +inf (a perfect distinguisher, which no finite
  epsilon allows). The result is clipped at 0, since epsilon >= 0 by definition
  and a worse-than-chance distinguisher (FP + FN > 1) certifies nothing.

  Args:
    fp: false-positive rate in [0, 1].
    fn: false-negative rate in [0, 1].

  Returns:
    The point estimate (a float, possibly inf).
  """
  fp, fn = float(fp), float(fn)
  for name, v in (('fp', fp), ('fn', fn)):
    if not 0.0 <= v <= 1.0:
      raise ValueError(f'{name} must be in [0, 1] (got {v})')
  return max(0.0, _epsilon_term(1.0 - fp, fn), _epsilon_term(1.0 - fn, fp))


def empirical_epsilon_lower_bound(fp_count: int, n_neg: int, fn_count: int,
                                  n_pos: int,
                                  confidence: float = 0.95) -> float:
  """One-sided lower confidence bound on the epsilon of Eq. 3 of the LDP-audit paper.

  Eq. 3 decreases in both FP and FN, so plugging upper bounds on the true FP and
  FN rates gives a lower bound on the true epsilon. Confidence accounting
  (Bonferroni): each rate gets a one-sided Clopper-Pearson upper bound at level
  `1 - (1 - confidence) / 2`; both hold together with probability at least
  `confidence`, and then the returned value is <= the epsilon the mechanism's
  true FP and FN rates imply (which is itself <= the mechanism's epsilon).

  Args:
    fp_count: trials with input x on which the distinguisher guessed x'.
    n_neg: trials with input x.
    fn_count: trials with input x' on which the distinguisher guessed x.
    n_pos: trials with input x'.
    confidence: overall one-sided confidence level.

  Returns:
    The lower bound (a float >= 0; finite whenever both counts n > 0).
  """
  each = 1.0 - (1.0 - _check_confidence(confidence)) / 2.0
  fp_high = clopper_pearson_one_sided(fp_count, n_neg, each, side='upper')
  fn_high = clopper_pearson_one_sided(fn_count, n_pos, each, side='upper')
  return empirical_epsilon(fp_high, fn_high)


def _hoeffding_radius(value_range: float, n: int, delta: float) -> float:
  if not 0.0 < delta < 1.0:
    raise ValueError(f'delta must be in (0, 1) (got {delta})')
  if n < 1:
    raise ValueError(f'n must be >= 1 (got {n})')
  if value_range < 0:
    raise ValueError(f'value_range must be >= 0 (got {value_range})')
  return float(value_range) * math.sqrt(-math.log(delta) / (2.0 * n))


def hoeffding_lower(mean: float, value_range: float, n: int,
                    delta: float) -> float:
  """(1 - delta)-confidence lower bound on an expectation (Eq. 9 of the AMI paper).

  `mean - Range * sqrt(-ln(delta) / (2 n))`, Hoeffding's inequality for the mean
  of n i.i.d. draws of a variable whose values span an interval of length
  `value_range`.
  """
  return float(mean) - _hoeffding_radius(value_range, n, delta)


def hoeffding_upper(mean: float, value_range: float, n: int,
                    delta: float) -> float:
  """(1 - delta)-confidence upper bound on an expectation (Eq. 10 of the AMI paper).

  `mean + Range * sqrt(-ln(delta) / (2 n))`.
  """
  return float(mean) + _hoeffding_radius(value_range, n, delta)


def clopper_pearson_arrays(k, n, confidence: float = 0.95):
  """Vectorised `clopper_pearson` over numpy arrays of counts: `(low, high)`."""
  k = np.asarray(k, dtype=np.float64)
  n = np.asarray(n, dtype=np.float64)
  alpha = 1.0 - _check_confidence(confidence)
  with np.errstate(invalid='ignore', divide='ignore'):
    low = np.where(k > 0, special.betaincinv(np.maximum(k, 1), n - k + 1,
                                             alpha / 2), 0.0)
    high = np.where(k < n, special.betaincinv(k + 1, np.maximum(n - k, 1),
                                              1 - alpha / 2), 1.0)
  return low, high
