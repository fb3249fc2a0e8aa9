"""Attack metrics: TPR/TNR/advantage with intervals, ROC, AUCs (DeLong intervals), TPR@FPR,
hypervolume.

Labels are 1 for the positive world (member, or input x') and 0 for the negative
one; higher scores mean "more likely positive"; a decision is True for positive.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import special

from fl_privacy.eval import stats


def _as_binary(labels, name: str = 'labels') -> np.ndarray:
  labels = np.asarray(labels).reshape(-1)
  if labels.dtype != bool and not np.all((labels == 0) | (labels == 1)):
    raise ValueError(f'{name} must be 0/1 or bool')
  return labels.astype(bool)


def _bonferroni_bounds(k1, n1, k2, n2, confidence):
  """Simultaneous CP intervals for two rates (each at 1 - (1 - c) / 2)."""
  each = 1.0 - (1.0 - confidence) / 2.0
  return stats.clopper_pearson(k1, n1, each), stats.clopper_pearson(k2, n2, each)


def tpr_tnr_adv(decisions, labels, confidence: float = 0.95) -> dict[str, float]:
  """Rates of a binary decision rule, each with its count and interval.

  Adv = (TPR + TNR) / 2 is the AMI paper's advantage (balanced accuracy, 0.5 at
  chance); `tpr_minus_fpr` = TPR - FPR is the usual membership advantage (0 at
  chance). TPR, TNR, FPR and FNR carry two-sided Clopper-Pearson intervals at
  `confidence`. The two advantages combine Clopper-Pearson intervals for TPR and
  TNR computed at `1 - (1 - confidence) / 2` each (Bonferroni), so the interval
  holds with probability at least `confidence`.

  Args:
    decisions: bool/0-1 array, True = "positive".
    labels: bool/0-1 array of the same size, the truth.
    confidence: two-sided confidence level.

  Returns:
    Flat dict: `tp, fp, tn, fn, n_pos, n_neg` (counts) and `tpr, tnr, fpr, fnr,
    adv, tpr_minus_fpr`, each with `_ci_low` and `_ci_high`.
  """
  d = _as_binary(decisions, 'decisions')
  y = _as_binary(labels)
  if d.shape != y.shape:
    raise ValueError(f'decisions {d.shape} and labels {y.shape} differ')
  tp = int(np.sum(d & y))
  fn = int(np.sum(~d & y))
  tn = int(np.sum(~d & ~y))
  fp = int(np.sum(d & ~y))
  n_pos, n_neg = tp + fn, tn + fp
  out = {'tp': tp, 'fp': fp, 'tn': tn, 'fn': fn, 'n_pos': n_pos, 'n_neg': n_neg}
  out.update(stats.rate('tpr', tp, n_pos, confidence))
  out.update(stats.rate('tnr', tn, n_neg, confidence))
  out.update(stats.rate('fpr', fp, n_neg, confidence))
  out.update(stats.rate('fnr', fn, n_pos, confidence))
  (tpr_lo, tpr_hi), (tnr_lo, tnr_hi) = _bonferroni_bounds(
      tp, n_pos, tn, n_neg, confidence)
  out['adv'] = (out['tpr'] + out['tnr']) / 2
  out['adv_ci_low'] = (tpr_lo + tnr_lo) / 2
  out['adv_ci_high'] = (tpr_hi + tnr_hi) / 2
  out['tpr_minus_fpr'] = out['tpr'] - out['fpr']
  out['tpr_minus_fpr_ci_low'] = tpr_lo - (1.0 - tnr_lo)
  out['tpr_minus_fpr_ci_high'] = tpr_hi - (1.0 - tnr_hi)
  return out


def roc_curve(scores, labels) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """ROC points at every distinct score threshold ("positive iff score >= t").

  Like `sklearn.metrics.roc_curve(..., drop_intermediate=False)`: tied scores form
  one threshold (one diagonal step), and the first point is (0, 0) at
  threshold +inf.

  Args:
    scores: float array, higher = more likely positive.
    labels: 0/1 or bool array; both classes must be present.

  Returns:
    `(fpr, tpr, thresholds)`, with fpr and tpr non-decreasing and thresholds
    decreasing.
  """
  s = np.asarray(scores, dtype=np.float64).reshape(-1)
  y = _as_binary(labels)
  if s.shape != y.shape:
    raise ValueError(f'scores {s.shape} and labels {y.shape} differ')
  if np.isnan(s).any():
    raise ValueError('scores contain NaN')
  n_pos = int(y.sum())
  n_neg = y.size - n_pos
  if n_pos == 0 or n_neg == 0:
    raise ValueError('roc_curve needs both positive and negative labels')
  order = np.argsort(-s, kind='mergesort')
  s, y = s[order], y[order]
  last_of_run = np.r_[np.nonzero(np.diff(s))[0], s.size - 1]
  tps = np.cumsum(y)[last_of_run]
  fps = (last_of_run + 1) - tps
  fpr = np.r_[0.0, fps / n_neg]
  tpr = np.r_[0.0, tps / n_pos]
  thresholds = np.r_[np.inf, s[last_of_run]]
  return fpr, tpr, thresholds


def roc_auc(scores, labels) -> float:
  """Area under the ROC curve (trapezoid rule, so ties count one half).

  Equals `sklearn.metrics.roc_auc_score` and the Mann-Whitney probability
  P[score(pos) > score(neg)] + P[tie] / 2.
  """
  fpr, tpr, _ = roc_curve(scores, labels)
  return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))


def _midranks(x: np.ndarray) -> np.ndarray:
  """1-based ranks of `x` with ties given the mean of their ranks."""
  order = np.argsort(x, kind='mergesort')
  xs = x[order]
  # Start and end (exclusive) of each run of equal values, in sorted order.
  starts = np.r_[0, np.nonzero(np.diff(xs))[0] + 1]
  ends = np.r_[starts[1:], xs.size]
  run_rank = (starts + ends + 1) / 2.0  # mean of ranks starts+1 .. ends
  ranks = np.empty(x.size, np.float64)
  ranks[order] = np.repeat(run_rank, ends - starts)
  return ranks


def delong_components(scores, labels) -> tuple[np.ndarray, np.ndarray]:
  """DeLong's structural components (DeLong et al., 1988), by midranks (Sun and Xu, 2014).

  V10[i] = P[score(pos i) > score(neg)] + P[tie] / 2 over the negatives and V01[j] the same
  for negative j against the positives, so that mean(V10) = mean(V01) = AUC. O(n log n).

  Returns:
    (V10 [n_pos], V01 [n_neg]).
  """
  s = np.asarray(scores, dtype=np.float64).reshape(-1)
  y = _as_binary(labels)
  if s.shape != y.shape:
    raise ValueError(f'scores {s.shape} and labels {y.shape} differ')
  if np.isnan(s).any():
    raise ValueError('scores contain NaN')
  pos, neg = s[y], s[~y]
  m, n = pos.size, neg.size
  if m == 0 or n == 0:
    raise ValueError('DeLong needs both positive and negative labels')
  combined = _midranks(np.concatenate([pos, neg]))
  v10 = (combined[:m] - _midranks(pos)) / n
  v01 = 1.0 - (combined[m:] - _midranks(neg)) / m
  return v10, v01


def _delong_half_width(v10: np.ndarray, v01: np.ndarray, confidence: float
                       ) -> tuple[float, float]:
  """(mean of V10, z * sd) from structural components (of one AUC, or of a paired difference):
  variance var(V10) / n_pos + var(V01) / n_neg (sample variances, ddof 1; a single component
  adds nothing), z the normal quantile of (1 + confidence) / 2."""
  var = 0.0
  if v10.size > 1:
    var += float(np.var(v10, ddof=1)) / v10.size
  if v01.size > 1:
    var += float(np.var(v01, ddof=1)) / v01.size
  z = float(np.sqrt(2.0) * special.erfinv(confidence))
  return float(np.mean(v10)), z * math.sqrt(max(var, 0.0))


def auc_interval(scores, labels, confidence: float = 0.95) -> tuple[float, float, float]:
  """ROC AUC with DeLong's asymptotic interval (DeLong, DeLong and Clarke-Pearson, 1988).

  The AUC is the Mann-Whitney statistic (ties count one half, equal to `roc_auc`); its
  variance is var(V10) / n_pos + var(V01) / n_neg with the structural components of
  `delong_components` (sample variances, ddof 1), and the interval is AUC +- z * sd, z the
  normal quantile of (1 + confidence) / 2, clipped to [0, 1]. Asymptotic: with a handful of
  positives or an AUC at 0 or 1 (zero variance) it is not a guarantee.

  Args:
    scores: float array, higher = more likely positive.
    labels: 0/1 or bool array; both classes must be present.
    confidence: two-sided level.

  Returns:
    (auc, low, high).
  """
  if not 0.0 < confidence < 1.0:
    raise ValueError(f'confidence must be in (0, 1) (got {confidence})')
  auc, half = _delong_half_width(*delong_components(scores, labels), confidence)
  return auc, max(0.0, auc - half), min(1.0, auc + half)


def auc_difference_interval(scores_a, scores_b, labels, confidence: float = 0.95
                            ) -> tuple[float, float, float]:
  """AUC(a) - AUC(b) of two scorings of the SAME rows, with DeLong's paired interval.

  The variance of the difference is var(V10_a - V10_b) / n_pos + var(V01_a - V01_b) / n_neg
  (DeLong, DeLong and Clarke-Pearson, 1988, Sect. 3: the covariance of the two AUCs comes from
  the shared rows), so a comparison on the same rows is sharper than two separate intervals.

  Returns:
    (difference, low, high), clipped to [-1, 1].
  """
  if not 0.0 < confidence < 1.0:
    raise ValueError(f'confidence must be in (0, 1) (got {confidence})')
  a10, a01 = delong_components(scores_a, labels)
  b10, b01 = delong_components(scores_b, labels)
  diff, half = _delong_half_width(a10 - b10, a01 - b01, confidence)
  return diff, max(-1.0, diff - half), min(1.0, diff + half)


def log_auc(scores, labels, min_fpr: float = 1e-3) -> float:
  """Area under the ROC curve with a log-scale FPR axis, normalised to [0, 1].

  Definition: `(1 / L) * integral over u in [log10(min_fpr), 0] of TPR(10^u) du`,
  with `L = -log10(min_fpr)` and TPR(f) the piecewise-linear ROC curve of
  `roc_curve` (the curve whose ordinary area is `roc_auc`). The integral is exact
  (each linear segment integrates in closed form in u). A perfect attack scores
  1; a random guesser (TPR = FPR) scores `(1 - min_fpr) / (L ln 10)`
  (0.1446 for min_fpr = 1e-3). It weights the low-FPR region, where
  membership inference matters, much more than `roc_auc` does.
  """
  if not 0.0 < min_fpr < 1.0:
    raise ValueError(f'min_fpr must be in (0, 1) (got {min_fpr})')
  fpr, tpr, _ = roc_curve(scores, labels)
  f0, f1, t0, t1 = fpr[:-1], fpr[1:], tpr[:-1], tpr[1:]
  lo, hi = np.maximum(f0, min_fpr), np.minimum(f1, 1.0)
  keep = hi > lo  # drops vertical segments and those entirely below min_fpr
  f0, f1, t0, t1, lo, hi = (a[keep] for a in (f0, f1, t0, t1, lo, hi))
  slope = (t1 - t0) / (f1 - f0)
  intercept = t0 - slope * f0
  # integral of (intercept + slope * 10^u) du over [log10 lo, log10 hi], segment by segment.
  total = np.sum(intercept * (np.log10(hi) - np.log10(lo)) + slope * (hi - lo) / math.log(10.0))
  return float(total / -math.log10(min_fpr))


def tpr_at_fpr(scores, labels, fpr: float | Sequence[float]):
  """TPR of the best threshold whose FPR does not exceed the target.

  Interpolation: none. It is the largest TPR over the ROC points of `roc_curve`
  with FPR <= target (the step function a real threshold achieves; no
  randomised mixing of two thresholds), so it is never optimistic. With fewer
  than 1 / target negatives the only admissible point may be (0, 0): report the
  number of negatives beside it.

  Args:
    scores: float array, higher = more likely positive.
    labels: 0/1 or bool array.
    fpr: one target or a sequence of targets in [0, 1].

  Returns:
    A float for a scalar target, else a numpy array.
  """
  roc_fpr, roc_tpr, _ = roc_curve(scores, labels)
  targets = np.asarray(fpr, dtype=np.float64)
  if np.any((targets < 0) | (targets > 1)):
    raise ValueError(f'fpr targets must be in [0, 1] (got {fpr})')
  # roc_fpr is non-decreasing and roc_tpr too, so the last admissible point is
  # the best; a tiny slack absorbs rounding in fps / n_neg.
  idx = np.searchsorted(roc_fpr, targets * (1 + 1e-12), side='right') - 1
  out = roc_tpr[idx]
  return float(out) if out.ndim == 0 else out


def hypervolume(points, reference, maximize: Sequence[bool] = (False, False)
                ) -> float:
  """Hypervolume of a 2-D front w.r.t. a reference point (Definition 1 of FedMIA).

  Eq. (13) of the FedMIA paper: the Lebesgue measure of the union over points y
  of the boxes between y and the reference z. The paper minimises both
  objectives (privacy leakage and utility loss, z = (1, 100%)), so z bounds the
  objectives from above; that is the default. `maximize[i] = True` flips
  objective i (e.g. accuracy, where z is then a lower bound). Larger is better.
  Points that do not strictly improve on z in both objectives add nothing.

  Args:
    points: array [m, 2] of objective values.
    reference: the reference point z, length 2.
    maximize: per objective, whether larger values are better.

  Returns:
    The hypervolume (0.0 for an empty front).
  """
  pts = np.asarray(points, dtype=np.float64).reshape(-1, 2)
  ref = np.asarray(reference, dtype=np.float64).reshape(2)
  if len(maximize) != 2:
    raise ValueError(f'maximize needs 2 entries (got {maximize})')
  sign = np.where(np.asarray(maximize, dtype=bool), -1.0, 1.0)
  pts, ref = pts * sign, ref * sign  # now both objectives are minimised
  pts = pts[np.all(pts < ref, axis=1)]
  if pts.size == 0:
    return 0.0
  pts = pts[np.lexsort((pts[:, 1], pts[:, 0]))]
  volume, best_y = 0.0, ref[1]
  for x, y in pts:
    if y < best_y:
      volume += (ref[0] - x) * (best_y - y)
      best_y = y
  return float(volume)
