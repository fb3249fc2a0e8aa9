"""Tests of DP-SGD noise averaging over rounds (Appendix E of the AMI paper)."""

from __future__ import annotations

import math

import jax
import pytest
from scipy import stats as sps

from fl_privacy.attacks.ami import dp_averaging


def test_noise_std_is_the_papers_sigma():
  assert dp_averaging.noise_std(2.0, 1e-5, 3.0) == pytest.approx(
      math.sqrt(2 * math.log(1.25 / 1e-5)) / 2.0 * 3.0)


@pytest.mark.parametrize('rule', dp_averaging.RULES)
def test_error_rates_match_scipy(rule):
  eps, delta, p, k, g = 3.0, 1e-3, 7, 2, 0.8
  s = dp_averaging.noise_std(eps, delta) / math.sqrt(p * k)
  tau = g / 2 if rule == 'known_signal' else s * sps.norm.isf(delta / 2)
  fpr, fnr = dp_averaging.error_rates(p, epsilon=eps, delta=delta, num_neurons=k, signal=g,
                                      rule=rule)
  assert fpr == pytest.approx(2 * sps.norm.sf(tau / s), rel=1e-6)
  assert fnr == pytest.approx(sps.norm.cdf((tau - g) / s) - sps.norm.cdf((-tau - g) / s),
                              rel=1e-6)


@pytest.mark.parametrize('rule', dp_averaging.RULES)
def test_rounds_needed_is_minimal_and_monotone(rule):
  kw = dict(delta=1e-3, rule=rule)
  prev = math.inf
  for eps in (1.0, 2.0, 5.0, 8.0):
    p = dp_averaging.rounds_needed(epsilon=eps, **kw)
    ok = lambda q: max(dp_averaging.error_rates(q, epsilon=eps, **kw)) <= 1e-3
    assert ok(p) and (p == 1 or not ok(p - 1))
    assert p <= prev
    prev = p
  one = dp_averaging.rounds_needed(epsilon=2.0, **kw)
  eight = dp_averaging.rounds_needed(epsilon=2.0, num_neurons=8, **kw)
  assert math.ceil(one / 8) - 1 <= eight <= math.ceil(one / 8) + 1


def test_monte_carlo_matches_closed_form_error_rates():
  kw = dict(epsilon=2.0, delta=1e-2, num_neurons=2, signal=1.0)
  n = 20_000
  errors = dp_averaging.monte_carlo_errors(jax.random.key(0), 6, num_trials=n, **kw)
  assert errors['fp'].shape == (6,)
  for p in (1, 3, 6):
    fpr, fnr = dp_averaging.error_rates(p, **kw)
    for count, rate in ((errors['fp'][p - 1], fpr), (errors['fn'][p - 1], fnr)):
      lo, hi = sps.binom.interval(0.999, n, rate)
      assert lo <= count <= hi, (p, count, rate * n)
  closed = dp_averaging.rounds_needed(**kw)
  big = dp_averaging.monte_carlo_errors(jax.random.key(1), closed + 3, num_trials=n, **kw)
  mc = dp_averaging.rounds_needed_monte_carlo(big, 1e-2)
  assert abs(mc - closed) <= max(2, closed // 5)
