"""Tests of the statistics: exact intervals, empirical epsilon, Hoeffding bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from fl_privacy.eval import stats

GRID = [(0, 1), (1, 1), (0, 10), (3, 10), (10, 10), (1, 100), (50, 100),
        (99, 100), (0, 5000), (2500, 5000), (4999, 5000)]


@pytest.mark.parametrize('k,n', GRID)
@pytest.mark.parametrize('confidence', [0.95, 0.99])
def test_clopper_pearson_matches_beta_quantiles(k, n, confidence):
  alpha = 1 - confidence
  low, high = stats.clopper_pearson(k, n, confidence)
  want_low = 0.0 if k == 0 else sps.beta.ppf(alpha / 2, k, n - k + 1)
  want_high = 1.0 if k == n else sps.beta.ppf(1 - alpha / 2, k + 1, n - k)
  assert low == pytest.approx(want_low, rel=1e-9, abs=1e-12)
  assert high == pytest.approx(want_high, rel=1e-9, abs=1e-12)
  assert low <= k / n <= high


@pytest.mark.parametrize('k,n', [(k, n) for k, n in GRID if 0 < k < n])
def test_clopper_pearson_ends_solve_binomial_tails(k, n):
  low, high = stats.clopper_pearson(k, n)
  assert sps.binom.sf(k - 1, n, low) == pytest.approx(0.025, rel=1e-6)
  assert sps.binom.cdf(k, n, high) == pytest.approx(0.025, rel=1e-6)


@pytest.mark.parametrize('k,n', GRID)
def test_one_sided_bounds_match_beta_quantiles(k, n):
  upper = stats.clopper_pearson_one_sided(k, n, 0.95, side='upper')
  lower = stats.clopper_pearson_one_sided(k, n, 0.95, side='lower')
  assert upper == pytest.approx(
      1.0 if k == n else sps.beta.ppf(0.95, k + 1, n - k), rel=1e-9)
  assert lower == pytest.approx(
      0.0 if k == 0 else sps.beta.ppf(0.05, k, n - k + 1), rel=1e-9, abs=1e-12)


def test_vectorised_interval_matches_scalar():
  k = np.array([k for k, _ in GRID])
  n = np.array([n for _, n in GRID])
  low, high = stats.clopper_pearson_arrays(k, n)
  for i, (ki, ni) in enumerate(GRID):
    assert (low[i], high[i]) == pytest.approx(stats.clopper_pearson(ki, ni))


@pytest.mark.parametrize('p,n', [(0.02, 200), (0.3, 50), (0.5, 1000),
                                 (0.97, 120)])
def test_interval_coverage_by_monte_carlo(p, n):
  rng = np.random.default_rng(1234)
  ks = rng.binomial(n, p, size=2000)
  low, high = stats.clopper_pearson_arrays(ks, np.full_like(ks, n))
  assert np.mean((low <= p) & (p <= high)) >= 0.93
  uppers = [stats.clopper_pearson_one_sided(k, n, 0.95) for k in ks[:500]]
  assert np.mean(np.array(uppers) >= p) >= 0.93


def test_rate_keys_and_edge_counts():
  r = stats.rate('tpr', 3, 10)
  assert set(r) == {'tpr', 'tpr_ci_low', 'tpr_ci_high'}
  assert r['tpr'] == pytest.approx(0.3)
  zero = stats.rate('x', 0, 20)
  assert zero['x'] == 0 and zero['x_ci_low'] == 0 and 0 < zero['x_ci_high'] < 1
  full = stats.rate('x', 20, 20)
  assert full['x_ci_high'] == 1 and 0 < full['x_ci_low'] < 1
  empty = stats.rate('x', 0, 0)
  assert math.isnan(empty['x']) and (empty['x_ci_low'], empty['x_ci_high']) == (
      0, 1)


@pytest.mark.parametrize('k,n', [(-1, 3), (4, 3), (1, -1)])
def test_bad_counts_raise(k, n):
  with pytest.raises(ValueError):
    stats.clopper_pearson(k, n)


def test_empirical_epsilon_is_eq3():
  # The LDP-audit paper's worked example: FP = 0.1, FN = 0.2 gives about 2.
  assert stats.empirical_epsilon(0.1, 0.2) == pytest.approx(math.log(0.8 / 0.1))
  assert stats.empirical_epsilon(0.2, 0.1) == pytest.approx(math.log(0.8 / 0.1))
  rng = np.random.default_rng(0)
  for fp, fn in rng.uniform(0.01, 0.49, size=(20, 2)):
    want = max(math.log((1 - fp) / fn), math.log((1 - fn) / fp))
    assert stats.empirical_epsilon(fp, fn) == pytest.approx(want)


def test_empirical_epsilon_conventions():
  assert stats.empirical_epsilon(0.0, 0.0) == math.inf
  assert stats.empirical_epsilon(0.0, 0.5) == math.inf
  assert stats.empirical_epsilon(1.0, 0.0) == 0.0  # always guesses x'
  assert stats.empirical_epsilon(0.5, 0.5) == 0.0
  assert stats.empirical_epsilon(0.7, 0.6) == 0.0  # worse than chance
  with pytest.raises(ValueError):
    stats.empirical_epsilon(1.2, 0.1)


def test_epsilon_lower_bound_below_estimate_and_finite():
  lb = stats.empirical_epsilon_lower_bound(0, 1000, 0, 1000)
  assert 0 < lb < math.inf
  est = stats.empirical_epsilon(120 / 1000, 130 / 1000)
  assert stats.empirical_epsilon_lower_bound(120, 1000, 130, 1000) < est


def test_epsilon_lower_bound_coverage_by_monte_carlo():
  # Randomised response at epsilon = 1: the optimal test has FP = FN =
  # 1 / (1 + e), so the true Eq. 3 value is exactly 1.
  eps = 1.0
  err = 1 / (1 + math.exp(eps))
  rng = np.random.default_rng(7)
  n = 500
  fps = rng.binomial(n, err, size=2000)
  fns = rng.binomial(n, err, size=2000)
  lbs = np.array([stats.empirical_epsilon_lower_bound(a, n, b, n)
                  for a, b in zip(fps, fns)])
  assert np.mean(lbs <= eps) >= 0.95
  assert np.median(lbs) > 0.5 * eps  # and it is not vacuous


def test_hoeffding_formula():
  r = 2.0 * math.sqrt(-math.log(0.05) / (2 * 100))
  assert stats.hoeffding_lower(0.5, 2.0, 100, 0.05) == pytest.approx(0.5 - r)
  assert stats.hoeffding_upper(0.5, 2.0, 100, 0.05) == pytest.approx(0.5 + r)
  with pytest.raises(ValueError):
    stats.hoeffding_lower(0.5, 1.0, 0, 0.05)
  with pytest.raises(ValueError):
    stats.hoeffding_upper(0.5, 1.0, 10, 1.5)


@pytest.mark.parametrize('delta', [0.05, 0.2])
def test_hoeffding_bounds_hold_by_simulation(delta):
  # Values in [-1, 1] (range 2), skewed so the mean is not the midpoint.
  rng = np.random.default_rng(11)
  n, true_mean = 60, 2 * 0.8 - 1
  means = (2 * rng.binomial(1, 0.8, size=(4000, n)) - 1).mean(axis=1)
  lows = np.array([stats.hoeffding_lower(m, 2.0, n, delta) for m in means])
  highs = np.array([stats.hoeffding_upper(m, 2.0, n, delta) for m in means])
  assert np.mean(lows <= true_mean) >= 1 - delta
  assert np.mean(highs >= true_mean) >= 1 - delta


def test_newcombe_difference_matches_the_published_example():
  # Newcombe (1998), Table II, example (a): 56/70 - 48/80, method 10: (0.0524, 0.3339).
  d, low, high = stats.newcombe_difference(56, 70, 48, 80)
  assert d == pytest.approx(0.2)
  assert (low, high) == pytest.approx((0.0524, 0.3339), abs=1e-4)
  # Swapping the samples mirrors the interval.
  d2, low2, high2 = stats.newcombe_difference(48, 80, 56, 70)
  assert (d2, low2, high2) == pytest.approx((-d, -high, -low))
  # Wilson, by its closed form at k = 0: (0, z^2 / (n + z^2)).
  z = 1.959963984540054
  assert stats.wilson(0, 50) == pytest.approx((0.0, z * z / (50 + z * z)))


def test_newcombe_difference_covers_by_monte_carlo():
  rng = np.random.default_rng(0)
  p1, p2, n1, n2 = 0.03, 0.01, 400, 500
  k1, k2 = rng.binomial(n1, p1, 2000), rng.binomial(n2, p2, 2000)
  hits = [low <= p1 - p2 <= high for low, high in
          (stats.newcombe_difference(a, n1, b, n2)[1:] for a, b in zip(k1, k2))]
  assert 0.93 <= np.mean(hits) <= 0.99
