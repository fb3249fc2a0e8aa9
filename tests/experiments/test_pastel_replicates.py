"""PASTEL's points over replicated trainings (`pipelines.pastel_replicates`), on planted scores."""

from __future__ import annotations

import numpy as np
import pytest

from fl_privacy.attacks.passive import pastel as passive_pastel
from fl_privacy.eval import metrics as metrics_lib
from fl_privacy.eval import paired
from fl_privacy.eval import replicated
from fl_privacy.pipelines import pastel_replicates


def _scored(shifts, n=200, clients=4, seed=0, noise=None):
  """`pooled_attack_scores`' tuple: replicate r's members score `shifts[r]` higher; `noise`
  (same shape) replaces the draws, so two calls can share entries."""
  rng = np.random.default_rng(seed)
  parts = []
  for r, shift in enumerate(shifts):
    labels = np.r_[np.ones(n), np.zeros(n)].astype(np.int64)
    draw = rng.normal(size=2 * n) if noise is None else noise[r]
    ids = np.r_[np.arange(n), 10_000 + rng.permutation(3 * n)[:n]]  # test rows shared
    parts.append((draw + shift * labels, labels, ids, np.full(2 * n, r),
                  np.arange(2 * n) % clients))
  return tuple(np.concatenate([p[i] for p in parts]) for i in range(5))


def test_split_gives_each_replicate_its_entries():
  scored = _scored([1.0, 0.5, 0.0])
  reps = pastel_replicates.split(scored)
  assert len(reps) == 3
  for r, rep in enumerate(reps):
    sel = scored[3] == r
    np.testing.assert_array_equal(rep['scores'], scored[0][sel])
    np.testing.assert_array_equal(rep['target'], scored[4][sel])
    np.testing.assert_array_equal(rep['groups'], scored[2][sel])


def test_point_reports_the_mean_over_replicates_with_the_t_interval():
  shifts = [0.2, 0.8, 1.4]  # trainings that leak very differently
  scored = _scored(shifts)
  m = pastel_replicates.point(scored, rng=np.random.default_rng(0), num_resamples=50)
  reps = pastel_replicates.split(scored)
  aucs = [metrics_lib.roc_auc(r['scores'], r['labels']) for r in reps]
  assert m['interval_method'] == 't' and m['replicates'] == 3
  assert m['attack_auc_replicates'] == pytest.approx(aucs)
  mean, low, high = replicated.t_interval(aucs, bounds=(0.0, 1.0))
  assert (m['attack_auc'], m['attack_auc_ci_low'], m['attack_auc_ci_high']) == pytest.approx(
      (mean, low, high))
  # The pooled rows, one sample: DeLong ignores the spread between trainings and is far
  # narrower than the interval over them.
  pooled = passive_pastel.attack_metrics(scored[0], scored[1], scored[2])
  assert m['pooled_attack_auc'] == pytest.approx(pooled['attack_auc'])
  assert m['pooled_attack_auc_ci_low'] == pytest.approx(pooled['attack_auc_ci_low'])
  assert (m['attack_auc_ci_high'] - m['attack_auc_ci_low']
          > 3 * (m['pooled_attack_auc_ci_high'] - m['pooled_attack_auc_ci_low']))
  for name in ('tpr_at_fpr_1e-2', 'tpr_at_fpr_1e-3'):
    assert len(m[f'{name}_replicates']) == 3
    assert m[f'{name}_ci_low'] <= m[name] <= m[f'{name}_ci_high']
    # Never narrower than Clopper-Pearson on the pooled counts.
    assert (m[f'{name}_ci_high'] - m[f'{name}_ci_low']
            >= m[f'{name}_cp_high'] - m[f'{name}_cp_low'] - 1e-12)
  assert (m['n_pos'], m['n_neg']) == (600, 600)
  assert len(m['conditional']) == 3
  assert m['conditional'][1]['attack_auc'] == pytest.approx(aucs[1])
  assert m['conditional'][1]['attack_auc_ci_low'] < aucs[1] < m['conditional'][1][
      'attack_auc_ci_high']


def test_one_replicate_is_the_conditional_bootstrap():
  m = pastel_replicates.point(_scored([1.0]), rng=np.random.default_rng(0), num_resamples=200)
  assert m['interval_method'] == 'two_way_bootstrap_conditional'
  assert np.isnan(m['attack_auc_t_low'])
  assert (m['attack_auc_ci_low'], m['attack_auc_ci_high']) == (m['attack_auc_boot_low'],
                                                               m['attack_auc_boot_high'])
  assert m['attack_auc_ci_low'] < m['attack_auc'] < m['attack_auc_ci_high']


