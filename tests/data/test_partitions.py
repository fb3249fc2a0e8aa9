"""Member/non-member pools and client partitions."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from scipy import stats

from fl_privacy.data import (dirichlet_partition, holdout_split, iid_partition,
                             member_nonmember_split)


def _check_disjoint(parts, n):
  allidx = np.concatenate(parts)
  assert len(np.unique(allidx)) == len(allidx)
  assert allidx.min(initial=0) >= 0 and allidx.max(initial=0) < n


def test_member_nonmember_split_partitions_the_pool():
  members, non = member_nonmember_split(jax.random.key(0), 100, 30)
  assert len(members) == 30 and len(non) == 70
  np.testing.assert_array_equal(np.sort(np.concatenate([members, non])), np.arange(100))
  again, _ = member_nonmember_split(jax.random.key(0), 100, 30)
  np.testing.assert_array_equal(members, again)
  with pytest.raises(ValueError):
    member_nonmember_split(jax.random.key(0), 10, 11)


def test_member_split_is_uniform():
  # Each index is a member with probability 30/100; over 400 keys the count of a
  # fixed index is Binomial(400, 0.3): check index 0 and 99 against a 99.9% interval.
  counts = np.zeros(100)
  for t in range(400):
    counts[member_nonmember_split(jax.random.key(t), 100, 30)[0]] += 1
  low, high = stats.binom.ppf([0.0005, 0.9995], 400, 0.3)
  assert low <= counts[0] <= high and low <= counts[99] <= high
  # Whole-vector check: chi-square of the 100 counts (each expected 120).
  chi2 = np.sum((counts - 120) ** 2 / 120) * (100 / 70)  # Multivariate-hypergeom. correction.
  assert chi2 < stats.chi2.ppf(0.999, 99)


def test_iid_partition_sizes_and_determinism():
  parts = iid_partition(jax.random.key(1), 103, 10)
  _check_disjoint(parts, 103)
  assert sorted(len(p) for p in parts) == [10] * 7 + [11] * 3
  fixed = iid_partition(jax.random.key(1), 103, 10, per_client=7)
  assert [len(p) for p in fixed] == [7] * 10
  _check_disjoint(fixed, 103)
  again = iid_partition(jax.random.key(1), 103, 10, per_client=7)
  for a, b in zip(fixed, again):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError):
    iid_partition(jax.random.key(1), 10, 3, per_client=4)


def _mean_label_entropy(parts, labels, num_classes):
  ent = []
  for p in parts:
    freq = np.bincount(labels[p], minlength=num_classes) / len(p)
    ent.append(stats.entropy(freq))
  return float(np.mean(ent))


@pytest.mark.parametrize('per_client', [None, 50])
def test_dirichlet_partition_is_disjoint_and_skew_grows_as_beta_falls(per_client):
  labels = np.repeat(np.arange(10), 100)
  entropies = []
  for beta in (100.0, 1.0, 0.05):
    parts = dirichlet_partition(jax.random.key(3), labels, 10, beta, per_client)
    _check_disjoint(parts, len(labels))
    if per_client is None:
      assert sum(len(p) for p in parts) == len(labels)
      assert min(len(p) for p in parts) >= 1
    else:
      assert [len(p) for p in parts] == [per_client] * 10
    entropies.append(_mean_label_entropy(parts, labels, 10))
  # Uniform labels have entropy ln 10 = 2.30 (the plug-in estimate from 50 draws is
  # about 0.09 lower); beta=100 is nearly IID.
  assert entropies[0] > 2.1
  assert entropies[0] > entropies[1] > entropies[2]
  assert entropies[2] < 1.0


def test_dirichlet_partition_is_deterministic_per_key():
  labels = np.repeat(np.arange(5), 40)
  a = dirichlet_partition(jax.random.key(9), labels, 4, 0.5)
  b = dirichlet_partition(jax.random.key(9), labels, 4, 0.5)
  c = dirichlet_partition(jax.random.key(10), labels, 4, 0.5)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(a, c))


def test_dirichlet_partition_rejects_bad_arguments():
  labels = np.zeros(10, int)
  with pytest.raises(ValueError):
    dirichlet_partition(jax.random.key(0), labels, 2, 0.0)
  with pytest.raises(ValueError):
    dirichlet_partition(jax.random.key(0), labels, 3, 1.0, per_client=4)


def test_holdout_split_is_fixed_and_complete():
  train, test = holdout_split(50, 0.2)
  assert len(test) == 10
  np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(50))
  np.testing.assert_array_equal(test, holdout_split(50, 0.2)[1])
