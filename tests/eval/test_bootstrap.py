"""Cluster bootstrap of TPR at low FPR: equal to resampling by copying entries, coverage on
clustered synthetic data, and the distinct-negatives count."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from fl_privacy.eval import bootstrap
from fl_privacy.eval import metrics


def _small(rng, n_groups=12, ties=False):
  sizes = rng.integers(1, 5, size=n_groups)
  groups = np.repeat(np.arange(n_groups) * 7 + 3, sizes)  # ids need not be 0 .. G - 1
  labels = rng.integers(0, 2, size=groups.size)
  scores = rng.normal(size=groups.size) + labels
  if ties:
    scores = np.round(scores)
  perm = rng.permutation(groups.size)
  return scores[perm], labels[perm], groups[perm]


@pytest.mark.parametrize('ties', [False, True])
def test_weights_equal_copying_the_entries(ties):
  rng = np.random.default_rng(0)
  scores, labels, groups = _small(rng, ties=ties)
  ids = np.unique(groups)
  counts = rng.integers(0, 3, size=(40, ids.size))
  for fpr in (0.0, 0.05, 0.2, 0.5, 1.0):
    got = bootstrap.resampled_tpr_at_fpr(scores, labels, groups, fpr, counts)
    for b in range(counts.shape[0]):
      take = np.concatenate([np.repeat(np.flatnonzero(groups == g), c)
                             for g, c in zip(ids, counts[b])])
      if labels[take].all() or not labels[take].any():
        assert math.isnan(got[b])
        continue
      assert got[b] == metrics.tpr_at_fpr(scores[take], labels[take], fpr)


def test_unit_counts_give_the_data_and_point_is_the_data():
  rng = np.random.default_rng(1)
  scores, labels, groups = _small(rng, n_groups=30)
  ones = np.ones((1, 30), int)
  for fpr in (0.01, 0.1, 0.3):
    want = metrics.tpr_at_fpr(scores, labels, fpr)
    assert bootstrap.resampled_tpr_at_fpr(scores, labels, groups, fpr, ones)[0] == want
    point, low, high = bootstrap.tpr_at_fpr_interval(scores, labels, groups, fpr,
                                                     rng=np.random.default_rng(2),
                                                     num_resamples=200)
    assert point == want and low <= high


def _clustered(rng, num_pos=300, num_neg_queries=300, entries=5, tau=1.0, sigma=0.5, mu=1.5):
  """Members: one entry per query. Non-members: `entries` per query sharing the query's
  difficulty (as a test query scored against every target), intra-cluster correlation
  tau^2 / (tau^2 + sigma^2) = 0.8."""
  pos = tau * rng.normal(size=num_pos) + mu + sigma * rng.normal(size=num_pos)
  neg = tau * rng.normal(size=(num_neg_queries, 1)) + sigma * rng.normal(
      size=(num_neg_queries, entries))
  scores = np.r_[pos, neg.ravel()]
  labels = np.r_[np.ones(num_pos, int), np.zeros(neg.size, int)]
  groups = np.r_[np.arange(num_pos), num_pos + np.repeat(np.arange(num_neg_queries), entries)]
  return scores, labels, groups


def test_cluster_bootstrap_covers_the_true_tpr_and_the_entry_bootstrap_is_too_narrow():
  tau, sigma, mu, fpr = 1.0, 0.5, 1.5, 0.05
  spread = math.hypot(tau, sigma)  # both classes are Gaussian with this sd
  truth = float(special.ndtr(mu / spread - special.ndtri(1 - fpr)))  # 0.381
  rng = np.random.default_rng(3)
  experiments = 150
  covered, width, entry_width, points = 0, [], [], []
  for _ in range(experiments):
    scores, labels, groups = _clustered(rng)
    point, low, high = bootstrap.tpr_at_fpr_interval(scores, labels, groups, fpr, rng=rng,
                                                     num_resamples=300)
    covered += low <= truth <= high
    width.append(high - low)
    points.append(point)
    _, low, high = bootstrap.tpr_at_fpr_interval(scores, labels, np.arange(scores.size), fpr,
                                                 rng=rng, num_resamples=300)
    entry_width.append(high - low)
  # Coverage of a 95% interval, 3 binomial sd below for 150 experiments.
  assert covered / experiments >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / experiments)
  # Its width matches the estimator's spread across experiments (whose relative error is
  # 1 / sqrt(2 * 149) = 6%): within 25%.
  ideal = 2 * 1.96 * np.std(points, ddof=1)
  assert 0.75 < np.mean(width) / ideal < 1.25
  # Treating the 1500 entries as independent ignores the clusters of non-members (design
  # effect 1 + 4 * 0.8 on the threshold): narrower, on the same data.
  assert np.mean(entry_width) < 0.9 * np.mean(width)


def test_distinct_negatives_by_hand():
  # Non-members of query 7 appear three times (three targets), query 8 once.
  scores = np.array([5.0, 4.0, 3.9, 3.9, 3.9, 3.0, 2.0, 1.0, 0.5, 0.4, 0.3, 0.2])
  labels = np.array([1, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0])
  groups = np.array([1, 2, 7, 7, 7, 3, 8, 4, 9, 10, 11, 12])
  # 8 non-members. FPR 0: threshold 4.0 (TPR 2/4), no false positive.
  assert bootstrap.distinct_negatives(scores, labels, groups, 0.0) == 0
  # FPR <= 3/8 reaches 3.9 (the three copies of query 7) and 3.0: one distinct query.
  assert bootstrap.distinct_negatives(scores, labels, groups, 3 / 8) == 1
  assert metrics.tpr_at_fpr(scores, labels, 3 / 8) == 0.75
  # FPR <= 4/8 adds query 8 and the member at 1.0: two distinct queries behind 4 entries.
  assert bootstrap.distinct_negatives(scores, labels, groups, 0.5) == 2
  assert bootstrap.distinct_negatives(scores, labels, groups, 1.0) == 6


def test_several_fprs_share_the_resamples_and_equal_one_at_a_time():
  rng = np.random.default_rng(7)
  scores, labels, groups = _clustered(rng, num_pos=80, num_neg_queries=120, entries=4)
  fprs = [0.01, 0.05, 0.2]
  both = bootstrap.tpr_at_fpr_interval(scores, labels, groups, fprs,
                                       rng=np.random.default_rng(8), num_resamples=150)
  assert len(both) == 3
  for f, got in zip(fprs, both):
    one = bootstrap.tpr_at_fpr_interval(scores, labels, groups, f,
                                        rng=np.random.default_rng(8), num_resamples=150)
    assert got == one
  counts = np.random.default_rng(9).multinomial(200, np.full(200, 1 / 200), size=30)
  stacked = bootstrap.resampled_tpr_at_fpr(scores, labels, groups, fprs, counts)
  assert stacked.shape == (3, 30)
  for f, row in zip(fprs, stacked):
    np.testing.assert_array_equal(row, bootstrap.resampled_tpr_at_fpr(scores, labels, groups,
                                                                      f, counts))


def test_low_fpr_prefix_and_its_fallback_equal_copying_the_entries():
  """At a low FPR only the top of the ranking is summed; a resample whose weighted false
  positives stay below the FPR within that top (here: every non-member group near the top
  dropped) is redone on all entries. Both equal resampling by copying."""
  rng = np.random.default_rng(10)
  scores, labels, groups = _clustered(rng, num_pos=400, num_neg_queries=600, entries=5)
  ids = np.unique(groups)
  counts = rng.multinomial(ids.size, np.full(ids.size, 1 / ids.size), size=12)
  top_neg = np.unique(groups[(labels == 0) & (scores > np.quantile(scores[labels == 0], 0.9))])
  counts[0, np.searchsorted(ids, top_neg)] = 0  # the fallback's case
  for fpr in (0.001, 0.01, [0.001, 0.02]):
    got = np.atleast_2d(bootstrap.resampled_tpr_at_fpr(scores, labels, groups, fpr, counts))
    for row, f in zip(got, np.atleast_1d(fpr)):
      for b in range(counts.shape[0]):
        take = np.concatenate([np.repeat(np.flatnonzero(groups == g), c)
                               for g, c in zip(ids, counts[b])])
        assert row[b] == metrics.tpr_at_fpr(scores[take], labels[take], f), (f, b)