def test_change_is_the_mean_of_paired_per_replicate_differences():
  rng = np.random.default_rng(3)
  noise = rng.normal(size=(4, 400))
  defended = _scored([0.3, 0.4, 0.2, 0.5], noise=noise, seed=1)
  none = _scored([1.0, 1.1, 0.9, 1.2], noise=noise, seed=1)  # same rows, same draws
  c = pastel_replicates.change(defended, none, rng=np.random.default_rng(0), num_resamples=50)
  a = [metrics_lib.roc_auc(r['scores'], r['labels']) for r in pastel_replicates.split(defended)]
  b = [metrics_lib.roc_auc(r['scores'], r['labels']) for r in pastel_replicates.split(none)]
  diffs = np.subtract(a, b)
  assert c['attack_auc_minus_none_replicates'] == pytest.approx(diffs)
  mean, low, high = replicated.t_interval(diffs, bounds=(-1.0, 1.0))
  assert (c['attack_auc_minus_none'], c['attack_auc_minus_none_ci_low'],
          c['attack_auc_minus_none_ci_high']) == pytest.approx((mean, low, high))
  assert c['attack_auc_minus_none_ci_high'] < 0  # every replicate drops
  assert c['attack_auc_minus_none_verdict'] == 'B better (interval below 0)'
  assert 'tpr_at_fpr_1e-3_minus_none_ci_low' in c
  pooled = passive_pastel.auc_change(defended[0], defended[1], none[0], none[1])
  assert c['pooled_attack_auc_minus_none'] == pytest.approx(pooled['attack_auc_minus_none'])
  # Another replicate's rows are no pair.
  with pytest.raises(ValueError, match='differ'):
    pastel_replicates.change(defended, _scored([1.0] * 4, seed=9), rng=np.random.default_rng(0),
                             num_resamples=5)


def test_utility_is_the_t_interval_over_replicates():
  arrays = [dict(num_test=100, test_correct=c, member_correct=90, num_members=100,
                 local_test_correct=np.array([80, 82]), dp_epsilon=np.nan,
                 dp_epsilon_per_round=np.nan, noise_multiplier=np.nan, clip_fraction=np.nan,
                 jsd_last_round=0.01, upload_norm_median=0.3) for c in (70, 80, 90)]
  m = pastel_replicates.utility(arrays)
  assert m['accuracy'] == pytest.approx(0.8) and m['accuracy_replicates'] == [0.7, 0.8, 0.9]
  _, low, high = replicated.t_interval([0.7, 0.8, 0.9], bounds=(0.0, 1.0))
  assert (m['accuracy_ci_low'], m['accuracy_ci_high']) == pytest.approx((low, high))
  assert m['pooled_accuracy_ci_high'] - m['pooled_accuracy_ci_low'] < high - low
  one = pastel_replicates.utility(arrays[:1])
  assert 'pooled_accuracy_ci_low' not in one and one['accuracy_ci_low'] < 0.7


def test_pooled_counts_read_the_example_ids():
  # The test rows' ids repeat across replicates: pooled, they are fewer distinct negatives
  # than rows, and every pooled low-FPR count says how many stood behind it.
  scored = _scored([0.5, 0.9, 1.3])
  m = pastel_replicates.point(scored, rng=np.random.default_rng(0), num_resamples=20)
  pooled = passive_pastel.attack_metrics(scored[0], scored[1], scored[2])
  assert m['n_neg_distinct'] == pooled['n_neg_distinct'] < m['n_neg']
  for name in pastel_replicates.ATTACK[1:]:
    assert m[f'pooled_{name}_distinct_negatives'] == pooled[f'{name}_distinct_negatives']
    assert m[f'pooled_{name}_distinct_negatives'] is not None


def test_one_replicate_bootstraps_with_the_given_resamples():
  scored = _scored([1.0])
  m = pastel_replicates.point(scored, rng=np.random.default_rng(4), num_resamples=30)
  want = replicated.metrics(pastel_replicates.split(scored), rng=np.random.default_rng(4),
                            num_resamples=30)
  assert m['num_resamples'] == want['num_resamples'] == 30
  assert (m['attack_auc_ci_low'], m['attack_auc_ci_high']) == pytest.approx(
      (want['auc_boot_low'], want['auc_boot_high']))
  rng = np.random.default_rng(3)
  noise = rng.normal(size=(1, 400))
  defended, none = _scored([0.3], noise=noise, seed=1), _scored([1.0], noise=noise, seed=1)
  c = pastel_replicates.change(defended, none, rng=np.random.default_rng(5), num_resamples=30)
  want = replicated.compare(pastel_replicates.split(defended), pastel_replicates.split(none),
                            rng=np.random.default_rng(5), num_resamples=30, fpr=1e-3)
  for short, name in (('auc', 'attack_auc'), ('tpr', 'tpr_at_fpr_1e-3')):
    assert (c[f'{name}_minus_none_ci_low'], c[f'{name}_minus_none_ci_high']) == pytest.approx(
        (want[f'{short}_diff_low'], want[f'{short}_diff_high']))
    assert np.isfinite(c[f'{name}_minus_none_boot_low'])


