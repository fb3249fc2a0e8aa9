"""Issue 49's scores: exactness after rounding to the data's value grid, and the paired
adaptive - fixed interval over clients."""

from __future__ import annotations

import numpy as np
import pytest

from fl_privacy.attacks.reconstruction import metrics
from fl_privacy.attacks.reconstruction import paired
from fl_privacy.attacks.reconstruction import value_grid


def test_the_value_grid_is_learnt_from_the_data_and_rounding_keeps_exact_recoveries():
  levels = np.arange(17) / 16.0
  public = np.random.default_rng(0).choice(levels, size=(50, 64)).astype(np.float32)
  grid = value_grid.learn(public)
  np.testing.assert_allclose(grid, levels, atol=1e-7)
  rng = np.random.default_rng(1)
  true = rng.choice(levels, size=(200, 64))
  for scale in (0.5 / 255, 0.02, 0.05, 0.2):
    r = true + rng.uniform(-scale, scale, size=true.shape)
    before = np.abs(r - true).max(axis=1)
    after = np.abs(value_grid.round_to(r, grid) - true).max(axis=1)
    # An exact recovery stays exact; within half the smallest gap it becomes the truth.
    assert np.all(after[before < 1 / 255] == 0)
    assert np.all(after[before < 1 / 32] == 0)
    # Rounding at most doubles the error of an on-grid truth.
    assert np.all(after <= 2 * before + 1e-12)
  # ... but it is not monotone: t = 0, r = 0.6 on the grid {0, 1} moves the error to 1.
  assert value_grid.round_to(np.array([0.6]), np.array([0.0, 1.0]))[0] == 1.0
  # A grid finer than 2 / 255 (or with more than 256 values) is not learnt.
  assert value_grid.learn(np.linspace(0, 1, 300)) is None
  assert value_grid.learn(np.array([0.0, 1 / 255, 1.0])) is None
  np.testing.assert_array_equal(value_grid.round_to(np.array([0.3]), None), [0.3])


def test_exact_grid_counts_recoveries_within_half_a_level():
  levels = np.arange(17) / 16.0
  true = np.random.default_rng(2).choice(levels, size=(4, 8, 8, 1))
  rec = true.reshape(4, -1) + 0.02        # 5 grey levels off: not exact, exact on the grid
  s = metrics.trial_scores(rec, np.ones(4, bool), true, grid=levels)
  assert s['exact'] == 0 and s['exact_grid'] == 4 and s['psnr_grid_mean'] == metrics.PSNR_CAP
  s = metrics.trial_scores(rec + 0.02, np.ones(4, bool), true, grid=levels)
  assert s['exact_grid'] == 0             # 0.04 > half a level (1/32): the next level


def test_the_paired_interval():
  rng = np.random.default_rng(0)
  n = 8
  fixed = rng.integers(0, n + 1, 500)
  # The same clients: adaptive gains 2 examples on each client below n - 1.
  adaptive = np.minimum(fixed + 2, n)
  mean, low, high = paired.difference(adaptive, fixed, n)
  assert low <= mean <= high and low > 0
  assert mean == pytest.approx(np.mean((adaptive - fixed) / n))
  # Antisymmetric.
  m2, l2, h2 = paired.difference(fixed, adaptive, n)
  assert (m2, l2, h2) == pytest.approx((-mean, -high, -low))
  # Pairing: a common per-client shift with a large spread between clients is resolved by the
  # paired interval though the two servers' own rates differ by less than their spread.
  assert high - low < 0.05
  # Every difference 0: not a zero-width interval; it narrows with more clients.
  z = rng.integers(0, n + 1, 10)
  m, lo10, hi10 = paired.difference(z, z, n)
  assert m == 0 and lo10 < 0 < hi10
  z = rng.integers(0, n + 1, 1000)
  _, lo1000, hi1000 = paired.difference(z, z, n)
  assert lo10 < lo1000 < 0 < hi1000 < hi10
  # Every client gains all n: the bound stays inside [-1, 1] and contains 1.
  m, lo, hi = paired.difference(np.full(20, n), np.zeros(20), n)
  assert m == 1 and lo < 1 and hi == 1
  with pytest.raises(ValueError):
    paired.difference([1], [0], n)
  with pytest.raises(ValueError):
    paired.difference([9, 1], [0, 0], n)
  f = paired.fields('exact', adaptive, fixed, n)
  assert set(f) == {'exact_diff', 'exact_diff_ci_low', 'exact_diff_ci_high'}


