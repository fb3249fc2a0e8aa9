"""The DP audit's verdict (`fl_privacy.attacks.audit.dp_canary`): family-wise confidence.

`claim_metrics` takes the largest of the k counted bounds, so each enters the verdict at
1 - (1 - c) / k (Bonferroni over the counted bounds); the per-bound values at c are reported
beside it and never decide the verdict.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fl_privacy.attacks.audit import dp_canary
from fl_privacy.eval import auditing


def _gaussian_games(seed=0, n=3000, mu=1.0):
  rng = np.random.default_rng(seed)
  bits = rng.random(n) < 0.5
  scores = rng.normal(size=n) + mu * bits
  return scores[bits], scores[~bits]


@pytest.mark.parametrize('mechanism,k', [('gaussian', 4), ('update_dp', 4),
                                         ('dp_sgd_poisson', 2), ('ldp_sgd', 2)])
@pytest.mark.parametrize('confidence', [0.95, 0.9])
def test_each_counted_bound_is_at_one_minus_significance_over_k(mechanism, k, confidence):
  assert len(dp_canary.counted_bounds(mechanism)) == k
  assert dp_canary.verdict_bound_confidence(confidence, mechanism) == pytest.approx(
      1 - (1 - confidence) / k, rel=1e-15)


def test_claim_metrics_verdict_uses_the_corrected_bounds_and_reports_both():
  ins, outs = _gaussian_games()
  m = dp_canary.claim_metrics(ins, outs, 'gaussian', 4.0, delta=1e-5, confidence=0.95)
  each = auditing.audit_scores(ins, outs, delta=1e-5, confidence=0.95)
  corrected = auditing.audit_scores(ins, outs, delta=1e-5, confidence=1 - 0.05 / 4)
  for key in dp_canary.BOUNDS:
    # Reported beside: every bound at 95% on its own.
    assert m[key] == pytest.approx(each[key], rel=1e-12), key
    # Behind the verdict: every counted bound at 98.75%.
    assert m[f'verdict_{key}'] == pytest.approx(corrected[key], rel=1e-12), key
  # GDP tests every threshold, so its stricter level gives a smaller bound; under 'split'
  # the others may choose another threshold at the stricter level and come out either way.
  assert 0 < m['verdict_epsilon_gdp'] < m['epsilon_gdp']
  assert m['best_bound'] == max(corrected[k] for k in dp_canary.BOUNDS)
  assert m['verdict_rule'] == 'bonferroni_counted'
  assert m['verdict_confidence'] == 0.95
  assert m['verdict_bound_confidence'] == pytest.approx(0.9875)
  assert m['tightness'] == m['best_bound'] / 4.0


def test_non_gaussian_verdict_counts_two_bounds_and_skips_the_fdp_search():
  ins, outs = _gaussian_games(1, 2000)
  m = dp_canary.claim_metrics(ins, outs, 'ldp_sgd', 4.0, delta=1e-5, confidence=0.95)
  assert {k for k in m if k.startswith('verdict_epsilon')} == {
      'verdict_epsilon_cp', 'verdict_epsilon_one_run'}
  corrected = auditing.audit_scores(ins, outs, delta=1e-5, confidence=0.975, fdp=False)
  assert m['best_bound'] == max(corrected['epsilon_cp'], corrected['epsilon_one_run'])
  assert m['verdict_bound_confidence'] == pytest.approx(0.975)
  assert math.isnan(m['epsilon_gdp_if_gaussian'])


def test_violation_is_decided_at_family_wise_confidence(monkeypatch):
  # Four bounds that each clear the claim only at their own 95% (the old rule: max of
  # them = 1.2 > 1), and fall below it at 98.75%: no violation at family-wise 95%.
  def fake(in_scores, out_scores, *, delta, confidence, fdp=True, **unused):
    del in_scores, out_scores, delta, fdp
    top = 1.2 if confidence < 0.96 else 0.9
    return {'epsilon_cp': top - 0.3, 'gdp_mu': 1.0, 'epsilon_gdp': top,
            'epsilon_one_run': top - 0.5, 'epsilon_one_run_fdp': top - 0.1,
            'n_in': 1, 'n_out': 1}
  monkeypatch.setattr(dp_canary.auditing, 'audit_scores', fake)
  m = dp_canary.claim_metrics(np.ones(3), np.zeros(3), 'gaussian', 1.0, delta=1e-5,
                              confidence=0.95)
  assert m['epsilon_gdp'] == 1.2 and m['verdict_epsilon_gdp'] == 0.9
  assert m['best_bound'] == 0.9
  assert m['privacy_violation'] == 0.0
  m = dp_canary.claim_metrics(np.ones(3), np.zeros(3), 'gaussian', 0.8, delta=1e-5,
                              confidence=0.95)
  assert m['privacy_violation'] == 1.0


def test_best_bound_reads_only_the_verdict_values():
  metrics = {'epsilon_cp': 9.0, 'epsilon_gdp': 8.0, 'verdict_epsilon_cp': 1.0,
             'verdict_epsilon_gdp': 2.0, 'verdict_epsilon_one_run': float('nan')}
  assert dp_canary.best_bound(metrics, 'gaussian') == 2.0
  # epsilon_gdp is not counted for LDP-SGD: its verdict value is ignored there.
  assert dp_canary.best_bound(metrics, 'ldp_sgd') == 1.0
  assert dp_canary.best_bound({'epsilon_cp': 5.0}, 'gaussian') == 0.0
