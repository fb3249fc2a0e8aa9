"""Cluster bootstrap of TPR at low FPR, threshold selection included; distinct negatives.

Pooled membership evaluations (`attacks.passive.scores.pooled_round_scores`) score the same
query once per target client: a query's entries share its difficulty, so they are not
independent, and the N_neg non-member entries behind an FPR of 1e-3 may come from far fewer
distinct queries. The percentile bootstrap here resamples distinct queries ("groups") with
replacement, each with all of its entries (Davison and Hinkley, 1997, Sect. 3.8, the cluster
bootstrap), and recomputes on every resample the threshold at the target FPR and the TPR it
achieves (`eval.metrics.tpr_at_fpr`'s rule: the largest TPR over ROC points with FPR <=
target), so the interval includes the uncertainty of choosing the threshold on the same data.

A resample is represented by integer multiplicities of the groups; resampling a group k times
is scoring each of its entries with weight k, which is what `resampled_tpr_at_fpr` computes
(after one sort of the scores) instead of copying entries.
"""

from __future__ import annotations

import numpy as np

from fl_privacy.eval import metrics

# Largest resamples x entries handled at once (float64 working arrays of this many elements).
CHUNK_ELEMENTS = 1 << 22


def group_index(groups) -> tuple[np.ndarray, int]:
  """Group ids -> (index 0 .. G - 1 of each entry, G)."""
  _, index = np.unique(np.asarray(groups).reshape(-1), return_inverse=True)
  return index.reshape(-1), int(index.max()) + 1 if index.size else 0


def resample_inputs(scores, labels, groups, counts
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, np.ndarray]:
  """Checked flat arrays of a resampled statistic: (scores float64, labels bool, group index
  0 .. G - 1 of each entry, G, counts [B, G]); ValueError on differing lengths, counts not
  [B, G], or NaN scores."""
  s = np.asarray(scores, np.float64).reshape(-1)
  y = np.asarray(labels).reshape(-1).astype(bool)
  index, num_groups = group_index(groups)
  counts = np.asarray(counts)
  if s.shape != y.shape or s.shape != index.shape:
    raise ValueError(f'scores {s.shape}, labels {y.shape} and groups {index.shape} differ')
  if counts.ndim != 2 or counts.shape[1] != num_groups:
    raise ValueError(f'counts must be [B, {num_groups}] (got {counts.shape})')
  if np.isnan(s).any():
    raise ValueError('scores contain NaN')
  return s, y, index, num_groups, counts