def test_two_replicates_get_the_t_interval_for_utility():
  arrays = [dict(num_test=100, test_correct=c, member_correct=90, num_members=100,
                 local_test_correct=np.array([80, 82]), dp_epsilon=np.nan,
                 dp_epsilon_per_round=np.nan, noise_multiplier=np.nan, clip_fraction=np.nan,
                 jsd_last_round=0.01, upload_norm_median=0.3) for c in (70, 90)]
  m = pastel_replicates.utility(arrays)
  _, low, high = replicated.t_interval([0.7, 0.9], bounds=(0.0, 1.0))
  assert (m['accuracy_ci_low'], m['accuracy_ci_high']) == pytest.approx((low, high))
  assert 'pooled_accuracy_ci_low' in m


def test_change_carries_the_t_test_and_change_lines_adjust_the_family():
  rng = np.random.default_rng(3)
  noise = rng.normal(size=(4, 400))
  none = _scored([1.0, 1.1, 0.9, 1.2], noise=noise, seed=1)
  c = pastel_replicates.change(_scored([0.3, 0.4, 0.2, 0.5], noise=noise, seed=1), none,
                               rng=np.random.default_rng(0), num_resamples=20)
  t, p = replicated.t_test(c['attack_auc_minus_none_replicates'])
  assert (c['attack_auc_minus_none_t_stat'], c['attack_auc_minus_none_p']) == (t, p)
  assert p < 0.01
  # The same rows and draws: every replicate's change is 0, a zero-width interval.
  same = pastel_replicates.change(none, none, rng=np.random.default_rng(0), num_resamples=20)
  assert same['attack_auc_minus_none_verdict'].startswith('not estimable')
  assert np.isnan(same['attack_auc_minus_none_p'])
  lines = pastel_replicates.change_lines([('pastel, Nasr local', c), ('ldp, Nasr local', same),
                                          ('old point', {})])
  assert lines[0] == '## Paired changes against `none` as claims' and lines[-1] == ''
  assert 'The 6 changes below' in lines[2] and 'Holm 1979' in lines[2]
  rows = [l for l in lines if l.startswith('| ') and not l.startswith('| point')]
  assert len(rows) == 3
  cells = rows[0].split(' | ')
  assert cells[2] == 'B better (interval below 0)'
  # m = 6, the other tests NaN: Holm multiplies the smallest p by 6.
  assert cells[3] == paired.p_verdict(c['attack_auc_minus_none'], min(1.0, 6 * p))
  assert rows[1].split(' | ')[2].startswith('not estimable')
  assert rows[1].split(' | ')[3].startswith('not estimable')
  assert rows[2] == '| old point | - | - | - | - | - | - |'
  assert pastel_replicates.change_lines([]) == []


def test_change_lines_state_the_family_in_words():
  # From mutation survivors: the text a reader gets, with m = 2 x 20 = 40 changes.
  lines = pastel_replicates.change_lines([(f'p{i}', {}) for i in range(20)])
  assert lines[:2] == ['## Paired changes against `none` as claims', '']
  assert lines[2] == (
      'The 40 changes below (AUC and TPR at 0.1% FPR of every defended point) form one '
      'family. "verdict": from the interval alone, each at 95%, unadjusted (exploratory: with '
      'no change anywhere about 2.0 would read "better" or "worse" by chance; A = the defended '
      'training, B = `none`: "A better" means the attack does better against the defense). '
      '"Holm": the family adjusted (Holm 1979, two-sided p-values of the per-replicate t '
      'statistics, family-wise 95%). A zero-width interval (replicates that agree) supports no '
      'verdict: "not estimable".')
  assert lines[3:6] == [
      '', '| point | AUC change [95%] | verdict (AUC) | Holm (AUC) | TPR@0.1% change [95%] | '
      'verdict (TPR@0.1%) | Holm (TPR@0.1%) |', '|---|---|---|---|---|---|---|']
  assert len(lines) == 6 + 20 + 1
