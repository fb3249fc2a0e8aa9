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


# ------------------------------------------- written from the mutation run's survivors ---


def _chunked_equal(curve, world, seed):
  """Scores of one seed drawn in one chunk and in chunks of 7 (a partial last one)."""
  one = cs.curve_scores(curve, world, np.random.default_rng(seed))
  small = cs.curve_scores(curve, world, np.random.default_rng(seed), chunk=7)
  return one, small


@pytest.mark.parametrize('relation', ['add_remove', 'replace_one'])
def test_an_always_present_gaussian_curve_sums_its_releases_in_any_chunking(relation):
  # Non-unit noise and shift, so a swapped s / d or d * d / d shows.
  curve = cs.Curve(steps=3, noise=1.5, shift=0.8, relation=relation)
  world = np.arange(30_000) % 2 == 0
  s, small = _chunked_equal(curve, world, 11)
  # Without subsampling nothing but the noise is drawn: the same stream in any chunking.
  np.testing.assert_array_equal(small, s)
  se = math.sqrt(3 * 1.5 ** 2 / 15_000)
  assert s[world].mean() == pytest.approx(3 * 0.8, abs=5 * se)
  out_mean = -3 * 0.8 if relation == 'replace_one' else 0.0
  assert s[~world].mean() == pytest.approx(out_mean, abs=5 * se)
  for part in (s[world], s[~world]):   # chi-square(n-1) variance, 5 standard errors
    assert part.var() == pytest.approx(3 * 1.5 ** 2, rel=5 * math.sqrt(2 / 15_000))


def test_randomized_response_scores_are_each_worlds_binomial_sum_in_any_chunking():
  e, steps = 0.7, 3
  curve = cs.Curve(steps=steps, rr_epsilon=e, relation='replace_one')
  world = np.arange(40_000) % 2 == 0
  s, small = _chunked_equal(curve, world, 12)
  np.testing.assert_array_equal(small, s)
  keep = math.exp(e) / (1 + math.exp(e))
  for part, sign in ((s[world], 1.0), (s[~world], -1.0)):
    # Every score is a sum of +-1 reports, the world's bit kept with probability e^e/(1+e^e).
    kept = (sign * part + steps) / 2
    np.testing.assert_array_equal(kept, np.round(kept))
    counts = np.bincount(kept.astype(int), minlength=steps + 1)
    assert counts.size == steps + 1
    expected = sps.binom.pmf(np.arange(steps + 1), steps, keep) * part.size
    assert sps.chisquare(counts, expected).pvalue > 1e-4


@pytest.mark.parametrize('relation', ['add_remove', 'replace_one'])
def test_a_subsampled_curves_score_is_its_log_likelihood_ratio(relation):
  # A log-likelihood ratio L of IN against OUT has E_OUT[e^L] = 1 and E_IN[e^-L] = 1; a wrong
  # shift, noise, rate or sign in L breaks one of them. Non-unit s and d, two steps.
  curve = cs.Curve(steps=2, noise=1.25, shift=0.8, rate=0.3, relation=relation)
  world = np.arange(200_000) % 2 == 0
  s = cs.curve_scores(curve, world, np.random.default_rng(13), chunk=4099)
  assert np.isfinite(s).all()
  for lr in (np.exp(s[~world]), np.exp(-s[world])):
    assert lr.mean() == pytest.approx(1.0, abs=5 * lr.std() / math.sqrt(lr.size))
  assert s[world].mean() > s[~world].mean() + 0.05
  if relation == 'replace_one':   # +shift and -shift: the worlds mirror each other
    assert sps.ks_2samp(s[world], -s[~world]).pvalue > 1e-3
  # A draw per step and canary: a smaller chunk draws the same law.
  small = cs.curve_scores(curve, world[:20_000], np.random.default_rng(14), chunk=7)
  assert np.isfinite(small).all()
  assert sps.ks_2samp(small[world[:20_000]], s[world]).pvalue > 1e-3


def _fit(in_rows, out_rows, **kw):
  return cs.subsampled_fit_epsilon(np.asarray(in_rows, np.float64),
                                   np.asarray(out_rows, np.float64), steps=4, delta=DELTA,
                                   **kw)


FIT_KEYS = ('fit_rate', 'fit_shift', 'fit_noise_std', 'fit_noise_multiplier', 'fit_epsilon')