def resampled_tpr_at_fpr(scores, labels, groups, fpr, counts) -> np.ndarray:
  """TPR at `fpr` of resamples given by group multiplicities.

  Resample b holds counts[b, g] copies of every entry of group g (groups indexed in sorted
  order of their ids). Its TPR is `metrics.tpr_at_fpr` of those copies: ROC points at every
  distinct score, FPR = weighted false positives / weighted negatives, the largest TPR with
  FPR <= fpr (0 when only the (0, 0) point is admissible). NaN where a resample has no
  member or no non-member.

  Args:
    scores: [N] scores, higher = member.
    labels: [N] 1 member, 0 non-member.
    groups: [N] group (query) id of each entry.
    fpr: target FPR in [0, 1], or a sequence of them (one pass over the resamples for all).
    counts: [B, G] non-negative integer multiplicities (below 2^31 in total per resample).

  Returns:
    [B] TPRs ([F, B] for F target FPRs).
  """
  fprs = np.atleast_1d(np.asarray(fpr, np.float64))
  if fprs.ndim != 1 or not ((0.0 <= fprs) & (fprs <= 1.0)).all():
    raise ValueError(f'fpr must be in [0, 1] (got {fpr})')
  s, y, index, num_groups, counts = resample_inputs(scores, labels, groups, counts)
  order = np.argsort(-s, kind='mergesort')
  s, y, index = s[order], y[order], index[order]
  last_of_run = np.r_[np.nonzero(np.diff(s))[0], s.size - 1]
  # Class totals of every resample: counts times the members / non-members of each group.
  n_pos = counts @ np.bincount(index[y], minlength=num_groups).astype(np.float64)
  n_neg = counts @ np.bincount(index[~y], minlength=num_groups).astype(np.float64)
  # Only the top of the ranking can hold a threshold at a low FPR: the cumulative sums run over
  # a prefix of ROC points holding well over max(fpr) of the non-member entries; a resample
  # whose weighted false positives do not exceed max(fpr) within it is redone on all entries.
  f_max = float(fprs.max())
  negatives = np.cumsum(~y)[last_of_run]
  need = min(int(negatives[-1]), int(np.ceil(3 * f_max * negatives[-1])) + 100)
  ends = last_of_run[:int(np.searchsorted(negatives, need)) + 1]
  out = np.empty((fprs.size, counts.shape[0]))
  step = max(1, CHUNK_ELEMENTS // max(ends[-1] + 1 if ends.size else 1, 1))
  for start in range(0, counts.shape[0], step):
    rows = np.arange(start, min(start + step, counts.shape[0]))
    tpr, fps_end = _prefix_tprs(counts[rows], index, y, ends, n_pos[rows], n_neg[rows], fprs)
    with np.errstate(invalid='ignore', divide='ignore'):
      redo = ~(fps_end / n_neg[rows] > f_max * (1 + 1e-12))
    if redo.any() and ends.size < last_of_run.size:
      tpr[:, redo], _ = _prefix_tprs(counts[rows[redo]], index, y, last_of_run,
                                     n_pos[rows[redo]], n_neg[rows[redo]], fprs)
    out[:, rows] = tpr
  return out if np.ndim(fpr) else out[0]


def _prefix_tprs(counts, index, y, ends, n_pos, n_neg, fprs):
  """TPRs [F, b] at `fprs` from the ROC points `ends` (run ends of the sorted entries, the
  first len(ends) of them), and the weighted false positives at the last of them [b].

  Exact when the admissible ROC points are among `ends`; integer weights, so the cumulative
  sums are exact (int32 halves the memory traffic of int64).
  """
  length = int(ends[-1]) + 1
  w = counts.astype(np.int32)[:, index[:length]]  # [b, length] sorted order
  tps = np.cumsum(np.where(y[:length], w, 0), axis=1, dtype=np.int32)[:, ends]
  fps = np.cumsum(np.where(y[:length], 0, w), axis=1, dtype=np.int32)[:, ends]
  out = np.empty((fprs.size, counts.shape[0]))
  for i, f in enumerate(fprs):
    with np.errstate(invalid='ignore', divide='ignore'):
      admissible = fps / n_neg[:, None] <= f * (1 + 1e-12)
      # FPR is non-decreasing along the runs, so the admissible points are a prefix.
      last = admissible.sum(axis=1) - 1
      tpr = np.where(last >= 0, np.take_along_axis(tps, np.maximum(last, 0)[:, None], 1)[:, 0]
                     / n_pos, 0.0)
    tpr[(n_pos == 0) | (n_neg == 0)] = np.nan
    out[i] = tpr
  return out, fps[:, -1].astype(np.float64)


def resample_counts(num_groups: int, num_resamples: int,
                    rng: np.random.Generator) -> np.ndarray:
  """[num_resamples, num_groups] multiplicities: G uniform draws with replacement per resample.

  The multinomial(G, 1/G) counts, drawn as G uniform indices per resample and counted (faster
  than `rng.multinomial` with G categories). Column g is the group of sorted id g
  (`group_index`).
  """
  draws = rng.integers(0, num_groups, size=(num_resamples, num_groups))
  draws += num_groups * np.arange(num_resamples)[:, None]
  return np.bincount(draws.reshape(-1), minlength=num_resamples * num_groups).reshape(
      num_resamples, num_groups)


def tpr_at_fpr_interval(scores, labels, groups, fpr, *, rng: np.random.Generator,
                        num_resamples: int = 1000, confidence: float = 0.95):
  """TPR at `fpr` with a query-cluster percentile bootstrap interval (module docstring).

  Each resample draws G groups uniformly with replacement out of the G distinct groups
  (multinomial multiplicities), keeps all entries of each drawn group, chooses the threshold at
  `fpr` on the resample and takes its TPR; the interval is the (1 -+ confidence) / 2
  percentiles of those TPRs. Resamples without a member or without a non-member are left out.

  Args:
    scores: [N] scores, higher = member.
    labels: [N] 1 member, 0 non-member.
    groups: [N] group (query) id of each entry; `np.arange(N)` is the ordinary bootstrap.
    fpr: target FPR, or a sequence of them (the same resamples for all).
    rng: numpy Generator for the resamples.
    num_resamples: B.
    confidence: two-sided level.

  Returns:
    (tpr of the data, low, high); a list of them for a sequence of FPRs.
  """
  if not 0.0 < confidence < 1.0:
    raise ValueError(f'confidence must be in (0, 1) (got {confidence})')
  if num_resamples < 1:
    raise ValueError(f'num_resamples must be positive (got {num_resamples})')
  counts = resample_counts(group_index(groups)[1], num_resamples, rng)
  all_tprs = np.atleast_2d(resampled_tpr_at_fpr(scores, labels, groups, fpr, counts))
  out = []
  tail = (1.0 - confidence) / 2.0
  for f, tprs in zip(np.atleast_1d(fpr), all_tprs):
    point = float(metrics.tpr_at_fpr(scores, labels, float(f)))
    tprs = tprs[~np.isnan(tprs)]
    if tprs.size == 0:
      raise ValueError('no resample holds both members and non-members')
    low, high = np.quantile(tprs, [tail, 1.0 - tail])
    out.append((point, float(low), float(high)))
  return out if np.ndim(fpr) else out[0]


def distinct_negatives(scores, labels, groups, fpr: float) -> int:
  """Distinct groups (queries) among the non-member entries at or above the threshold at `fpr`.

  The threshold is the one `metrics.tpr_at_fpr` uses: the ROC point with the largest TPR
  among those with FPR <= fpr (the largest FPR of them when several share that TPR). Its false
  positives are entries; when a query contributes several (one per target), the FPR counts
  fewer independent events than it seems, and this count says how many.

  Args:
    scores: [N] scores, higher = member.
    labels: [N] 1 member, 0 non-member.
    groups: [N] group (query) id of each entry.
    fpr: target FPR.

  Returns:
    The number of distinct groups of the false positives (0 at the (0, 0) point).
  """
  s = np.asarray(scores, np.float64).reshape(-1)
  y = np.asarray(labels).reshape(-1).astype(bool)
  g = np.asarray(groups).reshape(-1)
  if s.shape != g.shape:
    raise ValueError(f'scores {s.shape} and groups {g.shape} differ')
  roc_fpr, _, thresholds = metrics.roc_curve(s, y)
  last = int(np.searchsorted(roc_fpr, fpr * (1 + 1e-12), side='right')) - 1
  false_positive = ~y & (s >= thresholds[last])
  return int(np.unique(g[false_positive]).size)
