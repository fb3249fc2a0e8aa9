"""Two attacks compared on the same pooled entries: paired differences with intervals.

A claim "attack A beats attack B" is a statement about a difference measured on the same
members and non-members, so its interval must come from the paired data: two separate
intervals that overlap do not show that A and B are equal, and two that barely miss each other
overstate the evidence. `compare` gives the difference of AUC and of TPR at a low FPR with one
query-cluster percentile bootstrap (`eval.bootstrap`: distinct queries resampled with all
their entries, thresholds re-selected on every resample) in which both attacks see the same
resamples, so the correlation between them is kept and the entries of one query (one per
target client) are not taken as independent.

The AUC of a resample weighs every entry by its group's multiplicity: the weighted
Mann-Whitney statistic sum_{i pos, j neg} w_i w_j ([s_i > s_j] + [s_i = s_j] / 2) /
(W_pos W_neg), the AUC of the resample's copies (`resampled_auc`).
"""

from __future__ import annotations

import numpy as np

from fl_privacy.eval import bootstrap
from fl_privacy.eval import metrics

# Largest resamples x entries weighed at once.
CHUNK_ELEMENTS = 1 << 22
# Largest members x groups kernel of `_auc_by_groups` (float64); beyond it, entry weights.
KERNEL_ELEMENTS = 1 << 24


