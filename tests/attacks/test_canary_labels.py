"""Every training-audit bound labelled by what it assumes, and a verdict that uses the same
tests as "reachable" (`attacks.audit.canary_statistics`: `ASSUMES`, `labelled_bounds`,
`verdict_labels`)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from fl_privacy.attacks.audit import canary_statistics as cs
from fl_privacy.eval import auditing

DELTA = 1e-5
GAUSSIAN = ('epsilon_one_run_fdp', 'epsilon_gdp', 'epsilon_gdp_midpoint')
FREE = ('epsilon_one_run', 'epsilon_cp', 'profile')


def _gdp_profile(mu: float):
  def curve(eps):
    eps = np.asarray(eps, np.float64)
    return sps.norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * sps.norm.cdf(-eps / mu - mu / 2)
  return curve


def test_every_bound_has_its_assumption_and_gdp_and_fdp_are_never_assumption_free():
  # The MLE / PLD bound of a Poisson row (`poisson_mle`) is counted beside the scores' tests.
  assert set(cs.BOUNDS) | {'profile', 'epsilon_mle_pld'} == set(cs.ASSUMES)
  assert cs.assumes('epsilon_mle_pld') == 'poisson_subsampled_gaussian'
  assert all(cs.assumes(k) == 'gaussian' for k in GAUSSIAN)
  assert all(cs.assumes(k) == 'none' for k in FREE)
  with pytest.raises(ValueError, match='no assumption recorded'):
    cs.assumes('epsilon_fit')


def test_labelled_bounds_split_the_counted_bounds_by_assumption():
  found = dict(epsilon_one_run=0.5, epsilon_one_run_fdp=3.0, epsilon_cp=1.5, epsilon_gdp=4.0,
               epsilon_gdp_midpoint=6.0)
  got = cs.labelled_bounds(found, ('epsilon_one_run', 'epsilon_one_run_fdp', 'epsilon_cp',
                                   'epsilon_gdp', 'epsilon_gdp_midpoint'))
  assert (got['certified_free'], got['certified_free_test']) == (1.5, 'epsilon_cp')
  assert (got['certified_gaussian'], got['certified_gaussian_test']) == (
      6.0, 'epsilon_gdp_midpoint')
  assert got['best_bound_test'] == 'epsilon_gdp_midpoint'
  assert got['best_bound_assumes'] == 'gaussian' and got['certified_free_assumes'] == 'none'
  # A bound that is not counted is not taken, whatever its value; NaN is skipped.
  got = cs.labelled_bounds({**found, 'epsilon_cp': np.nan}, ('epsilon_one_run', 'epsilon_cp'))
  assert (got['certified_free'], got['certified_free_test']) == (0.5, 'epsilon_one_run')
  assert (got['certified_gaussian'], got['certified_gaussian_test'],
          got['certified_gaussian_assumes']) == (0.0, 'none', 'none')
  assert got['best_bound_assumes'] == 'none'
  # An infinite bound is skipped as `best_bound` skips it (no finite evidence).
  inf = cs.labelled_bounds({**found, 'epsilon_cp': np.inf}, ('epsilon_one_run', 'epsilon_cp'))
  assert (inf['certified_free'], inf['certified_free_test']) == (0.5, 'epsilon_one_run')
  zero = cs.labelled_bounds(dict(found, epsilon_one_run=0.0), ('epsilon_one_run',))
  assert (zero['certified_free_test'], zero['best_bound_assumes']) == ('none', 'none')


@pytest.mark.parametrize('mechanism,independent', [('update_dp', True), ('update_dp', False),
                                                   ('dp_sgd_poisson', True)])
def test_an_audits_headline_bound_assumes_nothing(mechanism, independent):
  rng = np.random.default_rng(3)
  world = np.arange(600) % 2 == 0
  s = rng.normal(size=600) + np.where(world, 1.5, -1.5)
  m = cs.audit(s, world, mechanism, 50.0, delta=DELTA, confidence=0.95,
               independent=independent, midpoint=0.0 if independent else None, reach=False)
  counted = cs.counted_bounds(mechanism, independent, independent)
  free = [m[k] for k in counted if cs.assumes(k) == 'none']
  assert m['certified_free'] == max(free)
  assert cs.assumes(m['certified_free_test']) == 'none'
  assert m['certified_free'] <= m['best_bound']
  if m['best_bound_test'] in GAUSSIAN:
    assert m['best_bound_assumes'] == 'gaussian'
  if mechanism == 'update_dp' and independent:
    # Well-separated Gaussian scores: the GDP midpoint test is the best, and it is labelled.
    assert m['best_bound_test'] == 'epsilon_gdp_midpoint'
    assert m['best_bound'] > m['certified_free'] and m['best_bound_assumes'] == 'gaussian'


def test_a_violation_only_gdp_finds_says_it_assumes_a_gaussian_curve():
  rng = np.random.default_rng(4)
  world = np.arange(200) % 2 == 0
  s = rng.normal(size=200) + np.where(world, 1.5, -1.5)
  kw = dict(delta=DELTA, confidence=0.95, independent=True, midpoint=0.0, report_all=False)
  first = cs.audit(s, world, 'update_dp', 100.0, reach=False, **kw)
  free, gauss = first['certified_free'], first['certified_gaussian']
  assert gauss > free + 1.0    # a claim halfway is far from both bounds
  m = cs.audit(s, world, 'update_dp', (free + gauss) / 2, **kw)
  assert m['verdict'] == 'violation'
  assert set(m['refuting_tests'].split(',')) <= set(GAUSSIAN)
  assert m['verdict_assumes'] == 'gaussian' and m['verdict_free'] != 'violation'
  low = cs.audit(s, world, 'update_dp', free / 2, **kw)
  assert low['verdict'] == 'violation' and low['verdict_assumes'] == 'none'
  assert 'epsilon_cp' in low['verdict_tests'].split(',') and low['verdict_free'] == 'violation'


def test_reachable_and_the_verdict_use_the_same_tests_the_profile_test_included(monkeypatch):
  # A Poisson claim of 8 with 2,000 canaries: no bound reaches 8, the profile test does.
  prof = _gdp_profile(2.0)
  claim = auditing.gdp_epsilon(2.0, DELTA)
  kw = dict(delta=DELTA, confidence=0.95, independent=True, claimed_delta=prof)
  reach = cs.attainable(1000, 1000, 'dp_sgd_poisson', claim, **kw)
  assert reach['max_certifiable'] < claim and reach['reach_tests'] == ('profile',)
  rng = np.random.default_rng(5)
  world = np.arange(2000) % 2 == 0
  m = cs.audit(rng.normal(size=2000) + world, world, 'dp_sgd_poisson', claim, **kw)
  assert m['verdict'] == 'no violation' and m['reach_tests'] == 'profile'
  assert m['verdict_tests'] == 'profile' and m['verdict_assumes'] == 'none'
  assert m['max_certifiable_free'] == reach['max_certifiable_free'] < claim
  # Without the profile the same row cannot refute: reach and verdict agree again (the
  # search for the canaries that would is not under test here).
  monkeypatch.setattr(cs, 'canaries_needed', lambda *a, **k: None)
  bare = cs.audit(rng.normal(size=2000) + world, world, 'dp_sgd_poisson', claim, delta=DELTA,
                  confidence=0.95, independent=True)
  assert bare['verdict'] == 'cannot refute' and bare['reach_tests'] == 'none'
  assert bare['verdict_tests'] == 'none' and bare['verdict_free'] == 'cannot refute'


@pytest.mark.parametrize('refutes,reachable,want', [
    ((), (), ('cannot refute', 'none', 'none', 'cannot refute')),
    ((), ('epsilon_gdp',), ('no violation', 'epsilon_gdp', 'gaussian', 'cannot refute')),
    ((), ('epsilon_cp', 'epsilon_gdp'), ('no violation', 'epsilon_cp,epsilon_gdp', 'none',
                                         'no violation')),
    (('epsilon_gdp_midpoint',), ('epsilon_cp', 'epsilon_gdp_midpoint'),
     ('violation', 'epsilon_gdp_midpoint', 'gaussian', 'no violation')),
    (('profile',), ('profile',), ('violation', 'profile', 'none', 'violation')),
])
def test_verdict_labels_say_what_carries_the_verdict(refutes, reachable, want):
  got = cs.verdict_labels(refutes, reachable)
  assert (cs.verdict_of(refutes, reachable), got['verdict_tests'], got['verdict_assumes'],
          got['verdict_free']) == want
  assert got['reach_tests'] == (','.join(reachable) or 'none')


def test_reachable_assuming_nothing_is_below_the_gaussian_tests_reach():
  # A perfect attack on 200 canaries: GDP reads a far larger epsilon than Clopper-Pearson.
  a = cs.attainable(100, 100, 'update_dp', 2.0, delta=DELTA, confidence=0.95,
                    independent=True, midpoint=True)
  assert 0 < a['max_certifiable_free'] < a['max_certifiable']
  assert a['reach_tests'][0] == 'epsilon_one_run' or 'epsilon_cp' in a['reach_tests']
