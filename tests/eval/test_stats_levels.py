"""Confidence levels are split where several bounds must hold at once.

A lower bound on epsilon needs upper bounds on FP and FN that hold together; each at the full
level would hold together only at 1 - 2 (1 - level). The exact beta quantiles pin the split.
"""

from __future__ import annotations

import math

import pytest
from scipy import stats as scipy_stats

from fl_privacy.eval import stats


@pytest.mark.parametrize('confidence', [0.95, 0.9, 0.99])
def test_epsilon_lower_bound_splits_the_level_between_fp_and_fn(confidence):
  fp, n_neg, fn, n_pos = 30, 5000, 12, 5000
  each = 1 - (1 - confidence) / 2
  fp_high = scipy_stats.beta.ppf(each, fp + 1, n_neg - fp)
  fn_high = scipy_stats.beta.ppf(each, fn + 1, n_pos - fn)
  want = max(math.log((1 - fp_high) / fn_high), math.log((1 - fn_high) / fp_high))
  got = stats.empirical_epsilon_lower_bound(fp, n_neg, fn, n_pos, confidence)
  assert got == pytest.approx(want, rel=1e-9)
  # Unsplit (each bound at `confidence`) is looser in the wrong direction: strictly larger.
  fp_un = scipy_stats.beta.ppf(confidence, fp + 1, n_neg - fp)
  fn_un = scipy_stats.beta.ppf(confidence, fn + 1, n_pos - fn)
  unsplit = max(math.log((1 - fp_un) / fn_un), math.log((1 - fn_un) / fp_un))
  assert got < unsplit - 1e-3


def test_epsilon_lower_bound_uses_the_right_count_for_each_rate():
  # Swapping n_neg and n_pos (or fp and fn) changes the bound when the sizes differ.
  a = stats.empirical_epsilon_lower_bound(10, 2000, 40, 8000)
  b = stats.empirical_epsilon_lower_bound(10, 8000, 40, 2000)
  each = 0.975
  fp_high = scipy_stats.beta.ppf(each, 11, 1990)
  fn_high = scipy_stats.beta.ppf(each, 41, 7960)
  want = max(math.log((1 - fp_high) / fn_high), math.log((1 - fn_high) / fp_high))
  assert a == pytest.approx(want, rel=1e-9)
  assert abs(a - b) > 1e-3


# Edges and messages: the cases that only show when a boundary or a default moves.


@pytest.mark.parametrize('confidence', [0.0, 1.0, 1.5, -0.1])
def test_confidence_outside_the_open_unit_interval_is_refused(confidence):
  with pytest.raises(ValueError, match=r'confidence must be in \(0, 1\)'):
    stats.clopper_pearson(3, 10, confidence)


def test_counts_are_checked_with_their_values_in_the_message():
  with pytest.raises(ValueError, match=r'need 0 <= k <= n \(got k=1, n=0\)'):
    stats.clopper_pearson(1, 0)
  with pytest.raises(ValueError, match=r'got k=-1, n=5'):
    stats.clopper_pearson(-1, 5)
  assert stats.clopper_pearson(0, 0) == (0.0, 1.0)


def test_one_sided_defaults_and_empty_samples():
  assert stats.clopper_pearson_one_sided(3, 50) == pytest.approx(
      scipy_stats.beta.ppf(0.95, 4, 47), rel=1e-9)
  assert stats.clopper_pearson_one_sided(0, 0, side='upper') == 1.0
  assert stats.clopper_pearson_one_sided(0, 0, side='lower') == 0.0
  with pytest.raises(ValueError, match="side must be 'upper' or 'lower' \\(got 'up'\\)"):
    stats.clopper_pearson_one_sided(1, 5, side='up')


def test_rate_passes_its_confidence_on():
  out = stats.rate('x', 7, 40, confidence=0.8)
  assert (out['x_ci_low'], out['x_ci_high']) == stats.clopper_pearson(7, 40, 0.8)
  assert out['x_ci_high'] - out['x_ci_low'] < (lambda lo_hi: lo_hi[1] - lo_hi[0])(
      stats.clopper_pearson(7, 40, 0.95))


def test_empirical_epsilon_names_the_bad_rate():
  with pytest.raises(ValueError, match=r'fp must be in \[0, 1\] \(got 1.5\)'):
    stats.empirical_epsilon(1.5, 0.1)
  with pytest.raises(ValueError, match=r'fn must be in \[0, 1\] \(got -0.1\)'):
    stats.empirical_epsilon(0.1, -0.1)


def test_hoeffding_edges():
  assert stats.hoeffding_lower(0.3, 0.0, 1, 0.5) == 0.3  # a constant: no radius, n = 1 ok
  assert stats.hoeffding_upper(0.3, 0.5, 1, 0.5) == pytest.approx(
      0.3 + 0.5 * math.sqrt(math.log(2.0) / 2.0))
  for delta in (0.0, 1.0, 1.5):
    with pytest.raises(ValueError, match=r'delta must be in \(0, 1\)'):
      stats.hoeffding_lower(0.0, 1.0, 10, delta)
  with pytest.raises(ValueError, match=r'n must be >= 1 \(got 0\)'):
    stats.hoeffding_lower(0.0, 1.0, 0, 0.1)
  with pytest.raises(ValueError, match=r'value_range must be >= 0 \(got -0.1\)'):
    stats.hoeffding_lower(0.0, -0.1, 10, 0.1)
