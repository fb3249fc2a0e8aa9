"""The MLE / PLD Poisson audit (`attacks.audit.poisson_mle`): its likelihood, fit, region and
lower bound on small simulated readings (a few thousand a world, seeded)."""

import functools
import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats as sps

from fl_privacy import accounting
from fl_privacy.attacks.audit import audit_power
from fl_privacy.attacks.audit import canary_statistics as cs
from fl_privacy.attacks.audit import poisson_mle as pm
from fl_privacy.pipelines import training_audit_poisson as tap

DELTA = 1e-5
COARSE = pm.COARSE   # PLD's coarse interval: a cheaper lower estimate, for fast tests


def _readings(seed, n, steps, q, s, d):
  rng = np.random.default_rng(seed)
  out = rng.normal(0.0, s, (n, steps))
  inn = rng.normal(0.0, s, (n, steps)) + d * (rng.random((n, steps)) < q)
  return inn, out


def _decl(q, steps):
  return accounting.Declaration('dp_sgd', 'record', 'add_remove', 'server', 'poisson', 1.0,
                                steps, q)


def test_the_binned_likelihood_is_the_multinomial_of_normal_cdf_differences():
  # Three bins by hand: (-inf, -1], (-1, 0.5], (0.5, inf); counts IN (1, 2, 3), OUT (4, 5, 0).
  b = pm.Binned(lo=np.array([-np.inf, -1.0, 0.5]), hi=np.array([-1.0, 0.5, np.inf]),
                counts_in=np.array([1.0, 2.0, 3.0]), counts_out=np.array([4.0, 5.0, 0.0]))
  q, s, d = 0.3, 1.7, 2.0
  cdf = lambda x, m: sps.norm.cdf(x, m, s)
  p0 = np.array([cdf(-1, 0), cdf(0.5, 0) - cdf(-1, 0), 1 - cdf(0.5, 0)])
  p1 = np.array([cdf(-1, d), cdf(0.5, d) - cdf(-1, d), 1 - cdf(0.5, d)])
  want = np.dot([4, 5, 0], np.log(p0)) + np.dot([1, 2, 3], np.log((1 - q) * p0 + q * p1))
  assert pm.log_likelihood(b, q, s, d) == pytest.approx(want, rel=1e-12)
  # The ends of q: all OUT-like, all shifted.
  assert pm.log_likelihood(b, 0.0, s, d) == pytest.approx(np.dot([5, 7, 3], np.log(p0)))
  assert pm.log_likelihood(b, 1.0, s, d) == pytest.approx(
      np.dot([4, 5, 0], np.log(p0)) + np.dot([1, 2, 3], np.log(p1)))


def test_a_bin_far_in_either_tail_keeps_its_mass():
  # Phi(31) - Phi(30) underflows as a difference of CDFs near 1; the mirrored form keeps it,
  # and equals the lower tail's (-31, -30] by symmetry.
  up = pm._log_mass(np.array([30.0]), np.array([31.0]))[0]
  down = pm._log_mass(np.array([-31.0]), np.array([-30.0]))[0]
  assert math.isfinite(up) and up == pytest.approx(down, rel=1e-12)
  assert up == pytest.approx(sps.norm.logsf(30.0), rel=1e-3)


def test_the_histogram_drops_missing_steps_and_refuses_too_few_readings():
  inn, out = _readings(0, 50, 4, 0.5, 1.0, 1.0)
  inn[:, -1] = np.nan
  b = pm.histogram(inn, out)
  assert b.counts_in.sum() == 150 and b.counts_out.sum() == 200
  assert np.isneginf(b.lo[0]) and np.isposinf(b.hi[-1])
  with pytest.raises(ValueError, match='at least two readings'):
    pm.histogram(np.array([np.nan, 1.0]), out)


def _observed_se(b, m):
  """Standard errors of (q, s, d) from the observed information (central differences)."""
  f = lambda v: pm.log_likelihood(b, v[0], v[1], v[2])
  x = np.array([m['q'], m['s'], m['d']])
  h = 1e-4 * np.maximum(np.abs(x), 1e-2)
  hess = np.zeros((3, 3))
  for i in range(3):
    for j in range(3):
      e_i, e_j = np.eye(3)[i] * h[i], np.eye(3)[j] * h[j]
      hess[i, j] = (f(x + e_i + e_j) - f(x + e_i - e_j) - f(x - e_i + e_j)
                    + f(x - e_i - e_j)) / (4 * h[i] * h[j])
  return np.sqrt(np.diag(np.linalg.inv(-hess)))