def test_subsampled_fit_solves_its_moment_equations_from_one_step_each():
  # s = 2, D = 3, q = 1/4: E[L] = q D = 0.75, E[L^2] = s^2 + q D^2 = 6.25 (exact in binary).
  got = _fit([[0.75, 6.25, 1.0]], [[0.0, 4.0, 1.0]])
  assert set(got) == set(FIT_KEYS)
  assert got['fit_noise_std'] == pytest.approx(2.0, rel=1e-12)
  assert got['fit_shift'] == pytest.approx(3.0, rel=1e-12)
  assert got['fit_rate'] == pytest.approx(0.25, rel=1e-12)
  assert got['fit_noise_multiplier'] == pytest.approx(2.0 / 3.0, rel=1e-12)
  decl = accounting.Declaration('dp_sgd', 'record', 'add_remove', 'server', 'poisson', 1.0,
                                4, 0.25)
  for acc in ('pld', 'rdp'):
    want = accounting.epsilon(decl, 2.0 / 3.0, delta=DELTA, accountant=acc)
    assert (_fit([[0.75, 6.25, 1.0]], [[0.0, 4.0, 1.0]], accountant=acc)['fit_epsilon'] ==
            pytest.approx(want, rel=1e-9))
  assert got['fit_epsilon'] == pytest.approx(
      accounting.epsilon(decl, 2.0 / 3.0, delta=DELTA, accountant='pld'), rel=1e-9)
  # A rate the moments put above 1 (m1^2 > m2 - s^2) is read as 1: s = 1, m1 = 3, m2 = 7.
  capped = _fit([[3.0, 7.0, 1.0]], [[0.0, 1.0, 1.0]])
  assert capped['fit_rate'] == 1.0 and capped['fit_shift'] == pytest.approx(2.0)
  assert capped['fit_noise_multiplier'] == pytest.approx(0.5)


@pytest.mark.parametrize('in_rows,out_rows,std', [
    ([[0.75, 6.25, 0.0]], [[0.0, 4.0, 1.0]], math.nan),    # no IN step
    ([[0.75, 6.25, 1.0]], [[0.0, 4.0, 0.0]], math.nan),    # no OUT step
    ([[0.0, 6.25, 1.0]], [[0.0, 4.0, 1.0]], 2.0),          # no mean shift
    ([[0.75, 4.0, 1.0]], [[0.0, 4.0, 1.0]], 2.0),          # no excess second moment
    ([[-0.75, 6.25, 1.0]], [[0.0, 4.0, 1.0]], 2.0),        # a negative mean
])
def test_subsampled_fit_is_nan_where_the_moments_do_not_determine_it(in_rows, out_rows, std):
  got = _fit(in_rows, out_rows)
  assert set(got) == set(FIT_KEYS)
  assert all(isinstance(got[k], float) for k in FIT_KEYS)
  for k in FIT_KEYS:
    if k == 'fit_noise_std' and not math.isnan(std):
      assert got[k] == pytest.approx(std)
    else:
      assert math.isnan(got[k]), k


def test_report_all_false_leaves_an_uncounted_fdp_bound_out():
  rng = np.random.default_rng(21)
  world = np.arange(400) % 2 == 0
  scores = rng.normal(size=400) + 2.0 * world
  kw = dict(delta=DELTA, confidence=0.95, independent=True, reach=False)
  # Not counted for a non-Gaussian curve: skipped (NaN) unless every bound is asked for.
  assert math.isnan(cs.audit(scores, world, 'dp_sgd_poisson', 2.0, report_all=False,
                             **kw)['epsilon_one_run_fdp'])
  assert math.isfinite(cs.audit(scores, world, 'dp_sgd_poisson', 2.0, **kw)
                       ['epsilon_one_run_fdp'])
  # Counted for a Gaussian one: always computed.
  assert math.isfinite(cs.audit(scores, world, 'update_dp', 2.0, report_all=False,
                                **kw)['epsilon_one_run_fdp'])