def test_the_value_grid_at_its_edges():
  # Integer-valued data: 256 values with gaps of 1 make a grid, 257 do not.
  assert len(value_grid.learn(np.arange(256.0))) == 256
  assert value_grid.learn(np.arange(257.0)) is None
  # Values within float rounding of each other are one grid value.
  np.testing.assert_array_equal(value_grid.learn(np.array([0.5, 0.5 + 1e-8, 1.0])), [0.5, 1.0])
  # The smallest gap: 2/255 exactly is allowed, a little less is not.
  assert value_grid.learn(np.array([0.0, 2 / 255])) is not None
  assert value_grid.learn(np.array([0.0, 2 / 255.5])) is None
  assert value_grid.learn(np.array([0.0, 2.5 / 255])) is not None
  assert value_grid.learn(np.array([0.0, 1 / 255])) is None
  # No data: no grid; constant data: a grid of one value, to which everything rounds.
  assert value_grid.learn(np.zeros(0)) is None
  np.testing.assert_array_equal(value_grid.learn(np.full(5, 0.3)), [0.3])
  np.testing.assert_array_equal(value_grid.round_to(np.array([-1.0, 0.9]), np.array([0.3])),
                                [0.3, 0.3])
  levels = np.arange(17) / 16.0
  # Below and above the grid: its ends; a tie: the lower value.
  np.testing.assert_array_equal(value_grid.round_to(np.array([-0.3, 1.4]), levels), [0.0, 1.0])
  np.testing.assert_array_equal(value_grid.round_to(np.array([0.5]), np.array([0.0, 1.0])),
                                [0.0])
  np.testing.assert_array_equal(value_grid.round_to(np.array([1 / 32 + 1e-9, 0.99]), levels),
                                [1 / 16, 1.0])


def test_the_paired_interval_by_hand():
  from scipy import stats as sp_stats  # pylint: disable=g-import-not-at-top
  # Spread: Student's t over the clients' differences, by hand.
  a, f = np.array([3, 5, 2, 8, 6, 4]), np.array([1, 5, 0, 4, 6, 1])
  d = (a - f) / 8
  half = sp_stats.t.ppf(0.975, 5) * d.std(ddof=1) / np.sqrt(6)
  assert paired.difference(a, f, 8) == pytest.approx((d.mean(), d.mean() - half,
                                                      d.mean() + half))
  # ... and a 90% interval is narrower than the 95% one.
  _, lo90, hi90 = paired.difference(a, f, 8, confidence=0.9)
  assert d.mean() - half < lo90 < hi90 < d.mean() + half
  # Clipped to [-1, 1]: three clients of one example each, +1, -1, +1.
  assert paired.difference([1, 0, 1], [0, 1, 0], 1) == pytest.approx((1 / 3, -1.0, 1.0))
  # No spread: Clopper-Pearson's upper bound after 0 of T, u = 1 - 0.025^(1 / T).
  u = 1 - 0.025 ** (1 / 10)
  assert paired.difference(np.full(10, 3), np.full(10, 3), 8) == pytest.approx((0, -u, u))
  assert paired.difference(np.full(10, 6), np.full(10, 2), 8) == pytest.approx(
      (0.5, 0.5 - 1.5 * u, 0.5 + 0.5 * u))
  # Two clients are enough; sizes of one example are valid; per-client sizes broadcast.
  assert paired.difference([1, 0], [0, 0], 1)[0] == 0.5
  assert paired.difference([2, 1], [0, 1], [4, 2])[0] == pytest.approx(0.25)
  for bad in (dict(adaptive=[[1, 0]], fixed=[[0, 0]], sizes=1),     # 2-D
              dict(adaptive=[1, 0, 1], fixed=[0, 0], sizes=1),      # shapes differ
              dict(adaptive=[0, 0], fixed=[0, 0], sizes=0),         # no examples
              dict(adaptive=[0, 0], fixed=[-1, 0], sizes=2),        # negative count
              dict(adaptive=[-1, 0], fixed=[0, 0], sizes=2),
              dict(adaptive=[0, 0], fixed=[3, 0], sizes=2)):        # more than the client has
    with pytest.raises(ValueError):
      paired.difference(**bad)