def resampled_auc(scores, labels, groups, counts) -> np.ndarray:
  """AUC of each resample given by group multiplicities (as `bootstrap.resampled_tpr_at_fpr`).

  Args:
    scores: [N] scores, higher = member.
    labels: [N] 1 member, 0 non-member.
    groups: [N] group (query) id of each entry.
    counts: [B, G] non-negative integer multiplicities of the groups in sorted id order.

  Returns:
    [B] AUCs; NaN where a resample has no member or no non-member.
  """
  s, y, index, num_groups, counts = bootstrap.resample_inputs(scores, labels, groups, counts)
  if y.sum() * num_groups <= KERNEL_ELEMENTS:
    return _auc_by_groups(s, y, index, num_groups, counts)
  order = np.argsort(s, kind='mergesort')
  s, y, index = s[order], y[order], index[order]
  # Run r holds the entries of one distinct score; a member in run r beats the non-members of
  # the runs below it and ties with half of those of its own run.
  run = np.r_[0, np.cumsum(np.diff(s) != 0)]
  num_runs = int(run[-1]) + 1 if s.size else 0
  out = np.empty(counts.shape[0])
  step = max(1, CHUNK_ELEMENTS // max(s.size, 1))
  for start in range(0, counts.shape[0], step):
    w = counts[start:start + step][:, index].astype(np.float64)  # [b, N] sorted order
    neg_w = np.where(y, 0.0, w)
    rows = w.shape[0]
    per_run = np.bincount((run[None, :] + num_runs * np.arange(rows)[:, None]).reshape(-1),
                          weights=neg_w.reshape(-1),
                          minlength=rows * num_runs).reshape(rows, num_runs)
    below = np.cumsum(per_run, axis=1) - per_run  # non-member weight strictly below each run
    beaten = below[:, run] + per_run[:, run] / 2.0
    w_pos = np.where(y, w, 0.0)
    total_pos, total_neg = w_pos.sum(axis=1), neg_w.sum(axis=1)
    with np.errstate(invalid='ignore', divide='ignore'):
      auc = (w_pos * beaten).sum(axis=1) / (total_pos * total_neg)
    auc[(total_pos == 0) | (total_neg == 0)] = np.nan
    out[start:start + step] = auc
  return out


def _auc_by_groups(s, y, index, num_groups, counts) -> np.ndarray:
  """`resampled_auc` through a members x groups kernel, for few members.

  K[i, h] = sum over the non-member entries j of group h of [s_i > s_j] + [s_i = s_j] / 2, so a
  resample's weighted Mann-Whitney sum is sum_i c[g(i)] (K c)[i]: one matrix product for all
  resamples instead of weighing every entry in each.
  """
  pos = np.flatnonzero(y)
  neg = np.flatnonzero(~y)
  by_group = neg[np.argsort(index[neg], kind='stable')]
  groups_sorted = index[by_group]
  present, starts = np.unique(groups_sorted, return_index=True)
  kernel = np.zeros((pos.size, num_groups))
  step = max(1, CHUNK_ELEMENTS // max(neg.size, 1))
  for start in range(0, pos.size, step):
    rows = pos[start:start + step]
    diff = s[rows][:, None] - s[by_group][None, :]
    beats = (diff > 0) + 0.5 * (diff == 0)
    if present.size:
      kernel[start:start + rows.size, present] = np.add.reduceat(beats, starts, axis=1)
  c = counts.astype(np.float64)
  weight_pos = c[:, index[pos]]  # [B, n_pos]
  total_pos = weight_pos.sum(axis=1)
  total_neg = c @ np.bincount(index[neg], minlength=num_groups).astype(np.float64)
  with np.errstate(invalid='ignore', divide='ignore'):
    auc = (weight_pos * (c @ kernel.T)).sum(axis=1) / (total_pos * total_neg)
  auc[(total_pos == 0) | (total_neg == 0)] = np.nan
  return auc


def compare(scores_a, scores_b, labels, groups, *, rng: np.random.Generator,
            fpr: float = 1e-3, num_resamples: int = 1000,
            confidence: float = 0.95) -> dict[str, float]:
  """A minus B in AUC and in TPR at `fpr`, with paired query-cluster bootstrap intervals.

  Args:
    scores_a, scores_b: [N] the two attacks' scores of the same entries (higher = member).
    labels: [N] 1 member, 0 non-member.
    groups: [N] query of each entry (the cluster the bootstrap resamples).
    rng: numpy Generator of the resamples (one set, shared by both attacks).
    fpr: the low FPR of the TPR comparison.
    num_resamples: B.
    confidence: two-sided level of the percentile intervals.

  Returns:
    `auc_a`, `auc_b`, `auc_diff` (A - B) with `auc_diff_low` / `auc_diff_high`; `tpr_a`,
    `tpr_b`, `tpr_diff` with `tpr_diff_low` / `tpr_diff_high` (TPR at `fpr`, each attack's
    threshold chosen on the data or resample, `metrics.tpr_at_fpr`'s rule); `num_resamples`
    (resamples holding both classes, behind the intervals) and `num_groups`.
  """
  if not 0.0 < confidence < 1.0:
    raise ValueError(f'confidence must be in (0, 1) (got {confidence})')
  if num_resamples < 1:
    raise ValueError(f'num_resamples must be positive (got {num_resamples})')
  a, b = np.asarray(scores_a, np.float64), np.asarray(scores_b, np.float64)
  if a.shape != b.shape:
    raise ValueError(f'scores_a {a.shape} and scores_b {b.shape} differ')
  num_groups = bootstrap.group_index(groups)[1]
  counts = bootstrap.resample_counts(num_groups, num_resamples, rng)
  auc_diffs = resampled_auc(a, labels, groups, counts) - resampled_auc(b, labels, groups, counts)
  tpr_diffs = (bootstrap.resampled_tpr_at_fpr(a, labels, groups, fpr, counts) -
               bootstrap.resampled_tpr_at_fpr(b, labels, groups, fpr, counts))
  keep = ~np.isnan(auc_diffs)
  if not keep.any():
    raise ValueError('no resample holds both members and non-members')
  tail = (1.0 - confidence) / 2.0
  out = dict(auc_a=metrics.roc_auc(a, labels), auc_b=metrics.roc_auc(b, labels),
             tpr_a=float(metrics.tpr_at_fpr(a, labels, fpr)),
             tpr_b=float(metrics.tpr_at_fpr(b, labels, fpr)),
             num_resamples=int(keep.sum()), num_groups=int(num_groups))
  out['auc_diff'] = out['auc_a'] - out['auc_b']
  out['tpr_diff'] = out['tpr_a'] - out['tpr_b']
  for name, diffs in (('auc_diff', auc_diffs), ('tpr_diff', tpr_diffs)):
    low, high = np.quantile(diffs[keep], [tail, 1.0 - tail])
    out[f'{name}_low'], out[f'{name}_high'] = float(low), float(high)
  return out


# Widths, relative to max(1, |limit|), at or below which an interval counts as zero-width:
# float sums of equal values differ by a few ulps (`eval.replicated.EQUAL_TOL`).
ZERO_WIDTH = 1e-11
NOT_ESTIMABLE = 'not estimable (zero-width or undefined interval)'


def verdict(low: float, high: float) -> str:
  """What a paired interval of A - B shows. An interval of zero width (replicates that agree,
  e.g. a rate of a few discrete counts equal in every training; judged within ZERO_WIDTH, so
  a few ulps of rounding are no width) or with an undefined limit shows nothing: NOT_ESTIMABLE.
  """
  if not high - low > ZERO_WIDTH * max(1.0, abs(low), abs(high)):
    return NOT_ESTIMABLE
  if low > 0:
    return 'A better (interval above 0)'
  if high < 0:
    return 'B better (interval below 0)'
  return 'no difference shown (interval holds 0)'


def holm(p_values) -> np.ndarray:
  """Holm's (1979) step-down adjusted p-values of one family of m tests.

  With the p-values sorted, p_(1) <= ... <= p_(m), the adjusted p_(i) is
  max_{j <= i} min(1, (m - j + 1) p_(j)); rejecting where it is below alpha keeps the
  family-wise error at most alpha under any dependence (Holm, 1979, Scand. J. Statist. 6(2),
  65-70). A NaN p-value (a claim with no test) counts in m, is placed last, and stays NaN.

  Args:
    p_values: [m] p-values in [0, 1], NaN where a claim has none.

  Returns:
    [m] adjusted p-values in the input order.
  """
  p = np.asarray(p_values, np.float64).reshape(-1)
  if ((p < 0) | (p > 1)).any():
    raise ValueError(f'p-values must be in [0, 1] (got {p[(p < 0) | (p > 1)][:3]})')
  missing = np.isnan(p)
  filled = np.where(missing, 1.0, p)
  order = np.argsort(filled, kind='stable')
  m = p.size
  adjusted = np.empty(m)
  adjusted[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * filled[order]))
  adjusted[missing] = np.nan
  return adjusted


def p_verdict(diff: float, p: float, alpha: float = 0.05,
                 name: str = 'Holm-adjusted p') -> str:
  """What a test of "A - B has mean 0" shows at level alpha: the side of `diff` where `p` <
  alpha; NOT_ESTIMABLE where `p` or `diff` is NaN (one training, a degenerate interval)."""
  if not 0.0 < alpha < 1.0:
    raise ValueError(f'alpha must be in (0, 1) (got {alpha})')
  if np.isnan(p) or np.isnan(diff):
    return NOT_ESTIMABLE.replace('interval', 'interval: no test')
  if p < alpha:
    return f'{"A" if diff > 0 else "B"} better ({name} {p:.2g} < {alpha:g})'
  return f'no difference shown ({name} {p:.2g})'
