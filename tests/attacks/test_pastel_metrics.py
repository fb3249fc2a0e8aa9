"""PASTEL's attack metrics state the distinct negatives behind each low-FPR TPR."""

from __future__ import annotations

import numpy as np
import pytest

from fl_privacy.attacks.passive import pastel


def test_tpr_at_low_fpr_with_the_negatives_behind_it():
  # 200 non-members scored 0..199, 10 members 195.5..204.5. At 1% FPR two non-members (198,
  # 199) may pass: the threshold lets 8 members through; at 0.1% none may: 6 members pass.
  neg, pos = np.arange(200.0), 195.5 + np.arange(10.0)
  m = pastel.attack_metrics(np.r_[pos, neg], np.r_[np.ones(10), np.zeros(200)])
  assert (m['n_pos'], m['n_neg']) == (10, 200)
  assert m['attack_auc_ci_low'] < m['attack_auc'] < m['attack_auc_ci_high']
  assert m['attack_auc'] == pytest.approx(1 - (4 + 3 + 2 + 1) / 2000)  # 195.5 .. 198.5 lose
  assert 0.0 < m['log_auc'] <= 1.0 and m['n_neg_distinct'] == 200
  assert m['tpr_at_fpr_1e-2'] == 0.8 and m['tpr_at_fpr_1e-2_distinct_negatives'] == 2
  assert m['tpr_at_fpr_1e-3'] == 0.6 and m['tpr_at_fpr_1e-3_distinct_negatives'] == 0
  assert m['tpr_at_fpr_1e-3_ci_low'] < 0.6 < m['tpr_at_fpr_1e-3_ci_high']
