"""Intervals over what varies: R replicated trainings, their target clients and their queries.

`eval.bootstrap` and `eval.paired` resample the queries of one trained federation, so their
intervals are conditional on that training (its partition, initialisation and client keys)
and on its target clients. A claim about an attack is a claim about the distribution those
are drawn from. Here every replicate r = 1 .. R is one independent training; its entries are
(target client k, query q) pairs, every query scored against every client's upload (label 1
when k owns q), as `attacks.passive.evaluate.final_scores` returns them.

Estimand and estimator. The estimand is the expected value, over trainings, of a statistic
computed on one training's entries (its AUC, its TPR at a low FPR with the threshold chosen
on its entries): theta = E_r[stat(entries of r)] for the design that was run (same number of
clients and queries). The point estimate is the mean of the R per-replicate values, unbiased
for theta because the trainings are independent and identically distributed.

Intervals, each at `confidence` (two-sided):
- t-interval over the per-replicate values: mean +- t_{(1+c)/2, R-1} sd / sqrt(R) (Student,
  R - 1 degrees of freedom; NaN for R = 1). Valid whatever the dependence inside a training,
  since the replicates themselves are independent; approximate only through the normality
  of the per-replicate values.
- Hierarchical bootstrap (Davison and Hinkley, 1997, Sect. 3.8, resampling at both stages):
  draw R replicates with replacement; within each drawn replicate draw its target clients
  and, independently, its queries with replacement. Clients and queries are crossed, not
  nested (every query is scored against every client), so the within-replicate stage is the
  two-way "pigeonhole" bootstrap of Owen (2007, "The pigeonhole bootstrap", Ann. Appl. Stat.
  1(2)): entry (k, q) gets weight c_k * c_q, the product of its client's and its query's
  multiplicities. The statistic is recomputed on every resample with the threshold
  re-selected (as `eval.bootstrap` does), averaged over the drawn replicates, and the
  interval is the percentile interval of those averages.
- For TPR at a low FPR also Clopper-Pearson on the pooled counts: members of all replicates
  at or above the threshold chosen on all entries pooled, out of all members. With a handful
  of true positives the percentile bootstrap under-covers (its resamples cannot put mass
  where the data have none); the exact binomial interval does not, though it ignores the
  dependence between entries. The union of it and the interval `interval_method` names is
  reported: the two are centred on different estimates (the pooled TPR, the mean of the
  per-replicate TPRs), so the wider alone could leave out the reported mean.

Which interval is reported is `interval_method`: 't' for every R >= 2,
'two_way_bootstrap_conditional' for R = 1 (one training: the pigeonhole bootstrap of that
training, conditional on it; its t-interval is NaN). `benchmarks/coverage_simulation.py`
(benchmarks/README.md, "Coverage of the intervals") checks the choice on a generative model
whose training effect is fitted to the measured FedMIA and PASTEL runs (none shown: the
spread over replicates is at most the within-training query variance): the t-interval
covered 94-96% at R = 3 and 10 for the AUC, an AUC difference, the TPR at 0.1% FPR and the
paired TPR difference, while the hierarchical bootstrap over-covered (99.6-100%, about 1.75
times the t-interval's width at R = 10: resampling at both stages counts the
within-training variance twice, Davison and Hinkley, 1997, Sect. 3.8); under an invented
training effect of 3-5 times the within variance the t-interval still covered 95-96% and the
bootstrap 93% for a difference at R = 3 (three replicates give ten distinct outer resamples).
The bootstrap is still computed on request (`resample=True`) and reported under `_boot_`.

Degenerate intervals. R values that agree (a rate of a few discrete counts, equal in every
training) have sample sd 0 and a t-interval of zero width, which says nothing about the
spread over trainings; float sums of equal values differ by a few ulps, so agreement is judged
within `EQUAL_TOL` (`all_equal`), and such values get an interval of exactly zero width, no t
statistic and no p-value (NaN), and `paired.verdict` reads them as 'not estimable'.

Tests. `t_test` gives the one-sample t statistic of the per-replicate differences and its
two-sided p-value (scipy.stats.ttest_1samp), the test the t-interval inverts: p < 1 - c exactly
when the interval excludes 0. `holm_family` adjusts the p-values of a family of claims (Holm,
1979, "A simple sequentially rejective multiple test procedure", Scand. J. Statist. 6(2)).
"""

