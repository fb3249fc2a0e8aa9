"""Exact and near duplicate finders on planted duplicates."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from fl_privacy.data import duplicates, load


def _planted(seed=0):
  """Digits with planted exact copies and one-grey-level near copies."""
  x = load({'name': 'digits'})['train'].x[:300].copy()
  # Real digits contain no exact duplicates among these 300; keep the test honest.
  assert not duplicates.exact_groups(x)
  x[10] = x[3]
  x[250] = x[3]
  x[77] = x[40]
  near = x[120].astype(np.int16) + 1
  x[200] = np.clip(near, 0, 255).astype(np.uint8)
  return x


def test_exact_groups_finds_planted_copies():
  groups = duplicates.exact_groups(_planted())
  assert [g.tolist() for g in groups] == [[3, 10, 250], [40, 77]]


def test_near_groups_at_zero_matches_exact_groups():
  x = _planted()
  exact = [g.tolist() for g in duplicates.exact_groups(x)]
  assert [g.tolist() for g in duplicates.near_groups(x, 0.0)] == exact


def test_near_groups_catches_small_perturbations_only():
  x = _planted()
  # Shifting 64 pixels by one grey level moves an image by at most 8/255 ~ 0.031.
  groups = [g.tolist() for g in duplicates.near_groups(x, 0.04)]
  assert groups == [[3, 10, 250], [40, 77], [120, 200]]


def test_near_groups_agrees_with_scipy_connected_components():
  from scipy.sparse.csgraph import connected_components
  rng = np.random.default_rng(1)
  v = rng.normal(size=(120, 5)).astype(np.float32)
  threshold = 0.9
  d = cdist(v, v)
  # No pair within rounding of the threshold: the library's distances round differently.
  assert np.min(np.abs(d - threshold)) > 1e-5
  adj = d <= threshold
  _, labels = connected_components(adj, directed=False)
  expected = sorted(sorted(np.flatnonzero(labels == c).tolist())
                    for c in np.unique(labels) if np.sum(labels == c) >= 2)
  got = [g.tolist() for g in duplicates.near_groups(np.zeros((120, 1)), threshold,
                                                    features=v)]
  assert got == expected and len(got) > 3


def test_near_groups_blockwise_equals_single_block(monkeypatch):
  rng = np.random.default_rng(2)
  v = rng.normal(size=(90, 4))
  one = duplicates.near_groups(v, 0.8)
  monkeypatch.setattr(duplicates, '_BLOCK_BYTES', 4 * 90 * 7)  # 7-row blocks.
  many = duplicates.near_groups(v, 0.8)
  assert [g.tolist() for g in one] == [g.tolist() for g in many]


def test_cross_matches_exact_and_near():
  train = _planted()
  test = np.stack([train[3], train[150], np.clip(train[5].astype(int) + 1, 0, 255)
                   .astype(np.uint8), np.full((8, 8, 1), 7, np.uint8)])
  exact = duplicates.cross_matches(test, train)
  assert [(i, m.tolist()) for i, m in exact] == [(0, [3, 10, 250]), (1, [150])]
  near = duplicates.cross_matches(test, train, threshold=0.04)
  assert [(i, m.tolist()) for i, m in near] == [(0, [3, 10, 250]), (1, [150]), (2, [5])]
  # Agreement with brute-force distances from scipy.
  d = cdist(test.reshape(4, -1) / 255.0, train.reshape(300, -1) / 255.0)
  assert np.min(np.abs(d - 0.04)) > 1e-6   # no pair within rounding of the threshold
  assert [(i, np.flatnonzero(d[i] <= 0.04).tolist()) for i in range(4)
          if np.any(d[i] <= 0.04)] == [(i, m.tolist()) for i, m in near]


def test_negative_threshold_raises():
  with pytest.raises(ValueError):
    duplicates.near_groups(np.zeros((2, 2)), -1.0)
  with pytest.raises(ValueError):
    duplicates.cross_matches(np.zeros((2, 2)), np.zeros((2, 2)), -1.0)
