"""The utility metrics of recorded PASTEL trainings, alone and pooled over replicates."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fl_privacy.eval import stats
from fl_privacy.eval import utility


def _arrays(test_correct, member_correct, local, jsd):
  return dict(num_test=100, test_correct=test_correct, member_correct=member_correct,
              num_members=50, local_test_correct=np.asarray(local), dp_epsilon=math.nan,
              dp_epsilon_per_round=math.nan, noise_multiplier=math.nan, clip_fraction=math.nan,
              jsd_last_round=jsd, upload_norm_median=1.0)


def test_one_training_by_hand():
  m = utility.training_metrics(_arrays(90, 49, [80, 70], 0.25))
  assert m['accuracy'] == 0.9
  assert (m['accuracy_ci_low'], m['accuracy_ci_high']) == stats.clopper_pearson(90, 100)
  assert m['local_accuracy_mean'] == 0.75 and m['member_accuracy'] == 0.98
  assert m['generalization_gap'] == pytest.approx(0.08)
  assert m['jsd_last_round'] == 0.25


def test_replicates_pool_their_counts_and_average_their_diagnostics():
  a, b = _arrays(90, 49, [80, 70], 0.25), _arrays(80, 45, [60, 50], 0.75)
  m = utility.pooled_training_metrics([a, b])
  assert m['accuracy'] == 170 / 200
  assert (m['accuracy_ci_low'], m['accuracy_ci_high']) == stats.clopper_pearson(170, 200)
  assert m['local_accuracy_mean'] == pytest.approx((80 + 70 + 60 + 50) / 4 / 100)
  assert m['member_accuracy'] == 94 / 100
  assert m['generalization_gap'] == pytest.approx(0.94 - 0.85)
  assert m['jsd_last_round'] == 0.5 and math.isnan(m['dp_epsilon'])
  assert utility.pooled_training_metrics([a]) == utility.training_metrics(a)