from __future__ import annotations

import types
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import stats as sps

from fl_privacy.eval import bootstrap
from fl_privacy.eval import metrics as metrics_lib
from fl_privacy.eval import paired
from fl_privacy.eval import stats

# Largest resamples x entries weighed at once (float64 working arrays of this many elements).
CHUNK_ELEMENTS = 1 << 22
# Largest spread, relative to max(1, |value|), of R values taken as equal: float sums of one
# count in another order differ by ~1e-16 per term, and an AUC moves by at least
# 1 / (members x non-members) (5e-8 at FedMIA's 320 x 60,000 entries), far above it.
EQUAL_TOL = 1e-11
DEFAULT_FPRS = types.MappingProxyType({'tpr_at_fpr_1e-2': 1e-2, 'tpr_at_fpr_1e-3': 1e-3})
FIELDS = ('scores', 'labels', 'target', 'groups')


class _Replicate:
  """One replicate's checked entries, sorted once by score (ascending) for every resample."""

  def __init__(self, rep: Mapping[str, Any], index: int):
    missing = [f for f in FIELDS if f not in rep]
    if missing:
      raise ValueError(f'replicate {index} lacks {missing}')
    self.scores = np.asarray(rep['scores'], np.float64).reshape(-1)
    self.labels = np.asarray(rep['labels']).reshape(-1)
    if self.labels.dtype != bool and not np.all((self.labels == 0) | (self.labels == 1)):
      raise ValueError(f'replicate {index}: labels must be 0/1 or bool')
    self.labels = self.labels.astype(bool)
    self.target_ids = np.asarray(rep['target']).reshape(-1)
    self.group_ids = np.asarray(rep['groups']).reshape(-1)
    n = self.scores.size
    if not (self.labels.size == self.target_ids.size == self.group_ids.size == n):
      raise ValueError(f'replicate {index}: scores, labels, target and groups differ in length '
                       f'({n}, {self.labels.size}, {self.target_ids.size}, '
                       f'{self.group_ids.size})')
    if np.isnan(self.scores).any():
      raise ValueError(f'replicate {index}: scores contain NaN')
    if self.labels.all() or not self.labels.any():
      raise ValueError(f'replicate {index} needs both members and non-members')
    self.target, self.num_targets = bootstrap.group_index(self.target_ids)
    self.group, self.num_groups = bootstrap.group_index(self.group_ids)
    self.order = np.argsort(self.scores, kind='mergesort')
    s = self.scores[self.order]
    y_sorted = self.labels[self.order]
    self.is_member = y_sorted
    self.members = np.flatnonzero(y_sorted)
    self.y_float = y_sorted.astype(np.float64)
    # Compared, not differenced: equal infinite scores are one run (inf - inf is NaN).
    run_end = np.r_[np.nonzero(s[1:] != s[:-1])[0], s.size - 1]
    self.run_start = np.r_[0, run_end[:-1] + 1]
    self.ties = run_end.size < s.size
    # Non-member entries in the runs from the top down, for the tail a low FPR can reach.
    self._negatives_from_top = np.cumsum(
        np.add.reduceat((~y_sorted).astype(np.int64), self.run_start)[::-1])

  def tail_runs(self, fpr: float) -> int:
    """Runs from the top holding well over `fpr` of the non-member entries (all runs when
    that is most of them): a low FPR's threshold sits among them unless the weights move
    much non-member weight into the top."""
    total = int(self._negatives_from_top[-1])
    need = min(total, int(np.ceil(3 * fpr * total)) + 100)
    return min(int(np.searchsorted(self._negatives_from_top, need)) + 1,
               self._negatives_from_top.size)


