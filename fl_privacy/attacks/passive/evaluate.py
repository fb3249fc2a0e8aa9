"""Metrics of the passive attacks: pooled over targets, with intervals and per-target extremes.

`evaluate(recording, owner, attack, ...)` turns a recording into the metrics the FedMIA
pipeline stores: AUC with DeLong's 95% interval, log-AUC, TPR at 1% and 0.1% FPR with
Clopper-Pearson intervals on the member count above the threshold, the numbers of members and
non-members, the smallest and largest per-target AUC and TPR@0.1% FPR, and for FedMIA the
fraction of shadow values the outlier filter removed.

Honest low-FPR statistics: the pooled evaluation scores every query once per target, so its
entries are not independent. Given the query of each entry (`groups`, `scores.pooled_queries`)
`score_metrics` adds `n_neg_distinct` (distinct non-member queries), for each TPR at low FPR
`<name>_distinct_negatives` (distinct non-member queries among the false positives at its
threshold, `eval.bootstrap.distinct_negatives`) and, given a Generator, the query-cluster
percentile bootstrap interval `<name>_boot_low` / `<name>_boot_high` (threshold re-selected on
every resample, `eval.bootstrap`), beside the Clopper-Pearson `<name>_ci_low/_ci_high`, which
treat the entries as independent. `recording_metrics` adds what a
results point of the FedMIA pipeline carries besides: the trained model's test accuracy and
the defense's DP metrics.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fl_privacy.attacks.passive import rmia
from fl_privacy.attacks.passive import scores as scores_lib
from fl_privacy.eval import auditing
from fl_privacy.eval import bootstrap
from fl_privacy.eval import metrics as metrics_lib
from fl_privacy.eval import paired
from fl_privacy.eval import stats

FPRS = {'tpr_at_fpr_1e-2': 1e-2, 'tpr_at_fpr_1e-3': 1e-3}
# Resamples of the query-cluster bootstrap of TPR at low FPR (`score_metrics`).
BOOT_RESAMPLES = 1000


def top_ties(scores: np.ndarray, labels: np.ndarray) -> dict[str, int]:
  """How many entries share the largest score: `top_tied`, and of them non-members,
  `top_tied_negatives`.

  A TPR at low FPR is read at a threshold of the ROC, where tied scores are one step
  (`eval.metrics.roc_curve`): a tie is never broken in the members' favour, so when the top
  tie holds more non-members than the FPR allows (top_tied_negatives > fpr n_neg) no
  threshold above 0 is admissible and the TPR is 0, whatever the members in the tie. Reported
  beside the rates so that a reader sees when a rate rests on a tie (RMIA's scores are
  fractions of a finite population and tie at the top).
  """
  s = np.asarray(scores, np.float64)
  labels = np.asarray(labels).astype(bool)
  top = s == s.max()
  return {'top_tied': int(top.sum()), 'top_tied_negatives': int((top & ~labels).sum())}


def score_metrics(scores: np.ndarray, labels: np.ndarray,
                  target: np.ndarray | None = None, groups: np.ndarray | None = None,
                  rng: np.random.Generator | None = None,
                  num_resamples: int = BOOT_RESAMPLES) -> dict[str, float]:
  """AUC (DeLong interval), log-AUC, TPR at low FPR (Clopper-Pearson), counts, per-target range.

  Args:
    scores: [N] final scores, higher = member.
    labels: [N] 1 member, 0 non-member.
    target: optional [N] target client of each entry, for per-target extremes.
    groups: optional [N] query of each entry: adds `n_neg_distinct` and each TPR's
      `_distinct_negatives` (module docstring).
    rng: with `groups`, the Generator of the query-cluster bootstrap: adds each TPR's
      `_boot_low` / `_boot_high` (95%, `num_resamples` resamples).
    num_resamples: bootstrap resamples.

  Returns:
    Flat dict of metrics, with `top_tied` / `top_tied_negatives` (`top_ties`).
  """
  labels = np.asarray(labels).astype(bool)
  n_pos, n_neg = int(labels.sum()), int((~labels).sum())
  auc, low, high = metrics_lib.auc_interval(scores, labels)
  m = {'auc': auc, 'auc_ci_low': low, 'auc_ci_high': high,
       'log_auc': metrics_lib.log_auc(scores, labels), 'n_pos': n_pos, 'n_neg': n_neg}
  m.update(top_ties(scores, labels))
  tprs = metrics_lib.tpr_at_fpr(scores, labels, list(FPRS.values()))  # one ROC for both
  for name, tpr in zip(FPRS, tprs):
    # The TPR is a count of members above a threshold: its interval is that count's.
    m.update(stats.rate(name, int(round(float(tpr) * n_pos)), n_pos))
  if groups is not None:
    groups = np.asarray(groups)
    m['n_neg_distinct'] = int(np.unique(groups[~labels]).size)
    for name, fpr in FPRS.items():
      m[f'{name}_distinct_negatives'] = bootstrap.distinct_negatives(scores, labels, groups, fpr)
    if rng is not None:
      # One set of resamples for both FPRs.
      boot = bootstrap.tpr_at_fpr_interval(scores, labels, groups, list(FPRS.values()), rng=rng,
                                           num_resamples=num_resamples)
      for name, (_, low, high) in zip(FPRS, boot):
        m.update({f'{name}_boot_low': low, f'{name}_boot_high': high})
  if target is not None:
    per_auc, per_tpr = [], []
    for k in np.unique(target):
      sel = target == k
      if labels[sel].all() or not labels[sel].any():
        continue
      per_auc.append(metrics_lib.roc_auc(scores[sel], labels[sel]))
      per_tpr.append(metrics_lib.tpr_at_fpr(scores[sel], labels[sel], 1e-3))
    if per_auc:
      m.update(auc_target_min=min(per_auc), auc_target_max=max(per_auc),
               **{'tpr_at_fpr_1e-3_target_min': min(per_tpr),
                  'tpr_at_fpr_1e-3_target_max': max(per_tpr)})
  return m


def final_scores(recording: dict[str, np.ndarray], owner: np.ndarray, attack: str, *,
                 scoring: str = 'aligned', single_index: int = -1,
                 default_filter: str = scores_lib.DEFAULT_FILTER,
                 rng: np.random.Generator | None = None,
                 rmia_gamma: float = scores_lib.RMIA_GAMMA,
                 rmia_a: float = scores_lib.RMIA_A) -> dict[str, Any]:
  """The pooled final scores `evaluate` ranks (arguments as there).

  Returns:
    `scores` [N] (the round chosen or the rounds combined), `labels` [N], `target` [N],
    `groups` [N] (the query of each entry, `scores.pooled_queries`), `round` (1-based: the
    single or best round, else the last recorded one) and `pooled`
    (`scores.pooled_round_scores`'s dict).
  """
  base, _ = scores_lib.parse(attack, default_filter)
  pooled = scores_lib.pooled_round_scores(recording, owner, attack, scoring=scoring,
                                          default_filter=default_filter, rng=rng,
                                          rmia_gamma=rmia_gamma, rmia_a=rmia_a)
  per_round, labels = pooled['scores'], pooled['labels']
  rounds = np.asarray(recording['rounds'])
  if base in scores_lib.BEST_ROUND:
    # The authors' choice (`mia_attack_auto.py`): the round with the best TPR@0.1% FPR on the
    # evaluation data itself, first one on ties. Optimistic by construction.
    tprs = [metrics_lib.tpr_at_fpr(per_round[t], labels, 1e-3) for t in range(len(rounds))]
    index = int(np.argmax(tprs))
    final, chosen = per_round[index], int(rounds[index]) + 1
  elif base in scores_lib.SINGLE:
    index = single_index % len(rounds)
    final, chosen = per_round[index], int(rounds[index]) + 1
  else:
    final, chosen = scores_lib.combine_rounds(per_round, attack), int(rounds[-1]) + 1
  groups = scores_lib.pooled_queries(owner, int(np.asarray(recording['loss']).shape[1]),
                                     scoring)
  return dict(scores=final, labels=labels, target=pooled['target'], groups=groups,
              round=chosen, pooled=pooled)


def compare(recording: dict[str, np.ndarray], attack_a: str, attack_b: str, *,
            rng: np.random.Generator, single_index: int = -1,
            default_filter: str = scores_lib.DEFAULT_FILTER, num_resamples: int = BOOT_RESAMPLES,
            fpr: float = 1e-3, rmia_gamma: float = scores_lib.RMIA_GAMMA,
            rmia_a: float = scores_lib.RMIA_A) -> dict[str, Any]:
  """A minus B on the same pooled entries, aligned scoring (`eval.paired.compare`).

  A claim that one attack beats another is about their difference on the same members and
  non-members; the query-cluster bootstrap draws the same resamples for both, so their
  correlation is kept. Aligned only: under the public code's scoring each attack's
  non-member positions are redrawn, so the two would not score the same entries.

  Returns:
    `paired.compare`'s dict (AUC and TPR at `fpr`, A, B, A - B with 95% intervals).
  """
  kw = dict(scoring='aligned', single_index=single_index, default_filter=default_filter,
            rmia_gamma=rmia_gamma, rmia_a=rmia_a)
  owner = recording['owner']
  a = final_scores(recording, owner, attack_a, **kw)
  b = final_scores(recording, owner, attack_b, **kw)
  if not (np.array_equal(a['labels'], b['labels']) and np.array_equal(a['groups'], b['groups'])):
    raise ValueError(f'{attack_a} and {attack_b} do not score the same entries')
  return paired.compare(a['scores'], b['scores'], a['labels'], a['groups'], rng=rng, fpr=fpr,
                        num_resamples=num_resamples)


def evaluate(recording: dict[str, np.ndarray], owner: np.ndarray, attack: str, *,
             scoring: str = 'aligned', single_index: int = -1,
             default_filter: str = scores_lib.DEFAULT_FILTER,
             rng: np.random.Generator | None = None,
             audit_delta: float | None = None, rmia_gamma: float = scores_lib.RMIA_GAMMA,
             rmia_a: float = scores_lib.RMIA_A,
             num_resamples: int = BOOT_RESAMPLES,
             entries_out: dict | None = None) -> dict[str, Any]:
  """Metrics of `attack` on a recording (see `scores` for the attacks and scorings).

  Args:
    recording: `fl.recording.train_recorded`'s arrays.
    owner: [Q] owning client of each query (-1 test).
    attack: a name of `scores.ATTACKS`, optionally `fedmia_*@<filter>`.
    scoring: one of `scores.SCORINGS`.
    single_index: index among the recorded rounds for single-round attacks (-1: last).
    default_filter: FedMIA's filter when the name gives none.
    rng: numpy Generator (public_code draws); when given, a child Generator spawned from it
      (`Generator.spawn`, which leaves its stream as it is) draws the bootstrap resamples.
    audit_delta: when given (a DP defense's delta), also the attack's strength in epsilon
      units at that delta (`eval.auditing.attack_bounds`: an estimate, not a certified bound,
      since the entries of one training are dependent).
    rmia_gamma, rmia_a: RMIA's threshold and offline parameter.
    num_resamples: resamples of the query-cluster bootstrap (0: none, no `_boot_` fields).
    entries_out: when given, filled with the scored entries (`scores, labels, target,
      groups`, as `final_scores` returns them) and `round_scores`, the per-round scores
      [R, N] they were combined from (`scores.pooled_round_scores`' `scores`).

  Returns:
    `score_metrics` (with the groups of `scores.pooled_queries`, so distinct negatives and,
    given `rng`, bootstrap intervals) plus `round` (1-based round of a single-round attack:
    the chosen one for `*_best_round`), `filter_removed_fraction` (FedMIA: removed / examined
    shadow values, else NaN) and `filter_owner_removed_fraction` (aligned FedMIA: how often the shadow that owns a
    non-member query was removed; the filter's job), and for RMIA `rmia_population` (the
    population size n_z its scores are fractions of).
  """
  # num_resamples 0: no query-cluster bootstrap (a replicated run reports other intervals).
  boot_rng = None if rng is None or not num_resamples else rng.spawn(1)[0]
  f = final_scores(recording, owner, attack, scoring=scoring, single_index=single_index,
                   default_filter=default_filter, rng=rng, rmia_gamma=rmia_gamma, rmia_a=rmia_a)
  final, labels, pooled = f['scores'], f['labels'], f['pooled']
  if entries_out is not None:
    entries_out.update({k: f[k] for k in ('scores', 'labels', 'target', 'groups')},
                       round_scores=pooled['scores'])
  m = score_metrics(final, labels, f['target'], f['groups'], boot_rng, num_resamples)
  m['round'] = f['round']
  if scores_lib.parse(attack, default_filter)[0] == 'rmia':
    # The population each RMIA score is a fraction of (the rows no client holds, owner -1: the
    # test split and, in the FedMIA pipeline, the train rows outside every shard; a candidate
    # from the population is compared with the others, one fewer).
    m['rmia_population'] = int((np.asarray(owner) == -1).sum())
  m['filter_removed_fraction'] = (pooled['removed'] / pooled['examined']
                                  if pooled['examined'] else math.nan)
  m['filter_owner_removed_fraction'] = (pooled['owner_removed'] / pooled['owner_examined']
                                        if pooled['owner_examined'] else math.nan)
  if audit_delta is not None:
    m.update(auditing.attack_bounds(final, labels, audit_delta))
  return m


def upload_loss_gap(recording: dict[str, np.ndarray]) -> float:
  """Mean over clients of (test rows' median loss - own rows' median loss) under the client's
  upload at the last recorded round (medians: a noised upload's losses are heavy-tailed).

  The server reads local models, not the global one: a client's few steps on its own rows can
  fit them while the averaged global model generalises, so this gap, not the global model's
  train-test accuracy gap, is the overfitting its attacks see. NaN without test rows. The
  losses are the attacks' (`rmia.recording_loss`, from the margins): float32 losses of
  confident own rows round to 0.
  """
  loss = rmia.recording_loss(recording)[-1]
  owner = np.asarray(recording['owner'])
  test = owner == -1
  gaps = [np.median(loss[k, test]) - np.median(loss[k, owner == k])
          for k in range(loss.shape[0]) if test.any() and (owner == k).any()]
  return float(np.mean(gaps)) if gaps else math.nan


def recording_metrics(recording: dict[str, np.ndarray], attack: str, *, scoring: str,
                      single_round: int, default_filter: str, rng: np.random.Generator,
                      dp_metrics: dict[str, Any] | None = None,
                      dp_delta: float | None = None, entries: bool = False,
                      **options) -> dict[str, Any] | tuple[dict[str, Any], dict[str, Any]]:
  """`evaluate` on a recording that carries its `owner` (`fl.recording.record_shards`).

  Args:
    recording: `fl.recording.record_shards`'s arrays.
    attack, scoring, default_filter, rng: as in `evaluate` (the groups of its distinct
      negatives and bootstrap are the recording's queries, `scores.pooled_queries`).
    single_round: the 1-based recorded round single-round attacks use.
    dp_metrics: the defense's DP metrics (`dp_epsilon`, ...), copied in.
    dp_delta: the DP defense's delta: when `dp_metrics` declare a DP unit (`dp_unit`), the
      attack's epsilon-unit estimates at it too (`evaluate`'s `audit_delta`; not certified
      bounds, see `eval.auditing.attack_bounds`).
    entries: also return the scored entries (`final_scores`' `scores, labels, target,
      groups`), which `eval.replicated` pools over replicated trainings.

  Returns:
    `evaluate`'s metrics (with `entries`: (metrics, entries)), the final model's `test_accuracy` with its Clopper-Pearson
    interval, `n_test`, `test_error`, `train_accuracy` (with interval) on the clients' rows and
    `generalisation_gap` = train - test accuracy (NaN for recordings without members),
    `upload_loss_gap` (`upload_loss_gap`), `dp_metrics` (`dp_epsilon` inf when it has none) and
    `train_seconds`.
  """
  dp_metrics = dp_metrics or {}
  recorded = list(np.asarray(recording['rounds']) + 1)
  out = {}
  m = evaluate(recording, recording['owner'], attack, scoring=scoring,
               single_index=recorded.index(int(single_round)), default_filter=default_filter,
               rng=rng, audit_delta=float(dp_delta) if 'dp_unit' in dp_metrics else None,
               entries_out=out if entries else None, **options)
  n_test = int(recording['num_test'])
  correct = int(recording['test_correct'][-1])
  acc = stats.rate('test_accuracy', correct, n_test)
  m.update(acc)
  m['n_test'] = n_test
  m['test_error'] = 1.0 - acc['test_accuracy']
  if 'member_correct' in recording:
    # The generalisation gap: how much better the final global model does on the clients'
    # training rows than on the test split (the papers' overfitting, which drives MI).
    m.update(stats.rate('train_accuracy', int(recording['member_correct']),
                        int(recording['num_member'])))
    m['generalisation_gap'] = m['train_accuracy'] - acc['test_accuracy']
  else:
    m['train_accuracy'] = m['generalisation_gap'] = math.nan
  m['upload_loss_gap'] = upload_loss_gap(recording)
  m.update(dp_metrics)
  m.setdefault('dp_epsilon', math.inf)
  m['train_seconds'] = float(recording['train_seconds'])
  return (m, out) if entries else m


def rounds_curve(recording: dict[str, np.ndarray], owner: np.ndarray, attack: str, *,
                 scoring: str = 'aligned', default_filter: str = scores_lib.DEFAULT_FILTER,
                 rng: np.random.Generator | None = None,
                 rmia_gamma: float = scores_lib.RMIA_GAMMA,
                 rmia_a: float = scores_lib.RMIA_A,
                 scored: dict[str, np.ndarray] | None = None) -> dict[str, list]:
  """TPR@0.1% FPR (with interval) and AUC after each recorded round (Fig. 5a of the paper).

  Multi-round attacks use the rounds recorded so far (Eqs. 5 and 12 with T = that round);
  single-round attacks use that round alone. `scored`: this recording's aligned
  `round_scores` and `labels` already computed (`evaluate`'s `entries_out`), used instead of
  scoring again; refused for another scoring (the public code's draws depend on `rng`).
  """
  base, _ = scores_lib.parse(attack, default_filter)
  if scored is not None:
    if scoring != 'aligned':
      raise ValueError(f'precomputed scores are aligned; scoring={scoring!r} draws its own')
    per_round, labels = scored['round_scores'], scored['labels']
  else:
    pooled = scores_lib.pooled_round_scores(recording, owner, attack, scoring=scoring,
                                            default_filter=default_filter, rng=rng,
                                            rmia_gamma=rmia_gamma, rmia_a=rmia_a)
    per_round, labels = pooled['scores'], pooled['labels']
  multi = base in scores_lib.MULTI_ROUND
  out = {'round': [], 'tpr_at_fpr_1e-3': [], 'tpr_at_fpr_1e-3_ci_low': [],
         'tpr_at_fpr_1e-3_ci_high': [], 'auc': []}
  n_pos = int(labels.sum())
  cumulative = np.zeros(per_round.shape[1])
  for i, t in enumerate(np.asarray(recording['rounds'])):
    cumulative += per_round[i]
    final = cumulative / (i + 1) if multi else per_round[i]
    tpr = metrics_lib.tpr_at_fpr(final, labels, 1e-3)
    r = stats.rate('tpr_at_fpr_1e-3', int(round(tpr * n_pos)), n_pos)
    out['round'].append(int(t) + 1)
    for k, v in r.items():
      out[k].append(v)
    out['auc'].append(metrics_lib.roc_auc(final, labels))
  return out
