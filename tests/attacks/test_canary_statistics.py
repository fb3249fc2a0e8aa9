"""What a training audit's canaries certify, could certify, and estimate
(`attacks.audit.canary_statistics`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as sps

from fl_privacy import accounting
from fl_privacy.attacks.audit import canary_statistics as cs
from fl_privacy.eval import auditing

DELTA = 1e-5


def _gdp_profile(mu: float):
  """The exact privacy profile of mu-GDP (Dong et al. 2019, Corollary 2.13)."""
  def curve(eps):
    eps = np.asarray(eps, np.float64)
    return sps.norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * sps.norm.cdf(-eps / mu - mu / 2)
  return curve


def _mu_at(eps: float) -> float:
  return optimize.brentq(lambda m: auditing.gdp_epsilon(m, DELTA) - eps, 1e-3, 20.0)


# ------------------------------------------------------------------------ counted tests ---


def test_counted_bounds_follow_the_curve_independence_and_a_fixed_threshold():
  assert cs.counted_bounds('update_dp', False) == ('epsilon_one_run', 'epsilon_one_run_fdp')
  assert cs.counted_bounds('update_dp', True) == ('epsilon_one_run', 'epsilon_one_run_fdp',
                                                  'epsilon_cp', 'epsilon_gdp')
  assert cs.counted_bounds('update_dp', True, True)[-1] == 'epsilon_gdp_midpoint'
  # A fixed threshold adds a GDP test only where GDP counts: independent, Gaussian-shaped.
  assert cs.counted_bounds('update_dp', False, True) == cs.counted_bounds('update_dp', False)
  assert cs.counted_bounds('dp_sgd_poisson', True, True) == ('epsilon_one_run', 'epsilon_cp')
  assert cs.counted_bounds('ldp_sgd', True) == ('epsilon_one_run', 'epsilon_cp')
  assert cs.counted_bounds('central_dp_without_replacement', False) == ('epsilon_one_run',)


def test_every_counted_test_is_at_the_bonferroni_level_and_reported():
  rng = np.random.default_rng(0)
  world = rng.random(2000) < 0.5
  s = rng.normal(size=2000) + np.where(world, 0.5, -0.5)
  m = cs.audit(s, world, 'update_dp', 8.0, delta=DELTA, confidence=0.95, independent=True,
               claimed_delta=_gdp_profile(_mu_at(8.0)), midpoint=0.0)
  counted = m['counted_bounds'].split(',')
  assert counted == ['epsilon_one_run', 'epsilon_one_run_fdp', 'epsilon_cp', 'epsilon_gdp',
                     'epsilon_gdp_midpoint', 'profile']
  assert m['bound_confidence'] == pytest.approx(1 - 0.05 / 6)
  # The midpoint test is the library's GDP bound at threshold 0 at that level.
  want = auditing.audit_scores(s[world], s[~world], delta=DELTA, confidence=1 - 0.05 / 6,
                               threshold_strategy='explicit', threshold=0.0,
                               fdp=False)['epsilon_gdp']
  assert m['epsilon_gdp_midpoint'] == pytest.approx(want, rel=1e-12)
  assert m['best_bound'] == max(m[k] for k in counted[:-1])
  # m delta of the one-run bound counts the bounding half only.
  assert m['bounding_canaries'] == auditing.one_run_trials(m['n_in'], m['n_out'], 'split')
  assert m['one_run_delta_term'] == pytest.approx(2 * m['bounding_canaries'] * DELTA)
  # With a fixed threshold the GDP bound of a Gaussian with mu = 1 is tighter than the search.
  assert m['epsilon_gdp_midpoint'] > m['epsilon_gdp']


# -------------------------------------------------------------- what canaries can reach ---


def test_a_perfect_attack_reaches_more_with_more_canaries_and_decides_can_refute():
  kw = dict(delta=DELTA, confidence=0.95, independent=True)
  small = cs.attainable(50, 50, 'ldp_sgd', 2.0, **kw)
  large = cs.attainable(5000, 5000, 'ldp_sgd', 2.0, **kw)
  assert 0 < small['max_certifiable'] < large['max_certifiable']
  # Clopper-Pearson of a perfect attack on n OUT canaries: about log(n_bound / log(1 / alpha)).
  assert large['max_certifiable'] == pytest.approx(
      auditing.audit_scores(np.ones(5000), np.zeros(5000), delta=DELTA,
                            confidence=1 - 0.05 / 2, fdp=False)['epsilon_cp'], rel=1e-9)
  assert large['can_refute'] and not cs.attainable(50, 50, 'ldp_sgd', 8.0, **kw)['can_refute']
  # Dependent canaries: one-run bounds only, capped by their 2 m delta term.
  dep = [cs.attainable(n, n, 'dp_sgd_poisson', 8.0, delta=DELTA, confidence=0.95,
                       independent=False)['max_certifiable'] for n in (500, 5000, 50_000)]
  assert max(dep) < 8.0


def test_the_profile_test_lets_a_perfect_attack_refute_a_claim_above_its_bounds():
  # ldp_sgd's Clopper-Pearson cannot reach 8 with 2,000 canaries, but a claim of mu-GDP at 8
  # has delta(4) ~ 0.1, which a perfect attack's profile exceeds.
  kw = dict(delta=DELTA, confidence=0.95, independent=True)
  a = cs.attainable(1000, 1000, 'dp_sgd_poisson', 8.0, claimed_delta=_gdp_profile(_mu_at(8.0)),
                    **kw)
  assert a['max_certifiable'] < 8.0 and a['can_refute'] and a['max_certifiable_profile'] == 1


def test_canaries_needed_is_the_first_count_that_refutes():
  kw = dict(delta=DELTA, confidence=0.95, independent=True)
  n = cs.canaries_needed('ldp_sgd', 4.0, start=16, **kw)
  assert n is not None
  assert cs.attainable(n // 2, n - n // 2, 'ldp_sgd', 4.0, **kw)['can_refute']
  half = n // 2
  assert not cs.attainable(half // 2, half - half // 2, 'ldp_sgd', 4.0, **kw)['can_refute']
  # Already enough: the start is returned.
  assert cs.canaries_needed('ldp_sgd', 1.0, start=4096, **kw) == 4096
  # One-run bounds whose 2 m delta grows with m never reach 20 below the cap.
  assert cs.canaries_needed('dp_sgd_poisson', 20.0, delta=DELTA, confidence=0.95,
                            independent=False, start=64, cap=1 << 14) is None


def test_audit_says_cannot_refute_when_a_perfect_attack_could_not():
  rng = np.random.default_rng(1)
  world = rng.random(100) < 0.5
  s = rng.normal(size=100)
  m = cs.audit(s, world, 'ldp_sgd', 8.0, delta=DELTA, confidence=0.95, independent=True)
  assert m['verdict'] == 'cannot refute' and m['can_refute'] == 0
  assert m['canaries_needed'] > 100
  assert cs.attainable(m['canaries_needed'] // 2, m['canaries_needed'] // 2 + 1, 'ldp_sgd',
                       8.0, delta=DELTA, confidence=0.95, independent=True)['can_refute']
  m2 = cs.audit(s, world, 'ldp_sgd', 1.0, delta=DELTA, confidence=0.95, independent=True)
  assert m2['verdict'] == 'no violation' and m2['canaries_needed'] == 0
  strong = np.where(world, 10.0, -10.0) + rng.normal(size=100)
  m3 = cs.audit(strong, world, 'ldp_sgd', 0.5, delta=DELTA, confidence=0.95, independent=True)
  assert m3['verdict'] == 'violation' and m3['privacy_violation'] == 1


# -------------------------------------------------------------------- the null's level ---


def test_the_verdict_holds_its_family_wise_level_at_a_mechanism_exactly_at_its_claim():
  """200 audits of 300 canaries of a mechanism whose epsilon is exactly the claim (Gaussian
  mu-GDP scores, each canary independent), its six counted tests (the one-run bounds,
  Clopper-Pearson, GDP searched and at the midpoint, and the profile test against the
  mechanism's exact profile). A verdict at family-wise 95% fires in Binomial(200, <= 0.05)
  audits: more than 20 has probability < 2e-3. Were its false-violation rate 20% (an 80% verdict), about 40 would fire, and 20 or
  fewer has probability < 1e-3: the experiment's size tells the two apart. Measured: 0 of 200
  (0 also with the Poisson label's tests), and still 0 with every test at 95% instead of its
  Bonferroni share: each test is conservative at the boundary (it errs only when both of its
  rates' bounds do), so the split of the level is checked by
  `test_every_counted_test_is_at_the_bonferroni_level`."""
  rng = np.random.default_rng(2)
  eps = 2.0
  mu = _mu_at(eps)
  profile = _gdp_profile(mu)
  fired = 0
  for _ in range(200):
    world = rng.random(300) < 0.5
    s = rng.normal(size=300) + np.where(world, mu / 2, -mu / 2)
    m = cs.audit(s, world, 'update_dp', eps, delta=DELTA, confidence=0.95, independent=True,
                 claimed_delta=profile, midpoint=0.0, reach=False, report_all=False)
    fired += int(m['privacy_violation'])
  assert fired <= 20
  assert sps.binom.sf(20, 200, 0.05) < 2e-3 and sps.binom.cdf(20, 200, 0.2) < 1e-3


# ------------------------------------------------------------------------- estimates ---


def test_gaussian_fit_recovers_mu_and_its_epsilon():
  rng = np.random.default_rng(0)
  mu, eps = cs.gaussian_fit_epsilon(rng.normal(1.5, 2.0, 40_000),
                                    rng.normal(0.0, 2.0, 40_000), DELTA)
  assert mu == pytest.approx(0.75, abs=4 * math.sqrt(2 / 40_000) * 1.1)
  assert eps == pytest.approx(auditing.gdp_epsilon(mu, DELTA))


def _moments(l: np.ndarray) -> np.ndarray:
  return np.stack([l.sum(1), (l ** 2).sum(1), np.full(len(l), l.shape[1])], axis=1)


def test_subsampled_fit_recovers_rate_shift_noise_and_the_epsilon_they_give():
  rng = np.random.default_rng(3)
  n, steps, q, shift, sd = 4000, 40, 0.125, 1.0, 1.5
  drawn = rng.random((n, steps)) < q
  l_in = sd * rng.normal(size=(n, steps)) + shift * drawn
  l_out = sd * rng.normal(size=(n, steps))
  fit = cs.subsampled_fit_epsilon(_moments(l_in), _moments(l_out), steps=steps, delta=DELTA)
  # Standard errors from n x steps = 160,000 readings a world.
  m = n * steps
  assert fit['fit_noise_std'] == pytest.approx(sd, abs=5 * sd / math.sqrt(2 * m))
  assert fit['fit_rate'] * fit['fit_shift'] == pytest.approx(q * shift, abs=5 * sd / math.sqrt(m))
  assert fit['fit_shift'] == pytest.approx(shift, rel=0.2)
  decl = accounting.Declaration('dp_sgd', 'record', 'add_remove', 'server', 'poisson', 1.0,
                                steps, q)
  truth = accounting.epsilon(decl, sd / shift, delta=DELTA, accountant='pld')
  assert fit['fit_epsilon'] == pytest.approx(truth, rel=0.2)
  # Half the noise reads as a larger epsilon; no shift at all leaves it undetermined.
  half = cs.subsampled_fit_epsilon(_moments(l_in / 2 + shift / 2 * drawn),
                                   _moments(l_out / 2), steps=steps, delta=DELTA)
  assert half['fit_epsilon'] > 2 * truth
  none = cs.subsampled_fit_epsilon(_moments(l_out), _moments(l_out[::-1]), steps=steps,
                                   delta=DELTA)
  assert math.isnan(none['fit_epsilon']) or none['fit_epsilon'] < 0.2 * truth


# ---------------------------------------------------------------- the simulated curves ---


def test_curve_scores_are_the_mechanisms_own_statistics():
  rng = np.random.default_rng(4)
  world = np.arange(20_000) % 2 == 0
  g = cs.curve_scores(cs.Curve(steps=5, noise=2.0, relation='replace_one'), world, rng)
  se = math.sqrt(5 * 4.0 / 10_000)
  assert g[world].mean() == pytest.approx(5.0, abs=5 * se)
  assert g[~world].mean() == pytest.approx(-5.0, abs=5 * se)
  assert g[world].var() == pytest.approx(20.0, rel=0.05)
  # A Poisson step's likelihood ratio has mean 1 under OUT (it is dQ/dP).
  p = cs.curve_scores(cs.Curve(steps=1, noise=1.0, rate=0.2), world, rng)
  lr = np.exp(p[~world])
  assert lr.mean() == pytest.approx(1.0, abs=5 * lr.std() / math.sqrt(lr.size))
  assert p[world].mean() > p[~world].mean()
  # Chunking does not change the draws' law: two chunk sizes, the same KS population.
  a = cs.curve_scores(cs.Curve(steps=3, noise=1.0, rate=0.3), world, np.random.default_rng(5),
                      chunk=333)
  b = cs.curve_scores(cs.Curve(steps=3, noise=1.0, rate=0.3), world, np.random.default_rng(6))
  assert sps.ks_2samp(a[world], b[world]).pvalue > 1e-3


def test_simulated_bound_is_the_median_of_the_audits_tests_on_the_curve():
  curve = cs.Curve(steps=5, noise=2.0, relation='replace_one')
  kw = dict(delta=DELTA, confidence=0.95, independent=True, midpoint=0.0)
  ref = cs.simulated_bound(curve, 500, 500, 'update_dp', 2.0, repeats=3, seed=7, **kw)
  rng = np.random.default_rng(7)
  world = np.concatenate([np.ones(500, bool), np.zeros(500, bool)])
  best = []
  for _ in range(3):
    s = cs.curve_scores(curve, world, rng)
    best.append(cs.audit(s, world, 'update_dp', 2.0, reach=False, **kw)['best_bound'])
  assert ref == pytest.approx(float(np.median(best)), rel=1e-12)
  assert ref == cs.simulated_bound(curve, 500, 500, 'update_dp', 2.0, repeats=3, seed=7, **kw)