def _check(reps: Sequence[Mapping[str, Any]]) -> list[_Replicate]:
  if isinstance(reps, Mapping) or len(reps) == 0:
    raise ValueError('reps must be a non-empty list of per-replicate dicts')
  return [_Replicate(rep, i) for i, rep in enumerate(reps)]


def _sorted_statistics(rep: _Replicate, w: np.ndarray, fprs: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
  """(AUC [b], TPR [F, b]) of entry weights `w` [b, N] given in `rep.order`.

  AUC: sum_{i pos, j neg} w_i w_j ([s_i > s_j] + [s_i = s_j] / 2) / (W_pos W_neg), the
  Mann-Whitney statistic of the entries copied w times. TPR at f: ROC points at every run
  of equal scores ("member iff score >= run's score"), FPR = weighted false positives /
  W_neg, the largest TPR with FPR <= f (0 at the (0, 0) point only), `metrics.tpr_at_fpr`'s
  rule. Float64 sums of integer weights are exact below 2^53.
  """
  w = w.astype(np.float64, copy=False)
  if rep.ties:
    pos = np.add.reduceat(w * rep.y_float, rep.run_start, axis=1)  # weight of each run
    neg = np.add.reduceat(w, rep.run_start, axis=1) - pos
    neg_cum = np.cumsum(neg, axis=1)
    total_pos = pos.sum(axis=1)
    # A run's members beat the non-members below it and tie with half of its own.
    beaten = (pos * (neg_cum - neg / 2.0)).sum(axis=1)
  else:
    # One entry a run: a member beats the non-member weight below it, read at the members
    # only (about 1 / K of the entries).
    pos = None
    neg = np.where(rep.is_member, 0.0, w)
    neg_cum = np.cumsum(neg, axis=1)
    member_w = w[:, rep.members]
    total_pos = member_w.sum(axis=1)
    beaten = (member_w * neg_cum[:, rep.members]).sum(axis=1)
  total_neg = neg_cum[:, -1]
  tprs = np.empty((fprs.size, w.shape[0]))
  with np.errstate(invalid='ignore', divide='ignore'):
    auc = beaten / (total_pos * total_neg)
    if fprs.size:
      num_runs = neg.shape[1]

      def tail(rows, length):
        top = slice(num_runs - length, None)
        run_pos = pos[rows, top] if pos is not None else w[rows, top] * rep.y_float[top]
        return _tail_tprs(run_pos, neg[rows, top], neg_cum[rows, top], total_pos[rows],
                          total_neg[rows], fprs)

      length = rep.tail_runs(float(fprs.max()))
      tprs[:], full = tail(slice(None), length)
      # Rows whose whole tail is admissible may admit runs below it: redone on all runs.
      redo = np.flatnonzero(full) if length < num_runs else np.zeros(0, int)
      if redo.size:
        tprs[:, redo], _ = tail(redo, num_runs)
  bad = (total_pos == 0) | (total_neg == 0)
  auc[bad] = np.nan
  tprs[:, bad] = np.nan
  return auc, tprs


def _tail_tprs(pos, neg, neg_cum, total_pos, total_neg, fprs):
  """TPRs [F, b] from the top L runs (`pos`, `neg`, `neg_cum` [b, L] in ascending order of
  score), and whether all L are admissible at max(fprs) [b] (then lower runs might be too).

  From the top down, the false positives of the threshold at a run (non-member weight at or
  above it) are non-decreasing, so the admissible runs are the first ones and the best TPR
  is the member weight down to the last of them.
  """
  fp = (total_neg[:, None] - neg_cum + neg)[:, ::-1]
  tp = np.cumsum(pos[:, ::-1], axis=1)
  out = np.empty((fprs.size, pos.shape[0]))
  full = np.zeros(pos.shape[0], bool)
  for i, f in enumerate(fprs):
    admissible = (fp <= (f * (1 + 1e-12)) * total_neg[:, None]).sum(axis=1)
    best = np.take_along_axis(tp, np.maximum(admissible - 1, 0)[:, None], 1)[:, 0]
    out[i] = np.where(admissible > 0, best / total_pos, 0.0)
    if f == fprs.max():
      full = admissible == pos.shape[1]
  return out, full


def _weights_rows(weights, n: int) -> np.ndarray:
  w = np.asarray(weights)
  if w.ndim not in (1, 2) or w.shape[-1] != n:
    raise ValueError(f'weights must be [N] or [B, N] with N = {n} (got {w.shape})')
  if (w < 0).any():
    raise ValueError('weights must be non-negative')
  return np.atleast_2d(w)


def weighted_auc(scores, labels, weights) -> np.ndarray | float:
  """AUC with integer entry weights: the Mann-Whitney statistic of the entries each copied
  w_e times (ties count one half), equal to `sklearn.metrics.roc_auc_score(...,
  sample_weight=w)`.

  Args:
    scores: [N] scores, higher = member.
    labels: [N] 1 member, 0 non-member.
    weights: [N] or [B, N] non-negative weights (one row per resample).

  Returns:
    A float for [N] weights, else [B]; NaN where a row weighs no member or no non-member.
  """
  return _weighted(scores, labels, weights, np.zeros(0))[0]


def weighted_tpr_at_fpr(scores, labels, fpr, weights) -> np.ndarray | float:
  """TPR at `fpr` of the entries each copied w_e times, `metrics.tpr_at_fpr`'s rule (largest
  TPR over the ROC points with FPR <= fpr).

  Args:
    scores: [N] scores, higher = member.
    labels: [N] 1 member, 0 non-member.
    fpr: target FPR in [0, 1], or a sequence of them.
    weights: [N] or [B, N] non-negative weights.

  Returns:
    For [N] weights a float ([F] for F FPRs); for [B, N] weights [B] ([F, B]).
  """
  fprs = np.atleast_1d(np.asarray(fpr, np.float64))
  if fprs.ndim != 1 or not ((0.0 <= fprs) & (fprs <= 1.0)).all():
    raise ValueError(f'fpr must be in [0, 1] (got {fpr})')
  tprs = _weighted(scores, labels, weights, fprs)[1]
  return tprs if np.ndim(fpr) else tprs[0]


def _weighted(scores, labels, weights, fprs):
  s = np.asarray(scores).reshape(-1)
  n = s.size
  rep = _Replicate(dict(scores=s, labels=labels, target=np.zeros(n), groups=np.zeros(n)), 0)
  w = _weights_rows(weights, n)
  aucs, tprs = np.empty(w.shape[0]), np.empty((fprs.size, w.shape[0]))
  step = max(1, CHUNK_ELEMENTS // max(n, 1))
  for start in range(0, w.shape[0], step):
    rows = slice(start, start + step)
    aucs[rows], tprs[:, rows] = _sorted_statistics(rep, w[rows][:, rep.order], fprs)
  if np.ndim(weights) == 1:
    return float(aucs[0]), tprs[:, 0] if fprs.size else tprs
  return aucs, tprs


def all_equal(values) -> bool:
  """Whether finite `values` agree within EQUAL_TOL x max(1, |value|): a sample whose sd
  is rounding, not spread."""
  v = np.asarray(values, np.float64).reshape(-1)
  return bool(v.size > 0 and np.ptp(v) <= EQUAL_TOL * max(1.0, float(np.abs(v).max())))


def t_interval(values, confidence: float = 0.95, bounds: tuple[float, float] | None = None
               ) -> tuple[float, float, float]:
  """(mean, low, high): Student's t-interval over independent replicate values.

  mean +- t_{(1 + confidence) / 2, R - 1} * sd / sqrt(R), sd the sample standard deviation
  (ddof 1); NaN limits for R < 2; exactly [mean, mean] when the values are `all_equal`
  (a degenerate interval: module docstring). `bounds` clips the limits to the range of the
  quantity (an AUC or a rate in [0, 1]), which never lowers coverage of a value inside it.
  """
  v = np.asarray(values, np.float64).reshape(-1)
  if not 0.0 < confidence < 1.0:
    raise ValueError(f'confidence must be in (0, 1) (got {confidence})')
  if v.size == 0 or np.isnan(v).any():
    return float('nan'), float('nan'), float('nan')
  mean = float(v.mean())
  if v.size < 2:
    return mean, float('nan'), float('nan')
  if all_equal(v):
    return mean, mean, mean
  half = float(sps.t.ppf((1.0 + confidence) / 2.0, v.size - 1) * v.std(ddof=1)
               / np.sqrt(v.size))
  low, high = mean - half, mean + half
  if bounds is not None:
    low, high = max(low, bounds[0]), min(high, bounds[1])
  return mean, low, high


def t_test(values) -> tuple[float, float]:
  """(t, p): the one-sample t statistic of H0 "mean 0" over independent replicate values
  and its two-sided p-value on R - 1 degrees of freedom (scipy.stats.ttest_1samp), the test
  `t_interval` inverts. NaN for R < 2, a NaN value, or `all_equal` values (sd 0: no test)."""
  v = np.asarray(values, np.float64).reshape(-1)
  if v.size < 2 or np.isnan(v).any() or all_equal(v):
    return float('nan'), float('nan')
  res = sps.ttest_1samp(v, 0.0)
  return float(res.statistic), float(res.pvalue)


def holm_family(rows: Sequence[Mapping[str, Any]], quantities: Sequence[str] = ('auc', 'tpr'),
                alpha: float = 0.05) -> list[dict[str, Any]]:
  """`compare`'s rows with every claim of the family adjusted together (Holm, 1979).

  The family is every (row, quantity): m = len(rows) x len(quantities) tests of "A - B has
  mean 0", each p-value `<quantity>_diff_p` from the per-replicate t statistic. A claim with no
  p-value (NaN: one training, or a degenerate interval) still counts in m, so the others are
  adjusted as if it had been tested.

  Returns:
    Copies of the rows with `family_size` = m and, per quantity, `<q>_p_holm` (Holm's adjusted
    p-value, `paired.holm`) and `<q>_verdict_holm` (`paired.p_verdict` at family-wise
    level 1 - alpha).
  """
  p = [float(r.get(f'{q}_diff_p', float('nan'))) for r in rows for q in quantities]
  adjusted = iter(paired.holm(p))
  out = []
  for r in rows:
    row = dict(r, family_size=len(p))
    for q in quantities:
      a = float(next(adjusted))
      row[f'{q}_p_holm'] = a
      row[f'{q}_verdict_holm'] = paired.p_verdict(float(r[f'{q}_diff']), a, alpha)
    out.append(row)
  return out


def interval_method(num_trainings: int) -> str:
  """The interval reported for R trainings (module docstring): Student's t for R >= 2."""
  if num_trainings < 1:
    raise ValueError(f'num_trainings must be positive (got {num_trainings})')
  if num_trainings == 1:
    return 'two_way_bootstrap_conditional'
  return 't'


def hierarchical_resamples(attacks: Sequence[Sequence[_Replicate]], fprs: np.ndarray, *,
                           rng: np.random.Generator, num_resamples: int
                           ) -> list[tuple[np.ndarray, np.ndarray]]:
  """Per attack, (AUC [B], TPR [F, B]) of B hierarchical resamples (module docstring).

  `attacks[a][r]` is attack a's replicate r; all attacks share every draw (the outer
  replicates, the client and the query multiplicities), so differences are paired. Slot j of
  resample b holds replicate slots[b, j] with its own client and query draws: a replicate
  drawn twice is resampled twice, independently (Davison and Hinkley's strategy of resampling
  at both stages). The statistic of a resample is the mean over its R slots.
  """
  reps = attacks[0]
  num_reps = len(reps)
  slots = rng.integers(0, num_reps, size=(num_resamples, num_reps))
  per_slot = [(np.empty((num_resamples, num_reps)),
               np.empty((fprs.size, num_resamples, num_reps))) for _ in attacks]
  for r, rep in enumerate(reps):
    b_idx, j_idx = np.nonzero(slots == r)
    if b_idx.size == 0:
      continue
    # Float multiplicities: the weights' products and sums stay exact integers below 2^53.
    clients = bootstrap.resample_counts(rep.num_targets, b_idx.size, rng).astype(np.float64)
    queries = bootstrap.resample_counts(rep.num_groups, b_idx.size, rng).astype(np.float64)
    step = max(1, CHUNK_ELEMENTS // max(rep.scores.size, 1))
    for start in range(0, b_idx.size, step):
      rows = slice(start, start + step)
      # Owen's pigeonhole weights: entry (k, q) copied c_k * c_q times.
      w = clients[rows][:, rep.target] * queries[rows][:, rep.group]
      for a, attack in enumerate(attacks):
        auc, tprs = _sorted_statistics(attack[r], w[:, attack[r].order], fprs)
        per_slot[a][0][b_idx[rows], j_idx[rows]] = auc
        per_slot[a][1][:, b_idx[rows], j_idx[rows]] = tprs
  return [(auc.mean(axis=1), tprs.mean(axis=2)) for auc, tprs in per_slot]


def _percentile(values: np.ndarray, confidence: float) -> tuple[float, float]:
  v = values[~np.isnan(values)]
  if v.size == 0:
    return float('nan'), float('nan')
  tail = (1.0 - confidence) / 2.0
  low, high = np.quantile(v, [tail, 1.0 - tail])
  return float(low), float(high)


def _reported(method: str, t: tuple[float, float], boot: tuple[float, float]
              ) -> tuple[float, float]:
  return t if method == 't' else boot


def _bootstraps(resample: bool | None, method: str) -> bool:
  return method != 't' if resample is None else bool(resample)


def _check_resampling(num_resamples: int, confidence: float) -> None:
  if num_resamples < 1:
    raise ValueError(f'num_resamples must be positive (got {num_resamples})')
  if not 0.0 < confidence < 1.0:
    raise ValueError(f'confidence must be in (0, 1) (got {confidence})')


def metrics(reps: Sequence[Mapping[str, Any]], *, rng: np.random.Generator,
            num_resamples: int = 1000, fprs: Mapping[str, float] = DEFAULT_FPRS,
            confidence: float = 0.95, resample: bool | None = None) -> dict[str, Any]:
  """AUC and TPR at low FPRs over R replicated trainings, with intervals (module docstring).

  Args:
    reps: R dicts of equal-length [N_r] arrays `scores` (higher = member), `labels` (1
      member), `target` (target client of the entry), `groups` (query of the entry).
    rng: numpy Generator of the hierarchical bootstrap.
    num_resamples: B.
    fprs: name -> target FPR of each TPR reported.
    confidence: two-sided level of every interval.
    resample: run the hierarchical bootstrap; None (default) only where `interval_method`
      reports it (R = 1): about 5 s a call at 3 x 60,000
      entries, which a sweep of hundreds of points reporting the t-interval need not pay.
      Without it the `_boot_` fields are NaN and `num_resamples` is 0.

  Returns:
    `num_trainings`, `num_targets` and `num_queries` (distinct per replicate, summed),
    `num_entries`, `num_members`, `num_nonmembers`, `interval_method`, `confidence`,
    `num_resamples` (resamples holding both classes in every slot); `auc` (mean over
    replicates), `auc_replicates`, `auc_t_low/high`, `auc_boot_low/high`, `auc_low/high` (the
    interval of `interval_method`); for each FPR name: `<name>`, `<name>_replicates`,
    `<name>_t_low/high`, `<name>_boot_low/high`, `<name>_pooled` (TPR of all entries pooled,
    one threshold) with `<name>_members_above` (its true positives), `<name>_cp_low/high`
    (Clopper-Pearson on those counts), `<name>_low/high` (the union of the
    `interval_method` interval and Clopper-Pearson), `<name>_interval` (`interval_method`,
    'clopper_pearson' when that interval is NaN, or '<method>+clopper_pearson' when
    Clopper-Pearson widened it),
    `<name>_distinct_negatives` (`bootstrap.distinct_negatives` per replicate, summed).
  """
  _check_resampling(num_resamples, confidence)
  names = list(fprs)
  targets = np.asarray([fprs[n] for n in names], np.float64)
  checked = _check(reps)
  method = interval_method(len(checked))
  if _bootstraps(resample, method):
    (boot_auc, boot_tprs), = hierarchical_resamples([checked], targets, rng=rng,
                                                    num_resamples=num_resamples)
  else:
    boot_auc, boot_tprs = np.full(0, np.nan), np.full((targets.size, 0), np.nan)
  pooled_scores = np.concatenate([r.scores for r in checked])
  pooled_labels = np.concatenate([r.labels for r in checked])
  num_members = int(pooled_labels.sum())
  out: dict[str, Any] = dict(
      num_trainings=len(checked), num_targets=sum(r.num_targets for r in checked),
      num_queries=sum(r.num_groups for r in checked), num_entries=int(pooled_scores.size),
      num_members=num_members, num_nonmembers=int(pooled_scores.size - num_members),
      interval_method=method, confidence=confidence,
      num_resamples=int((~np.isnan(boot_auc) & ~np.isnan(boot_tprs).any(axis=0)).sum()))
  aucs = [metrics_lib.roc_auc(r.scores, r.labels) for r in checked]
  out['auc'], *t = t_interval(aucs, confidence, (0.0, 1.0))
  boot = _percentile(boot_auc, confidence)
  out.update(auc_replicates=aucs, auc_t_low=t[0], auc_t_high=t[1], auc_boot_low=boot[0],
             auc_boot_high=boot[1])
  out['auc_low'], out['auc_high'] = _reported(method, tuple(t), boot)
  pooled_tprs = np.atleast_1d(metrics_lib.tpr_at_fpr(pooled_scores, pooled_labels, targets))
  for i, (name, f) in enumerate(zip(names, targets)):
    values = [float(metrics_lib.tpr_at_fpr(r.scores, r.labels, float(f))) for r in checked]
    out[name], *t = t_interval(values, confidence, (0.0, 1.0))
    boot = _percentile(boot_tprs[i], confidence)
    hits = int(round(pooled_tprs[i] * num_members))
    cp = stats.clopper_pearson(hits, num_members, confidence)
    out.update({f'{name}_replicates': values, f'{name}_t_low': t[0], f'{name}_t_high': t[1],
                f'{name}_boot_low': boot[0], f'{name}_boot_high': boot[1],
                f'{name}_pooled': float(pooled_tprs[i]), f'{name}_members_above': hits,
                f'{name}_cp_low': cp[0], f'{name}_cp_high': cp[1],
                f'{name}_distinct_negatives': sum(
                    bootstrap.distinct_negatives(r.scores, r.labels, r.group_ids, float(f))
                    for r in checked)})
    (out[f'{name}_low'], out[f'{name}_high'], out[f'{name}_interval']) = _with_clopper_pearson(
        method, _reported(method, tuple(t), boot), cp)
  return out


def _with_clopper_pearson(method: str, interval: tuple[float, float],
                          cp: tuple[float, float]) -> tuple[float, float, str]:
  """(low, high, label): the union of `method`'s interval and Clopper-Pearson's, labelled
  '<method>+clopper_pearson' only where Clopper-Pearson reaches strictly past it; a NaN
  interval (the t-interval of one training) leaves Clopper-Pearson alone."""
  low, high = interval
  if np.isnan(low) or np.isnan(high):
    return cp[0], cp[1], 'clopper_pearson'
  widened = cp[0] < low or cp[1] > high
  return (min(low, cp[0]), max(high, cp[1]),
          f'{method}+clopper_pearson' if widened else method)


def compare(reps_a: Sequence[Mapping[str, Any]], reps_b: Sequence[Mapping[str, Any]], *,
            rng: np.random.Generator, num_resamples: int = 1000, fpr: float = 1e-3,
            confidence: float = 0.95, resample: bool | None = None) -> dict[str, Any]:
  """A minus B over R replicated trainings, paired on the same entries (module docstring).

  Args:
    reps_a, reps_b: the two attacks' R replicates (dicts as in `metrics`); replicate r of
      both must hold the same entries in the same order (labels, target and groups equal).
    rng: numpy Generator of the hierarchical bootstrap (one set of draws for both attacks).
    num_resamples: B.
    fpr: the low FPR of the TPR comparison.
    confidence: two-sided level.
    resample: as in `metrics` (None: only where it is the reported interval).

  Returns:
    `num_trainings`, `interval_method`, `confidence`, `fpr`, `num_resamples`; `auc_a`, `auc_b`
    (means over replicates), `auc_diff` (mean of the per-replicate A - B),
    `auc_diff_replicates`, `auc_diff_t_low/high`, `auc_diff_boot_low/high`,
    `auc_diff_low/high` (the interval of `interval_method`), `auc_verdict`
    (`paired.verdict` of it: 'not estimable' for a degenerate interval), `auc_diff_t_stat`
    and `auc_diff_p` (`t_test` of the per-replicate differences; NaN where it has none); the
    same with `tpr_` for TPR at `fpr`.

  Raises:
    ValueError: different numbers of replicates, or a replicate whose labels, targets or
      groups differ between A and B.
  """
  _check_resampling(num_resamples, confidence)
  a, b = _check(reps_a), _check(reps_b)
  if len(a) != len(b):
    raise ValueError(f'A has {len(a)} replicates and B {len(b)}')
  for r, (ra, rb) in enumerate(zip(a, b)):
    for field, x, y in (('labels', ra.labels, rb.labels), ('target', ra.target_ids,
                                                           rb.target_ids),
                        ('groups', ra.group_ids, rb.group_ids)):
      if x.shape != y.shape or not np.array_equal(x, y):
        raise ValueError(f'replicate {r}: A and B differ in {field}; a paired comparison '
                         'needs the same entries in the same order')
  method = interval_method(len(a))
  targets = np.asarray([fpr], np.float64)
  if _bootstraps(resample, method):
    (auc_a, tpr_a), (auc_b, tpr_b) = hierarchical_resamples([a, b], targets, rng=rng,
                                                            num_resamples=num_resamples)
  else:
    auc_a = auc_b = np.full(0, np.nan)
    tpr_a = tpr_b = np.full((1, 0), np.nan)
  boot_diffs = dict(auc=auc_a - auc_b, tpr=tpr_a[0] - tpr_b[0])
  out: dict[str, Any] = dict(num_trainings=len(a), interval_method=method,
                             confidence=confidence, fpr=float(fpr),
                             num_resamples=int((~np.isnan(boot_diffs['auc'])
                                                & ~np.isnan(boot_diffs['tpr'])).sum()))
  values = {
      'auc': ([metrics_lib.roc_auc(r.scores, r.labels) for r in a],
              [metrics_lib.roc_auc(r.scores, r.labels) for r in b]),
      'tpr': ([float(metrics_lib.tpr_at_fpr(r.scores, r.labels, fpr)) for r in a],
              [float(metrics_lib.tpr_at_fpr(r.scores, r.labels, fpr)) for r in b])}
  for name, (va, vb) in values.items():
    diffs = [x - y for x, y in zip(va, vb)]
    out[f'{name}_a'], out[f'{name}_b'] = float(np.mean(va)), float(np.mean(vb))
    out[f'{name}_diff'], *t = t_interval(diffs, confidence, (-1.0, 1.0))
    boot = _percentile(boot_diffs[name], confidence)
    low, high = _reported(method, tuple(t), boot)
    t_stat, p = t_test(diffs)
    out.update({f'{name}_diff_t_stat': t_stat, f'{name}_diff_p': p,
                f'{name}_diff_replicates': diffs, f'{name}_diff_t_low': t[0],
                f'{name}_diff_t_high': t[1], f'{name}_diff_boot_low': boot[0],
                f'{name}_diff_boot_high': boot[1], f'{name}_diff_low': low,
                f'{name}_diff_high': high, f'{name}_verdict': paired.verdict(low, high)})
  return out
