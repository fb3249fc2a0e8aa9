"""Edges of the attack metrics that plausible bugs would move: interval levels, ties, messages.

Written against mutation testing (tools/mutation.sh): each test pins a number or a message that
an off-by-one, a dropped argument or a flipped operator would change.
"""

from __future__ import annotations

import numpy as np
import pytest

from fl_privacy.eval import metrics
from fl_privacy.eval import stats


@pytest.mark.parametrize('confidence', [0.95, 0.8])
def test_adv_interval_is_the_bonferroni_combination_at_the_given_level(confidence):
  d = np.array([1] * 30 + [0] * 10 + [1] * 7 + [0] * 53)
  y = np.array([1] * 40 + [0] * 60)
  m = metrics.tpr_tnr_adv(d, y, confidence)
  each = 1 - (1 - confidence) / 2
  (tpr_lo, tpr_hi) = stats.clopper_pearson(30, 40, each)
  (tnr_lo, tnr_hi) = stats.clopper_pearson(53, 60, each)
  assert m['adv_ci_low'] == pytest.approx((tpr_lo + tnr_lo) / 2, rel=1e-12)
  assert m['adv_ci_high'] == pytest.approx((tpr_hi + tnr_hi) / 2, rel=1e-12)
  assert m['tpr_minus_fpr_ci_low'] == pytest.approx(tpr_lo - (1 - tnr_lo), rel=1e-12)
  assert m['tpr_minus_fpr_ci_high'] == pytest.approx(tpr_hi - (1 - tnr_hi), rel=1e-12)
  # The single rates carry plain two-sided intervals at `confidence`.
  for name, k, n in (('tpr', 30, 40), ('tnr', 53, 60), ('fpr', 7, 60), ('fnr', 10, 40)):
    assert (m[f'{name}_ci_low'], m[f'{name}_ci_high']) == stats.clopper_pearson(k, n, confidence)


def test_inputs_are_flattened_and_checked():
  m = metrics.tpr_tnr_adv(np.array([[1, 0], [1, 1]]), np.array([[1, 0], [0, 1]]))
  assert (m['tp'], m['fp'], m['tn'], m['fn']) == (2, 1, 1, 0)
  with pytest.raises(ValueError, match='decisions must be 0/1 or bool'):
    metrics.tpr_tnr_adv([0, 2], [0, 1])
  with pytest.raises(ValueError, match='labels must be 0/1 or bool'):
    metrics.tpr_tnr_adv([0, 1], [0, 2])
  with pytest.raises(ValueError, match=r'decisions \(3,\) and labels \(2,\) differ'):
    metrics.tpr_tnr_adv([0, 1, 1], [0, 1])
  # bool labels skip the 0/1 check (they are 0/1 by type).
  assert metrics.tpr_tnr_adv(np.array([True, False]), np.array([True, False]))['adv'] == 1.0


def test_roc_curve_edges_and_messages():
  fpr, tpr, thr = metrics.roc_curve(np.array([[0.9, 0.1], [0.5, 0.5]]),
                                    np.array([[1, 0], [1, 0]]))
  np.testing.assert_allclose(fpr, [0, 0, 0.5, 1])
  np.testing.assert_allclose(tpr, [0, 0.5, 1, 1])
  np.testing.assert_allclose(thr, [np.inf, 0.9, 0.5, 0.1])
  # Exactly one positive (or negative) is enough.
  assert metrics.roc_auc([0.2, 0.9, 0.1], [0, 1, 0]) == 1.0
  assert metrics.roc_auc([0.2, 0.9, 0.1], [1, 0, 1]) == 0.0
  with pytest.raises(ValueError, match='^roc_curve needs both positive and negative labels$'):
    metrics.roc_curve([0.1, 0.2], [0, 0])
  with pytest.raises(ValueError, match='^roc_curve needs both positive and negative labels$'):
    metrics.roc_curve([0.1, 0.2], [1, 1])
  with pytest.raises(ValueError, match='^scores contain NaN$'):
    metrics.roc_curve([0.1, np.nan], [0, 1])
  with pytest.raises(ValueError, match=r'scores \(3,\) and labels \(2,\) differ'):
    metrics.roc_curve([0.1, 0.2, 0.3], [0, 1])


def test_log_auc_bounds():
  for bad in (0.0, 1.0, 1.5):
    with pytest.raises(ValueError, match=r'min_fpr must be in \(0, 1\)'):
      metrics.log_auc([0.1, 0.9], [0, 1], min_fpr=bad)


def test_tpr_at_fpr_hits_grid_points_despite_rounding_and_returns_floats():
  # A target exactly on an ROC point (3 of 10 negatives) must reach it, not the point before.
  neg = np.arange(10, dtype=float)          # scores 0..9
  pos = np.array([9.5, 8.5, 6.5, 0.5])      # ROC: (.1, .25) (.2, .5) (.3, .5) (.3, .75) ...
  scores = np.r_[neg, pos]
  labels = np.r_[np.zeros(10), np.ones(4)]
  got = metrics.tpr_at_fpr(scores, labels, 0.3)
  assert isinstance(got, float) and got == 0.75
  assert metrics.tpr_at_fpr(scores, labels, 0.25) == 0.5
  np.testing.assert_allclose(metrics.tpr_at_fpr(scores, labels, [0.0, 0.3, 1.0]), [0.25, 0.75, 1])
  assert metrics.tpr_at_fpr(scores, labels, 0.2999) == 0.5
  for bad in (-0.1, 1.1):
    with pytest.raises(ValueError, match=r'fpr targets must be in \[0, 1\]'):
      metrics.tpr_at_fpr(scores, labels, bad)
  with pytest.raises(ValueError, match=r'fpr targets must be in \[0, 1\]'):
    metrics.tpr_at_fpr(scores, labels, [0.5, 1.5])


def test_hypervolume_messages():
  with pytest.raises(ValueError, match='maximize needs 2 entries'):
    metrics.hypervolume([[0.5, 0.5]], (1, 1), maximize=(True,))