@pytest.mark.parametrize('seed,q,s,d', [(1, 0.3, 1.0, 1.5), (2, 0.1, 2.0, 2.5)])
def test_the_fit_recovers_the_mechanism_within_its_standard_errors(seed, q, s, d):
  b = pm.histogram(*_readings(seed, 400, 30, q, s, d))
  m = pm.fit(b)
  se = _observed_se(b, m)
  # 12,000 readings a world: within 4 observed standard errors of the truth (a seeded draw;
  # a wrong likelihood or optimiser misses by many).
  assert abs(m['q'] - q) < 4 * se[0] and abs(m['s'] - s) < 4 * se[1]
  assert abs(m['d'] - d) < 4 * se[2]
  assert se[0] < 0.2 * q   # and the errors are small enough for the check to mean something
  assert m['mu'] == pytest.approx(m['d'] / m['s'])


def test_the_region_covers_the_truth_and_excludes_a_far_point():
  q, s, d = 0.2, 1.0, 1.2
  b = pm.histogram(*_readings(3, 400, 30, q, s, d))
  m = pm.fit(b)
  crit = pm.critical(0.95)
  stat = lambda qq, mu: 2 * (m['loglik'] - pm.profile_noise(b, qq, mu, m['s']))
  assert stat(q, d / s) <= crit
  assert stat(q, 0.5 * d / s) > crit and stat(2 * q, d / s) > crit


def test_the_pld_epsilon_is_dp_accountings_optimistic_reading():
  q, steps, z = 0.1, 40, 1.5
  fine = accounting.epsilon(_decl(q, steps), z, delta=DELTA, accountant='pld')
  got = pm.pld_epsilon(q, z, steps, DELTA)
  # The optimistic estimate lies below the pessimistic accountant's, within 3%.
  assert got <= fine and got > 0.97 * fine
  assert pm.pld_epsilon(q, math.inf, steps, DELTA) == 0.0


def test_the_bound_is_below_the_truth_on_the_mechanism_claimed():
  q, steps, z = 0.3, 10, 1.5
  true_eps = accounting.epsilon(_decl(q, steps), z, delta=DELTA, accountant='pld')
  inn, out = _readings(4, 300, steps, q, z, 1.0)
  got = pm.audit(inn, out, steps=steps, claimed_epsilon=true_eps, delta=DELTA, level=0.95,
                 discretization=COARSE)
  assert 0 < got['epsilon_mle_pld'] < true_eps and got['mle_pld_refutes'] == 0.0
  assert got['mle_region_rate_low'] <= q <= got['mle_region_rate_high']
  assert got['mle_pld_assumes'] == 'poisson_subsampled_gaussian'
  # The same claim against a training that ran half the noise is refuted: the pipeline's
  # test below (`test_a_poisson_row_counts_the_mle_test_...`) reads that bound.


def test_readings_without_signal_bound_nothing():
  inn, out = _readings(6, 200, 10, 0.3, 1.0, 0.0)
  got = pm.audit(inn, out, steps=10, claimed_epsilon=1.0, delta=DELTA, level=0.95,
                 discretization=COARSE)
  assert got['epsilon_mle_pld'] < 0.5 and got['mle_pld_refutes'] == 0.0


def test_the_mle_test_is_labelled_by_its_family_and_joins_the_bonferroni_family():
  assert cs.assumes('epsilon_mle_pld') == 'poisson_subsampled_gaussian'
  lab = cs.verdict_labels(('epsilon_mle_pld',), ())
  assert lab['verdict_assumes'] == 'poisson_subsampled_gaussian'
  assert lab['verdict_free'] == 'no violation' or lab['verdict_free'] == 'cannot refute'
  assert cs._level(('epsilon_cp',), True, 0.95, extra=1) == pytest.approx(1 - 0.05 / 3)


def test_the_power_simulation_flags_a_large_planted_bug_and_reads_the_row_score():
  q, steps = 0.3, 10
  curve = cs.Curve(steps=steps, noise=1.5, rate=q)
  world = np.arange(200) % 2 == 0
  x, sc = audit_power.curve_readings(curve, world, np.random.default_rng(0))
  llr = np.logaddexp(np.log1p(-q), np.log(q) + (x - 0.5) / 1.5 ** 2).sum(1)
  np.testing.assert_allclose(sc, llr)
  claim = accounting.epsilon(_decl(q, steps), 1.5, delta=DELTA, accountant='pld')
  design = audit_power.Design(n_in=100, n_out=100, mechanism='dp_sgd_poisson',
                              claimed_epsilon=claim, delta=DELTA, confidence=0.95,
                              independent=True)
  got = audit_power.mle_power(curve, design, (0.5,), draws=1, seed=0,
                              discretization=COARSE)[0.5]
  assert got['mle_pld_hits'] == 1 and got['verdict_hits'] == 1
  with pytest.raises(ValueError, match='Poisson-subsampled'):
    audit_power.curve_readings(cs.Curve(steps=2), world, np.random.default_rng(0))