def test_a_fixed_midpoint_is_tested_at_one_half_between_perfect_scores():
  kw = dict(delta=DELTA, confidence=0.95, independent=True)
  plain = cs.attainable(500, 500, 'update_dp', 2.0, **kw)
  assert plain == cs.attainable(500, 500, 'update_dp', 2.0, midpoint=False, **kw)
  mid = cs.attainable(500, 500, 'update_dp', 2.0, midpoint=True, **kw)
  counted = cs.counted_bounds('update_dp', True, True)
  each = 1 - 0.05 / len(counted)
  ones, zeros = np.ones(500), np.zeros(500)
  at_half = auditing.audit_scores(ones, zeros, delta=DELTA, confidence=each,
                                  threshold_strategy='explicit', threshold=0.5,
                                  fdp=False)['epsilon_gdp']
  found = auditing.audit_scores(ones, zeros, delta=DELTA, confidence=each, fdp=True)
  want = max([at_half] + [found[k] for k in counted[:-1]])
  assert mid['max_certifiable'] == pytest.approx(want, rel=1e-12)
  assert mid['max_certifiable'] > plain['max_certifiable']


def _refutes(n, claim, **kw):
  return cs.attainable(n // 2, n - n // 2, 'update_dp', claim, **kw)['can_refute']


@pytest.mark.parametrize('extra', [dict(midpoint=True),
                                   dict(claimed_delta=_gdp_profile(2.0))])
def test_canaries_needed_reads_the_profile_and_the_midpoint_it_is_given(extra):
  kw = dict(delta=DELTA, confidence=0.95, independent=True, **extra)
  n = cs.canaries_needed('update_dp', 3.0, **kw)
  assert n == cs.canaries_needed('update_dp', 3.0, start=16, **kw)
  assert _refutes(n, 3.0, **kw)
  # The grid's previous point (a factor 2^(1/4) below) does not refute.
  assert not _refutes(int(math.ceil(n * 2 ** -0.25)) - 1, 3.0, **kw)


def test_audits_reach_uses_the_rows_profile_midpoint_and_search(monkeypatch):
  rng = np.random.default_rng(22)
  world = np.arange(32) % 2 == 0
  scores = rng.normal(size=32) + world
  prof = _gdp_profile(_mu_at(6.0))
  kw = dict(delta=DELTA, confidence=0.95, independent=True)
  got = cs.audit(scores, world, 'update_dp', 6.0, claimed_delta=prof, midpoint=0.5, **kw)
  reach = cs.attainable(16, 16, 'update_dp', 6.0, claimed_delta=prof, midpoint=True, **kw)
  assert got['max_certifiable'] == pytest.approx(reach['max_certifiable'], rel=1e-12)
  assert got['can_refute'] == float(reach['can_refute'])
  for other in (dict(claimed_delta=prof), dict(midpoint=True)):
    assert (cs.attainable(16, 16, 'update_dp', 6.0, **kw, **other)['max_certifiable'] !=
            got['max_certifiable'])
  assert not reach['can_refute']
  assert got['verdict'] == 'cannot refute'
  assert got['canaries_needed'] == cs.canaries_needed(
      'update_dp', 6.0, claimed_delta=prof, midpoint=True, start=16, **kw)
  # No count up to the cap refutes (the search's None, e.g. one-run bounds past their peak,
  # which takes a minute to search here): -1.
  monkeypatch.setattr(cs, 'canaries_needed', lambda *a, **k: None)
  dep = cs.audit(scores, world, 'update_dp', 30.0, delta=DELTA, confidence=0.95)
  assert dep['canaries_needed'] == -1 and dep['verdict'] == 'cannot refute'


def test_audit_refuses_a_world_with_fewer_than_two_canaries_in_words():
  with pytest.raises(ValueError,
                     match=r'^the audit needs at least two canaries in each world$'):
    cs.audit(np.zeros(3), np.array([True, False, False]), 'update_dp', 2.0, delta=DELTA,
             confidence=0.95)


def test_simulated_bound_passes_the_mechanism_claim_and_profile_to_the_tests():
  curve = cs.Curve(steps=4, noise=1.0, rate=0.5)
  prof = _gdp_profile(_mu_at(2.0))
  kw = dict(delta=DELTA, confidence=0.95, independent=True, claimed_delta=prof)
  ref = cs.simulated_bound(curve, 300, 300, 'dp_sgd_poisson', 2.0, **kw)
  assert ref == cs.simulated_bound(curve, 300, 300, 'dp_sgd_poisson', 2.0, repeats=3, seed=0,
                                   **kw)
  rng = np.random.default_rng(0)
  world = np.concatenate([np.ones(300, bool), np.zeros(300, bool)])
  best = [cs.audit(cs.curve_scores(curve, world, rng), world, 'dp_sgd_poisson', 2.0,
                   reach=False, report_all=False, **kw)['best_bound'] for _ in range(3)]
  assert ref == pytest.approx(float(np.median(best)), rel=1e-12)
  # The mechanism decides which bounds count: the same scores under a Gaussian curve count more.
  assert cs.simulated_bound(curve, 300, 300, 'update_dp', 2.0, **kw) >= ref


def test_simulated_needed_doubles_until_two_of_three_simulations_flag():
  # Half the noise of a claim: one Gaussian step at z = 1/2 against the epsilon of z = 1.
  claim = accounting.epsilon(accounting.Declaration(
      'update_dp', 'client', 'replace_one', 'server', 'none', 1.0, 1, 1.0), 0.5, delta=DELTA)
  half = cs.Curve(steps=1, noise=0.25, relation='replace_one')
  kw = dict(delta=DELTA, confidence=0.95, independent=True)
  n = cs.simulated_needed(half, 'update_dp', claim, start=16, seed=3, **kw)
  assert n is not None and n >= 16 and n & (n - 1) == 0
  world = np.arange(n) % 2 == 0
  rng = np.random.default_rng(3)
  flags = [cs.audit(cs.curve_scores(half, world, rng), world, 'update_dp', claim,
                    reach=False, report_all=False, **kw)['privacy_violation']
           for _ in range(3)]
  assert sum(flags) >= 2
  # The claimed mechanism itself is never flagged: no count up to the cap.
  fair = cs.Curve(steps=1, noise=0.5, relation='replace_one')
  assert cs.simulated_needed(fair, 'update_dp', claim, start=16, cap=64, seed=3, **kw) is None


def test_the_profile_test_costs_canaries_where_it_does_not_decide():
  # At claim 5 the claim's own profile test cannot beat the bounds with few canaries, and its
  # Bonferroni share raises the count a perfect attack needs (64 against 54 here).
  kw = dict(delta=DELTA, confidence=0.95, independent=True)
  prof = _gdp_profile(_mu_at(5.0))
  with_profile = cs.canaries_needed('update_dp', 5.0, claimed_delta=prof, **kw)
  assert with_profile > cs.canaries_needed('update_dp', 5.0, **kw)
  assert _refutes(with_profile, 5.0, claimed_delta=prof, **kw)
  assert not _refutes(int(math.ceil(with_profile * 2 ** -0.25)) - 1, 5.0, claimed_delta=prof,
                      **kw)


def _needed_reference(curve, mechanism, claim, *, start, cap, seed, **kw):
  """`simulated_needed` as documented, through the audit's own verdict."""
  rng = np.random.default_rng(seed)
  n = start
  while n <= cap:
    world = np.arange(n) % 2 == 0
    hits = sum(cs.audit(cs.curve_scores(curve, world, rng), world, mechanism, claim,
                        reach=False, report_all=False, **kw)['privacy_violation']
               for _ in range(3))
    if hits >= 2:
      return n
    n *= 2
  return None


@pytest.mark.parametrize('mechanism,midpoint', [('update_dp', 0.0), ('dp_sgd_poisson', None)])
def test_simulated_needed_is_its_documented_search(mechanism, midpoint):
  # A Gaussian step at z = 0.8 against the claim of z = 1 (4.73 at 1e-5), with the claim's
  # profile: a violation a few hundred canaries flag, after some doublings.
  decl = accounting.Declaration('update_dp', 'client', 'replace_one', 'server', 'none', 1.0,
                                1, 1.0)
  claim = accounting.epsilon(decl, 1.0, delta=DELTA)
  kw = dict(delta=DELTA, confidence=0.95, independent=True,
            claimed_delta=_gdp_profile(_mu_at(claim)), midpoint=midpoint)
  curve = cs.Curve(steps=1, noise=0.8, relation='replace_one')
  got = cs.simulated_needed(curve, mechanism, claim, start=16, seed=3, **kw)
  assert got == _needed_reference(curve, mechanism, claim, start=16, cap=1 << 20, seed=3, **kw)
  assert got is not None and got > 32
  # The cap is the last count tried; the start, by default 256, the first.
  assert cs.simulated_needed(curve, mechanism, claim, start=got, cap=got, seed=3, **kw) == got
  strong = cs.Curve(steps=1, noise=0.2, relation='replace_one')
  assert cs.simulated_needed(strong, mechanism, claim, **kw) == 256
  assert cs.simulated_needed(strong, mechanism, claim, **kw) == cs.simulated_needed(
      strong, mechanism, claim, seed=0, **kw)
