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
