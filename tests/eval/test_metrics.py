"""Tests of the attack metrics against scikit-learn and brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from sklearn import metrics as skm

from fl_privacy.eval import metrics


def _scores(seed, n=300, ties=False):
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 2, size=n)
  scores = rng.normal(size=n) + 0.8 * labels
  if ties:
    scores = np.round(scores, 0)  # a handful of distinct values: many ties
  return scores, labels


def test_tpr_tnr_adv_counts_and_rates():
  labels = np.array([1] * 10 + [0] * 20)
  decisions = np.array([1] * 7 + [0] * 3 + [1] * 5 + [0] * 15)
  m = metrics.tpr_tnr_adv(decisions, labels)
  assert (m['tp'], m['fn'], m['fp'], m['tn']) == (7, 3, 5, 15)
  assert (m['n_pos'], m['n_neg']) == (10, 20)
  assert m['tpr'] == pytest.approx(0.7) and m['tnr'] == pytest.approx(0.75)
  assert m['fpr'] == pytest.approx(0.25) and m['fnr'] == pytest.approx(0.3)
  assert m['adv'] == pytest.approx((0.7 + 0.75) / 2)
  assert m['tpr_minus_fpr'] == pytest.approx(0.45)
  for name in ('tpr', 'tnr', 'fpr', 'fnr', 'adv', 'tpr_minus_fpr'):
    assert m[f'{name}_ci_low'] <= m[name] <= m[f'{name}_ci_high']


def test_adv_interval_covers_truth_by_monte_carlo():
  rng = np.random.default_rng(5)
  tpr, tnr, n = 0.6, 0.8, 80
  labels = np.r_[np.ones(n), np.zeros(n)].astype(bool)
  covered = 0
  for _ in range(500):
    dec = np.r_[rng.random(n) < tpr, rng.random(n) >= tnr]
    m = metrics.tpr_tnr_adv(dec, labels)
    covered += m['adv_ci_low'] <= (tpr + tnr) / 2 <= m['adv_ci_high']
  assert covered / 500 >= 0.93


@pytest.mark.parametrize('seed,ties', [(0, False), (1, True), (2, True)])
def test_roc_curve_matches_sklearn(seed, ties):
  scores, labels = _scores(seed, ties=ties)
  fpr, tpr, thr = metrics.roc_curve(scores, labels)
  want_fpr, want_tpr, want_thr = skm.roc_curve(labels, scores,
                                               drop_intermediate=False)
  np.testing.assert_allclose(fpr, want_fpr)
  np.testing.assert_allclose(tpr, want_tpr)
  np.testing.assert_array_equal(thr[1:], want_thr[1:])


@pytest.mark.parametrize('seed,ties', [(3, False), (4, True), (5, True)])
def test_roc_auc_matches_sklearn(seed, ties):
  scores, labels = _scores(seed, ties=ties)
  assert metrics.roc_auc(scores, labels) == pytest.approx(
      skm.roc_auc_score(labels, scores), abs=1e-12)


def test_roc_auc_all_tied_is_half():
  assert metrics.roc_auc(np.zeros(10), np.arange(10) % 2) == 0.5


def _brute_tpr_at_fpr(scores, labels, target):
  best = 0.0
  for t in np.r_[np.inf, np.unique(scores)]:
    pred = scores >= t
    fpr = np.mean(pred[labels == 0])
    if fpr <= target:
      best = max(best, np.mean(pred[labels == 1]))
  return best


@pytest.mark.parametrize('seed,ties', [(6, False), (7, True)])
def test_tpr_at_fpr_is_best_admissible_threshold(seed, ties):
  scores, labels = _scores(seed, n=400, ties=ties)
  targets = [0.0, 0.001, 0.01, 0.1, 0.5, 1.0]
  got = metrics.tpr_at_fpr(scores, labels, targets)
  for target, value in zip(targets, got):
    assert value == pytest.approx(_brute_tpr_at_fpr(scores, labels, target))
  assert isinstance(metrics.tpr_at_fpr(scores, labels, 0.1), float)


def _numeric_log_auc(scores, labels, min_fpr=1e-3):
  fpr, tpr, _ = metrics.roc_curve(scores, labels)
  u = np.linspace(math.log10(min_fpr), 0.0, 400_001)
  # fpr is non-decreasing; repeated values (vertical steps) only matter on a
  # set of measure zero.
  vals = np.interp(10 ** u, fpr, tpr)
  return np.trapezoid(vals, u) / -math.log10(min_fpr)


def test_log_auc_limits():
  labels = np.arange(20) % 2
  assert metrics.log_auc(labels.astype(float), labels) == pytest.approx(1.0)
  chance = (1 - 1e-3) / (3 * math.log(10))
  assert metrics.log_auc(np.zeros(20), labels) == pytest.approx(chance)


@pytest.mark.parametrize('seed,ties', [(8, False), (9, True)])
def test_log_auc_matches_numeric_integral(seed, ties):
  scores, labels = _scores(seed, n=2000, ties=ties)
  assert metrics.log_auc(scores, labels) == pytest.approx(
      _numeric_log_auc(scores, labels), abs=2e-4)


def _union_area(boxes):
  """Exact area of a union of axis-aligned boxes [x0,x1]x[y0,y1] on a grid."""
  xs = np.unique([b[0] for b in boxes] + [b[1] for b in boxes])
  ys = np.unique([b[2] for b in boxes] + [b[3] for b in boxes])
  area = 0.0
  for (xa, xb), (ya, yb) in itertools.product(zip(xs[:-1], xs[1:]),
                                              zip(ys[:-1], ys[1:])):
    cx, cy = (xa + xb) / 2, (ya + yb) / 2
    if any(b[0] <= cx <= b[1] and b[2] <= cy <= b[3] for b in boxes):
      area += (xb - xa) * (yb - ya)
  return area


def test_hypervolume_single_and_two_points():
  assert metrics.hypervolume([[0.2, 30.0]], (1.0, 100.0)) == pytest.approx(
      0.8 * 70)
  two = metrics.hypervolume([[0.2, 30.0], [0.5, 10.0]], (1.0, 100.0))
  assert two == pytest.approx(0.8 * 70 + 0.5 * 90 - 0.5 * 70)


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_hypervolume_matches_union_of_boxes(seed):
  rng = np.random.default_rng(seed)
  pts = rng.uniform(0, 1.2, size=(12, 2))  # some beyond the reference
  ref = np.array([1.0, 1.0])
  inside = pts[np.all(pts < ref, axis=1)]
  boxes = [(x, ref[0], y, ref[1]) for x, y in inside]
  assert metrics.hypervolume(pts, ref) == pytest.approx(_union_area(boxes))


def test_hypervolume_maximize_flips_orientation():
  # (privacy leakage: minimise, accuracy: maximise) == (leakage, 1 - accuracy).
  rng = np.random.default_rng(3)
  pts = rng.uniform(0, 1, size=(10, 2))
  flipped = np.c_[pts[:, 0], 1 - pts[:, 1]]
  assert metrics.hypervolume(pts, (1.0, 0.0), maximize=(False, True)) == (
      pytest.approx(metrics.hypervolume(flipped, (1.0, 1.0))))
  assert metrics.hypervolume([[2.0, 0.5]], (1.0, 1.0)) == 0.0
  assert metrics.hypervolume(np.zeros((0, 2)), (1.0, 1.0)) == 0.0


def _delong_variance_direct(scores, labels):
  """O(n_pos * n_neg) DeLong variance straight from the definition (independent check)."""
  s = np.asarray(scores, dtype=np.float64)
  y = np.asarray(labels).astype(bool)
  pos, neg = s[y], s[~y]
  psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
  v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
  return psi.mean(), np.var(v10, ddof=1) / len(pos) + np.var(v01, ddof=1) / len(neg)


@pytest.mark.parametrize('seed,ties', itertools.product(range(4), (False, True)))
def test_auc_interval_matches_sklearn_and_direct_delong(seed, ties):
  rng = np.random.default_rng(seed)
  n = 300
  labels = rng.integers(0, 2, n)
  scores = rng.normal(size=n) + 0.7 * labels
  if ties:
    scores = np.round(scores, 1)
  auc, low, high = metrics.auc_interval(scores, labels)
  assert auc == pytest.approx(skm.roc_auc_score(labels, scores), abs=1e-12)
  direct_auc, var = _delong_variance_direct(scores, labels)
  assert auc == pytest.approx(direct_auc, abs=1e-12)
  half = 1.959963984540054 * math.sqrt(var)
  assert low == pytest.approx(max(0.0, auc - half), abs=1e-10)
  assert high == pytest.approx(min(1.0, auc + half), abs=1e-10)


def test_auc_interval_width_agrees_with_bootstrap():
  rng = np.random.default_rng(7)
  labels = np.r_[np.ones(200), np.zeros(400)].astype(int)
  scores = rng.normal(size=600) + 0.8 * labels
  _, low, high = metrics.auc_interval(scores, labels)
  pos, neg = np.flatnonzero(labels == 1), np.flatnonzero(labels == 0)
  boot = []
  for _ in range(400):
    idx = np.r_[rng.choice(pos, pos.size), rng.choice(neg, neg.size)]
    boot.append(skm.roc_auc_score(labels[idx], scores[idx]))
  # The bootstrap sd estimates DeLong's sd; 400 resamples give it to about +-4%.
  assert (high - low) / 2 == pytest.approx(1.96 * np.std(boot), rel=0.15)


def test_auc_interval_edges():
  assert metrics.auc_interval([1, 2, 3, 4], [0, 0, 1, 1]) == (1.0, 1.0, 1.0)
  auc, low, high = metrics.auc_interval(np.zeros(10), np.r_[np.ones(5), np.zeros(5)])
  assert auc == 0.5 and low == high == 0.5
  with pytest.raises(ValueError):
    metrics.auc_interval([1, 2], [1, 1])


def test_auc_difference_interval_is_delongs_paired_formula():
  """Against brute-force structural components and var(A) + var(B) - 2 cov(A, B)."""
  from scipy import stats as sstats  # pylint: disable=g-import-not-at-top
  from fl_privacy.eval import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  labels = np.r_[np.ones(30), np.zeros(40)].astype(int)
  a = rng.normal(size=70) + 0.8 * labels
  b = a + rng.normal(scale=0.7, size=70)  # correlated with a: pairing narrows the interval
  b[:5] = b[5]  # ties count one half

  def comps(s):
    pos, neg = s[labels == 1], s[labels == 0]
    cmp = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    return cmp.mean(1), cmp.mean(0)

  (a10, a01), (b10, b01) = comps(a), comps(b)
  s10, s01 = np.cov(a10, b10), np.cov(a01, b01)
  var = (s10[0, 0] + s10[1, 1] - 2 * s10[0, 1]) / 30 + (s01[0, 0] + s01[1, 1] - 2 * s01[0, 1]) / 40
  d, lo, hi = metrics_lib.auc_difference_interval(a, b, labels)
  assert d == pytest.approx(a10.mean() - b10.mean(), abs=1e-12)
  half = sstats.norm.ppf(0.975) * np.sqrt(var)
  assert (lo, hi) == (pytest.approx(d - half, abs=1e-12), pytest.approx(d + half, abs=1e-12))
  # Narrower than the two separate intervals combined as if independent.
  _, la, ha = metrics_lib.auc_interval(a, labels)
  _, lb, hb = metrics_lib.auc_interval(b, labels)
  assert hi - lo < np.hypot(ha - la, hb - lb)
  assert metrics_lib.auc_difference_interval(a, a, labels) == (0.0, 0.0, 0.0)