def test_a_poisson_row_counts_the_mle_test_in_its_verdict_only_with_its_readings(monkeypatch):
  monkeypatch.setattr(tap.poisson_mle, 'audit', functools.partial(pm.audit,
                                                                   discretization=COARSE))
  # The moment fit is `test_canary_statistics`' subject (its PLD reading takes seconds here).
  calls = []
  monkeypatch.setattr(tap.poisson_mle, 'subsampled_fit_epsilon',
                      lambda a, b, steps, delta: calls.append((len(a), len(b), steps)) or
                      {'fit_epsilon': math.nan})
  q, steps, z = 0.3, 10, 1.5
  claim = accounting.epsilon(_decl(q, steps), z, delta=DELTA, accountant='pld')
  inn, out = _readings(7, 150, steps, q, z / 2, 1.0)   # half the claim's noise ran
  reads = np.concatenate([inn, out])
  world = np.arange(300) < 150
  mom = np.stack([reads.sum(1), (reads ** 2).sum(1), np.full(300, steps)], 1)
  tr = dict(canary='gradient', sampling='poisson')
  metrics = dict(dp_epsilon=claim, bound_confidence=0.99, refuting_tests='none',
                 reach_tests='epsilon_cp', counted_bounds='epsilon_one_run,epsilon_cp',
                 verdict='no violation', canaries_needed=-1)
  bare = tap.row_fits(tr, 'all_steps', {'scores': SimpleNamespace(step_moments=mom)}, world,
                      metrics, steps=steps, delta=DELTA)
  assert 'not run' in bare['mle_pld_model'] and 'epsilon_mle_pld' not in bare
  assert tap.extra_tests(tr, 'all_steps', {'scores': SimpleNamespace(step_moments=mom)}) == 0
  done = {'scores': SimpleNamespace(step_moments=mom, step_readings=reads)}
  assert tap.extra_tests(tr, 'all_steps', done) == 1
  assert tap.row_fits(tr, 'all_iterates', done, world, metrics, steps=steps, delta=DELTA) == {}
  got = tap.row_fits(tr, 'all_steps', done, world, metrics, steps=steps, delta=DELTA)
  # Half the claim's noise: the bound exceeds the claim, and the row's verdict says so.
  assert got['epsilon_mle_pld'] > claim and got['verdict'] == 'violation'
  assert got['refuting_tests'] == 'epsilon_mle_pld' and got['privacy_violation'] == 1.0
  assert got['verdict_assumes'] == 'poisson_subsampled_gaussian'
  assert got['verdict_free'] == 'no violation' and got['mle_pld_level'] == 0.99
  assert got['counted_bounds'].endswith(',epsilon_mle_pld')
  assert calls[0] == (150, 150, steps) and math.isnan(got['epsilon_estimate'])
  assert got['mle_steps_seen'] == steps == got['mle_steps_claimed']
  assert got['canaries_needed'] == 0 and 'epsilon_mle_pld' in got['reach_tests']


def test_a_row_with_readings_simulates_its_power_with_the_mle_test(monkeypatch):
  seen = []
  real = audit_power.mle_verdict

  def coarse(*args, **kw):
    seen.append(args[-1])
    return real(*args, discretization=COARSE)
  monkeypatch.setattr(audit_power, 'mle_verdict', coarse)
  q, steps = 0.3, 10
  curve = cs.Curve(steps=steps, noise=1.5, rate=q)
  claim = accounting.epsilon(_decl(q, steps), 1.5, delta=DELTA, accountant='pld')
  design = audit_power.Design(n_in=100, n_out=100, mechanism='dp_sgd_poisson',
                              claimed_epsilon=claim, delta=DELTA, confidence=0.95,
                              independent=True, mle_steps=steps)
  assert audit_power.detection(curve, design, 0.5, draws=1) == 1 and seen == [steps]
  # Without `mle_steps` the row's scores alone: these 200 canaries flag nothing at 0.5x.
  bare = audit_power.Design(**{**design.__dict__, 'mle_steps': None})
  assert audit_power.detection(curve, bare, 0.5, draws=1) == 0 and seen == [steps]
