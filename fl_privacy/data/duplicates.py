"""Exact and near duplicates within a dataset, and test-in-train matches.

The dishonest-server paper traced its only detection failures to exact duplicate
images (14 groups in CIFAR-100 train, 82 in CelebA): a duplicate of the target is
indistinguishable from the target. These helpers find such groups so experiments
can exclude or report them.
"""

from __future__ import annotations

import hashlib

import numpy as np

from fl_privacy.data.dataset import to_float

# Candidate pairs come from a float32 Gram expansion; rounding error there is far
# below this fraction of the squared norms, and every candidate is re-checked exactly.
_CANDIDATE_SLACK = 1e-4
_BLOCK_BYTES = 64 << 20


def _digests(x: np.ndarray) -> list[bytes]:
  x = np.ascontiguousarray(x)
  return [hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in x]


def exact_groups(x) -> list[np.ndarray]:
  """Groups of >= 2 examples with identical raw bytes.

  Args:
    x: [N, ...] array (images or features).

  Returns:
    Sorted index arrays, one per group, ordered by their first index.
  """
  buckets: dict[bytes, list[int]] = {}
  for i, d in enumerate(_digests(np.asarray(x))):
    buckets.setdefault(d, []).append(i)
  groups = [np.asarray(v) for v in buckets.values() if len(v) >= 2]
  return sorted(groups, key=lambda g: g[0])


def _vectors(x) -> np.ndarray:
  x = np.asarray(x)
  return to_float(x).reshape(len(x), -1)


def _block_rows(num_ref: int) -> int:
  return max(1, _BLOCK_BYTES // (4 * max(num_ref, 1)))


def _within(q: np.ndarray, r: np.ndarray, threshold: float, *, upper: bool = False):
  """Yields (i, j) with ||q_i - r_j|| <= threshold, blockwise over rows of q.

  With upper=True (q is r) only pairs i < j are searched, which halves the work.
  Memory is one block of the [len(q), len(r)] distance matrix (about 64 MiB).
  """
  rn = np.einsum('ij,ij->i', r, r)
  block = _block_rows(len(r))
  for start in range(0, len(q), block):
    qb = q[start:start + block]
    first = start + 1 if upper else 0
    if first >= len(r):
      break
    rb, rbn = r[first:], rn[first:]
    qn = np.einsum('ij,ij->i', qb, qb)
    d2 = qn[:, None] + rbn[None, :] - 2.0 * (qb @ rb.T)
    hit = d2 <= threshold ** 2 + _CANDIDATE_SLACK * (qn[:, None] + rbn[None, :])
    if upper:  # Row i of the block sits at start + i; keep columns j > start + i.
      hit &= np.arange(first, len(r))[None, :] > np.arange(start, start + len(qb))[:, None]
    for i, j in zip(*np.nonzero(hit)):
      diff = qb[i].astype(np.float64) - rb[j].astype(np.float64)
      if np.dot(diff, diff) <= threshold ** 2:
        yield start + int(i), first + int(j)


def _find(parent: np.ndarray, i: int) -> int:
  while parent[i] != i:
    parent[i] = parent[parent[i]]
    i = parent[i]
  return i


def near_groups(x, threshold: float, features=None) -> list[np.ndarray]:
  """Connected groups of examples within L2 distance `threshold` of one another.

  Two examples are linked when their distance is <= threshold; groups are the
  connected components (union-find) with >= 2 members, so a chain a~b~c is one group
  even if a and c are farther apart.

  Args:
    x: [N, ...] examples; distances are taken on `to_float(x)` flattened (uint8
      images in [0, 1], so a 32x32x3 image pair differing by one grey level in every
      pixel is sqrt(3072)/255 ~ 0.22 apart).
    threshold: Largest linking distance (>= 0; 0 finds exact duplicates).
    features: Optional [N, d] vectors to measure distance in instead of pixels.

  Returns:
    Sorted index arrays, ordered by their first index.
  """
  if threshold < 0:
    raise ValueError(f'threshold must be >= 0, got {threshold}')
  v = _vectors(x if features is None else features)
  parent = np.arange(len(v))
  for i, j in _within(v, v, threshold, upper=True):
    a, b = _find(parent, i), _find(parent, j)
    if a != b:
      parent[max(a, b)] = min(a, b)
  roots = np.array([_find(parent, i) for i in range(len(v))], dtype=np.int64)
  order = np.argsort(roots, kind='stable')
  cuts = np.flatnonzero(np.diff(roots[order])) + 1
  groups = [g for g in np.split(order, cuts) if len(g) >= 2]
  return sorted(groups, key=lambda g: g[0])


def cross_matches(x_query, x_ref, threshold: float = 0.0) -> list[tuple[int, np.ndarray]]:
  """For each query example, the reference examples within `threshold` (test-in-train).

  threshold 0 compares raw bytes (exact copies); a positive threshold uses L2
  distance on `to_float` values as in `near_groups`.

  Returns:
    (query index, sorted reference indices) for every query with at least one match,
    in query order.
  """
  if threshold < 0:
    raise ValueError(f'threshold must be >= 0, got {threshold}')
  matches: dict[int, list[int]] = {}
  if threshold == 0:
    ref: dict[bytes, list[int]] = {}
    for j, d in enumerate(_digests(np.asarray(x_ref))):
      ref.setdefault(d, []).append(j)
    for i, d in enumerate(_digests(np.asarray(x_query))):
      if d in ref:
        matches[i] = ref[d]
  else:
    for i, j in _within(_vectors(x_query), _vectors(x_ref), threshold):
      matches.setdefault(i, []).append(j)
  return [(i, np.sort(np.asarray(js))) for i, js in sorted(matches.items())]
