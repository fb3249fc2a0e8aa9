"""The power of a training audit's verdict, simulated on its own statistic
(`attacks.audit.audit_power`): planted noise factors, the detected factor at 95% and the
simulated optimum's interval."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from fl_privacy.attacks.audit import audit_power as ap
from fl_privacy.attacks.audit import canary_statistics as cs
from fl_privacy.eval import auditing

DELTA = 1e-5


def _gdp_profile(mu: float):
  def curve(eps):
    eps = np.asarray(eps, np.float64)
    return sps.norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * sps.norm.cdf(-eps / mu - mu / 2)
  return curve


# One Gaussian release of +-1 (replace-one) at noise 2: mu-GDP with mu = 1, its claim and
# exact profile; the audit of a Poisson row (assumption-free tests and the profile test).
CURVE = cs.Curve(steps=1, noise=2.0, relation='replace_one')
DESIGN = ap.Design(n_in=100, n_out=100, mechanism='dp_sgd_poisson',
                   claimed_epsilon=auditing.gdp_epsilon(1.0, DELTA), delta=DELTA,
                   confidence=0.95, independent=True, claimed_delta=_gdp_profile(1.0))


def test_power_rises_with_the_planted_factors_distance_from_1_on_the_rows_own_tests():
  # Measured over 20 draws: 20 / 20 at 0.2x (mu 5), 1 / 20 at 0.6x, 0 / 20 at 0.8x (mu 1.25);
  # 10 draws here (a second).
  far = ap.detection(CURVE, DESIGN, 0.2, draws=10, seed=1)
  near = ap.detection(CURVE, DESIGN, 0.8, draws=10, seed=1)
  assert far == 10 and near <= 1


def test_planted_draws_less_noise_and_scores_with_the_claims():
  p = ap.planted(cs.Curve(steps=3, noise=2.0, rate=0.3), 0.5)
  assert (p.noise, p.score_noise) == (1.0, 2.0)
  # Planting twice keeps the claim's noise for the score.
  assert ap.planted(p, 0.5).score_noise == 2.0 and ap.planted(p, 0.5).noise == 0.5
  with pytest.raises(ValueError, match='noise factor must be > 0'):
    ap.planted(CURVE, 0.0)
  # The subsampled score is the claim's likelihood ratio of the release drawn at noise 1.
  world = np.array([True, False])
  rng = np.random.default_rng(0)
  got = cs.curve_scores(p, world, np.random.default_rng(0))
  noise = rng.normal(0.0, 1.0, size=(2, 3))
  drawn = rng.random((2, 3)) < 0.3
  x = noise + drawn * np.where(world, 1.0, 0.0)[:, None]
  want = np.logaddexp(np.log1p(-0.3), np.log(0.3) + (x - 0.5) / 4.0).sum(1)
  np.testing.assert_allclose(got, want, rtol=1e-12)


def _cheap(monkeypatch):
  """A stand-in for the row's tests (about 0.1 s a draw): flag when the IN mean exceeds the
  OUT mean by 1.2 (the bisection's logic, not the statistic, is under test)."""
  def verdict(ins, outs, design):
    gap = float(np.mean(ins) - np.mean(outs))
    return {'best': gap, 'free': gap / 2, 'flagged': gap > 1.2}
  monkeypatch.setattr(ap, 'verdict', verdict)


@pytest.mark.parametrize('factors', [ap.FACTORS, (0.2, 0.5, 0.9)])
def test_the_detected_factor_is_where_the_detection_rate_crosses_95(monkeypatch, factors):
  _cheap(monkeypatch)
  design = ap.Design(40, 40, 'update_dp', 1.0, DELTA, 0.95, True)
  hits = {f: ap.detection(CURVE, design, f, draws=20, seed=9) for f in factors}
  assert all(hits[a] >= hits[b] for a, b in zip(sorted(hits), sorted(hits)[1:]))  # monotone
  ok = [f for f in sorted(hits) if hits[f] >= 19]
  got = ap.detectable_factor(CURVE, design, factors=factors, draws=20, seed=9)
  assert got['power_factor'] == max(ok) and got['power_hits'] == hits[max(ok)] >= 19
  assert got['power_draws'] == 20 and got['power_level'] == 0.95
  assert got['power_rate_ci_low'] == ap.rate_interval(got['power_hits'], 20)[0]
  up = [f for f in sorted(hits) if f > max(ok)]
  if up:
    assert got['power_next_factor'] == up[0] and got['power_next_hits'] == hits[up[0]] < 19
  else:
    assert math.isnan(got['power_next_factor']) and got['power_next_hits'] == -1
  for item in got['power_curve'].split(';'):
    f, rate = item.split(':')
    assert rate == f'{hits[float(f)]}/20'


def test_19_of_20_is_a_detection_and_18_is_not(monkeypatch):
  table = {0.1: 20, 0.2: 19, 0.3: 18, 0.4: 3}
  monkeypatch.setattr(ap, 'detection', lambda c, d, f, draws, seed: table[f])
  got = ap.detectable_factor(CURVE, DESIGN, factors=tuple(table), draws=20)
  assert (got['power_factor'], got['power_hits']) == (0.2, 19)
  assert (got['power_next_factor'], got['power_next_hits']) == (0.3, 18)
  # At level 0.9 of 20 draws, 18 is enough.
  got = ap.detectable_factor(CURVE, DESIGN, factors=tuple(table), draws=20, level=0.9)
  assert (got['power_factor'], got['power_hits']) == (0.3, 18)


def test_nothing_detected_and_everything_detected_are_reported(monkeypatch):
  _cheap(monkeypatch)
  design = ap.Design(40, 40, 'update_dp', 1.0, DELTA, 0.95, True)
  weak = cs.Curve(steps=1, noise=50.0, relation='replace_one')
  none = ap.detectable_factor(weak, design, factors=(0.5, 0.9), draws=20, seed=1)
  assert math.isnan(none['power_factor']) and none['power_hits'] == -1
  assert math.isnan(none['power_rate_ci_low'])
  assert none['power_next_factor'] == 0.5 and none['power_next_hits'] < 19
  strong = cs.Curve(steps=1, noise=0.2, relation='replace_one')
  every = ap.detectable_factor(strong, design, factors=(0.5, 0.9), draws=20, seed=1)
  assert every['power_factor'] == 0.9 and every['power_hits'] == 20
  assert math.isnan(every['power_next_factor'])
  for bad in ((), (0.5, 1.0), (0.0, 0.5)):
    with pytest.raises(ValueError, match='noise factors must lie in'):
      ap.detectable_factor(CURVE, design, factors=bad)
  with pytest.raises(ValueError, match='draws must be >= 1'):
    ap.detectable_factor(CURVE, design, draws=0)


def test_the_optimum_is_the_median_of_its_draws_with_an_order_statistic_interval(monkeypatch):
  _cheap(monkeypatch)
  design = ap.Design(40, 40, 'update_dp', 1.0, DELTA, 0.95, True)
  got = ap.optimum(CURVE, design, draws=20, seed=4, observed=1.0)
  draws = [ap._draw(CURVE, design, 4, d) for d in range(20)]   # pylint: disable=protected-access
  best = np.sort([d['best'] for d in draws])
  assert got['simulated_bound'] == pytest.approx(np.median(best))
  assert (got['simulated_bound_ci_low'], got['simulated_bound_ci_high']) == (best[5], best[14])
  assert got['simulated_bound_free'] == pytest.approx(np.median(best) / 2)
  assert got['simulated_draws'] == 20
  assert got['simulated_false_alarms'] == sum(d['flagged'] for d in draws)
  assert got['simulated_below_observed'] == int(np.sum(best < 1.0))
  assert 'simulated_below_observed' not in ap.optimum(CURVE, design, draws=3, seed=4)


@pytest.mark.parametrize('n,want', [(20, (6, 15)), (9, (2, 8)), (5, None)])
def test_median_interval_is_the_binomial_order_statistics(n, want):
  v = np.arange(1.0, n + 1)[::-1]
  lo, hi = ap.median_interval(v)
  if want is None:
    assert math.isnan(lo) and math.isnan(hi)
  else:
    assert (lo, hi) == want
    k = want[0]
    assert sps.binom.cdf(k - 1, n, 0.5) <= 0.025 < sps.binom.cdf(k, n, 0.5)


def test_rate_interval_is_clopper_pearson():
  assert ap.rate_interval(20, 20)[1] == 1.0 and ap.rate_interval(0, 20)[0] == 0.0
  lo, hi = ap.rate_interval(19, 20)
  assert lo == pytest.approx(sps.beta.ppf(0.025, 19, 2)) and hi == pytest.approx(
      sps.beta.ppf(0.975, 20, 1))


def test_a_draws_free_bound_is_the_audits_assumption_free_headline():
  rng = np.random.default_rng(8)
  world = np.arange(200) % 2 == 0
  s = rng.normal(size=200) + np.where(world, 1.5, -1.5)
  design = ap.Design(100, 100, 'update_dp', 50.0, DELTA, 0.95, True, midpoint=0.0)
  got = ap.verdict(s[world], s[~world], design)
  m = cs.audit(s, world, 'update_dp', 50.0, delta=DELTA, confidence=0.95, independent=True,
               midpoint=0.0, reach=False, report_all=False)
  assert got['free'] == m['certified_free'] < got['best'] == m['best_bound']
  assert got['flagged'] is False
