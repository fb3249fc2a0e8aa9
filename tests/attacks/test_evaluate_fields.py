"""`attacks.passive.evaluate`: every field a FedMIA point carries, against hand computations.

Written from the mutation run's survivors (docs/testing.md): the per-target extremes, the
options `evaluate` passes on (single round, filter, bootstrap resamples, the attack's own DP
bounds), and `recording_metrics`' test accuracy, error, DP fields and gaps.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fl_privacy.attacks.passive import evaluate
from fl_privacy.attacks.passive import scores
from fl_privacy.eval import auditing
from fl_privacy.eval import metrics


def _recording(seed=0, num_rounds=3, num_clients=4, per_client=30, num_test=80, shift=1.0):
  rng = np.random.default_rng(seed)
  q = num_clients * per_client + num_test
  owner = np.r_[np.repeat(np.arange(num_clients), per_client), np.full(num_test, -1)]
  phi = 2.0 * rng.normal(size=q) + rng.normal(size=(num_rounds, num_clients, q))
  # Client k's members stand out by k * shift: per-target AUCs differ.
  phi += shift * (owner[None, None, :] == np.arange(num_clients)[None, :, None]) * np.arange(
      num_clients)[None, :, None]
  loss = np.logaddexp(0.0, -phi)
  return dict(loss=loss, margin=phi, cos=phi, diff=phi, grad_sq=loss[:, 0],
              rounds=np.arange(num_rounds) * 5
              + 4, owner=owner, test_correct=np.array([10, 20, 30]), num_test=np.array(40),
              train_seconds=np.array(2.5))


def test_score_metrics_per_target_extremes_by_hand():
  rec = _recording()
  f = evaluate.final_scores(rec, rec['owner'], 'loss_series')
  m = evaluate.score_metrics(f['scores'], f['labels'], f['target'])
  aucs = [metrics.roc_auc(f['scores'][f['target'] == k], f['labels'][f['target'] == k])
          for k in range(4)]
  tprs = [metrics.tpr_at_fpr(f['scores'][f['target'] == k], f['labels'][f['target'] == k], 1e-3)
          for k in range(4)]
  assert m['auc_target_min'] == pytest.approx(min(aucs))
  assert m['auc_target_max'] == pytest.approx(max(aucs))
  assert m['auc_target_max'] - m['auc_target_min'] > 0.2  # the targets do differ
  assert m['tpr_at_fpr_1e-3_target_min'] == pytest.approx(min(tprs))
  assert m['tpr_at_fpr_1e-3_target_max'] == pytest.approx(max(tprs))
  assert m['log_auc'] == pytest.approx(metrics.log_auc(f['scores'], f['labels']))
  # A target with members only is skipped (no AUC), and the others still count.
  target = f['target'].copy()
  target[np.flatnonzero(f['labels'] == 1)[:3]] = 99
  m2 = evaluate.score_metrics(f['scores'], f['labels'], target)
  aucs2 = [metrics.roc_auc(f['scores'][target == k], f['labels'][target == k]) for k in range(4)]
  assert m2['auc_target_min'] == pytest.approx(min(aucs2))
  assert m2['auc_target_max'] == pytest.approx(max(aucs2))
  small = evaluate.score_metrics(np.r_[0.9, 0.1, 0.2], np.r_[1, 0, 1], np.r_[5, 5, 6])
  assert small['auc_target_min'] == small['auc_target_max'] == 1.0  # target 6 left out


def test_evaluate_passes_its_options_on():
  rec = _recording(seed=1)
  owner = rec['owner']
  first = evaluate.evaluate(rec, owner, 'grad_cosine', single_index=0)
  last = evaluate.evaluate(rec, owner, 'grad_cosine')
  assert (first['round'], last['round']) == (5, 15)
  f0 = evaluate.final_scores(rec, owner, 'grad_cosine', single_index=0)
  assert first['auc'] == pytest.approx(metrics.roc_auc(f0['scores'], f0['labels']))
  assert first['auc'] != pytest.approx(last['auc'])
  paper = evaluate.evaluate(rec, owner, 'fedmia_ii', default_filter='none')
  loo = evaluate.evaluate(rec, owner, 'fedmia_ii', default_filter='leave_one_out')
  assert math.isnan(paper['filter_removed_fraction']) or paper['filter_removed_fraction'] == 0
  assert loo['filter_removed_fraction'] > 0
  # Bootstrap resamples: a different count gives a different interval from the same Generator.
  few = evaluate.evaluate(rec, owner, 'loss_series', rng=np.random.default_rng(3),
                          num_resamples=7)
  many = evaluate.evaluate(rec, owner, 'loss_series', rng=np.random.default_rng(3))
  assert (few['tpr_at_fpr_1e-2_boot_low'], few['tpr_at_fpr_1e-2_boot_high']) != (
      many['tpr_at_fpr_1e-2_boot_low'], many['tpr_at_fpr_1e-2_boot_high'])
  # The attack's own DP bounds at the given delta, from its final scores.
  audited = evaluate.evaluate(rec, owner, 'loss_series', audit_delta=1e-5)
  f = evaluate.final_scores(rec, owner, 'loss_series')
  want = auditing.attack_bounds(f['scores'], f['labels'], 1e-5)
  for key, value in want.items():
    assert audited[key] == pytest.approx(value), key
  assert not set(want) & set(last)


def test_recording_metrics_fields_by_hand():
  rec = _recording(seed=2)
  common = dict(scoring='aligned', default_filter='leave_one_out', num_resamples=5)
  m = evaluate.recording_metrics(rec, 'grad_cosine', single_round=10,
                                 rng=np.random.default_rng(0), **common)
  assert m['round'] == 10
  assert m['auc'] == pytest.approx(evaluate.evaluate(rec, rec['owner'], 'grad_cosine',
                                                     single_index=1)['auc'])
  assert 'tpr_at_fpr_1e-3_boot_low' in m  # the Generator reached the bootstrap
  # The last recorded round's accuracy: 30 of 40.
  assert m['test_accuracy'] == pytest.approx(0.75) and m['n_test'] == 40
  assert m['test_error'] == pytest.approx(0.25)
  assert m['dp_epsilon'] == math.inf and m['train_seconds'] == 2.5
  assert 'attack_epsilon_cp' not in m and not any(k.startswith('attack_') for k in m)
  # A DP defense's metrics are copied in, and with a DP unit the attack's own bounds follow.
  dp = dict(dp_epsilon=3.0, dp_unit='record')
  d = evaluate.recording_metrics(rec, 'loss_series', single_round=15, rng=None,
                                 dp_metrics=dp, dp_delta=1e-5, **common)
  f = evaluate.final_scores(rec, rec['owner'], 'loss_series')
  want = auditing.attack_bounds(f['scores'], f['labels'], 1e-5)
  assert d['dp_epsilon'] == 3.0 and d['dp_unit'] == 'record'
  for key, value in want.items():
    assert d[key] == pytest.approx(value), key
  no_unit = evaluate.recording_metrics(rec, 'loss_series', single_round=15, rng=None,
                                       dp_metrics=dict(dp_epsilon=3.0), dp_delta=1e-5, **common)
  assert not set(want) & set(no_unit)
  # Options reach `evaluate` (RMIA's gamma) and the scoring is the one asked for.
  r1 = evaluate.recording_metrics(rec, 'rmia', single_round=15, rng=None, rmia_gamma=1.0,
                                  **common)
  r2 = evaluate.recording_metrics(rec, 'rmia', single_round=15, rng=None, rmia_gamma=3.0,
                                  **common)
  assert r1['auc'] != pytest.approx(r2['auc'])
  pc = evaluate.recording_metrics(rec, 'loss_series', single_round=15,
                                  rng=np.random.default_rng(0),
                                  **dict(common, scoring='public_code_2024'))
  assert pc['n_neg'] == 3 * 4 * 30  # only other clients' rows
  assert scores.supports('loss_series', 'public_code_2024')


def test_upload_loss_gap_reads_the_last_round_and_only_clients_with_rows():
  rec = _recording(seed=3, num_rounds=3)
  loss, owner = rec['loss'], rec['owner']
  want = np.mean([np.median(loss[-1, k, owner == -1]) - np.median(loss[-1, k, owner == k])
                  for k in range(4)])
  assert evaluate.upload_loss_gap(rec) == pytest.approx(want)
  assert evaluate.upload_loss_gap(rec) != pytest.approx(np.mean(
      [np.median(loss[1, k, owner == -1]) - np.median(loss[1, k, owner == k]) for k in range(4)]))
  # Client 2 holds no rows: it is left out, not averaged in as NaN.
  moved = owner.copy()
  moved[moved == 2] = 1
  got = evaluate.upload_loss_gap(dict(rec, owner=moved))
  want2 = np.mean([np.median(loss[-1, k, moved == -1]) - np.median(loss[-1, k, moved == k])
                   for k in (0, 1, 3)])
  assert got == pytest.approx(want2)


def test_a_members_only_target_first_in_order_does_not_end_the_per_target_loop():
  rec = _recording(seed=4)
  f = evaluate.final_scores(rec, rec['owner'], 'loss_series')
  target = f['target'].copy()
  target[np.flatnonzero(f['labels'] == 1)[:2]] = -5  # sorts first, members only
  m = evaluate.score_metrics(f['scores'], f['labels'], target)
  aucs = [metrics.roc_auc(f['scores'][target == k], f['labels'][target == k]) for k in range(4)]
  assert m['auc_target_min'] == pytest.approx(min(aucs))
  assert m['auc_target_max'] == pytest.approx(max(aucs))


def test_filters_reach_compare_and_recording_metrics():
  rec = _recording(seed=5)
  none = evaluate.evaluate(rec, rec['owner'], 'fedmia_ii', default_filter='none')['auc']
  loo = evaluate.evaluate(rec, rec['owner'], 'fedmia_ii',
                          default_filter='leave_one_out')['auc']
  assert none != pytest.approx(loo)
  # The default is the paper's filter, which cannot fire with 3 shadows: the same as none.
  assert evaluate.evaluate(rec, rec['owner'], 'fedmia_ii')['auc'] == pytest.approx(none)
  c = evaluate.compare(rec, 'fedmia_ii', 'avg_cosine', rng=np.random.default_rng(0),
                       default_filter='none', num_resamples=20)
  assert c['auc_a'] == pytest.approx(none)
  m = evaluate.recording_metrics(rec, 'fedmia_ii', scoring='aligned', single_round=15,
                                 default_filter='none', rng=None)
  assert m['auc'] == pytest.approx(none)


@pytest.mark.parametrize('attack', ['loss_series', 'fedmia_ii', 'grad_cosine', 'rmia'])
def test_rounds_curve_by_hand(attack):
  rec = _recording(seed=6, num_rounds=3)
  owner = rec['owner']
  kw = dict(default_filter='none', rmia_gamma=1.5, rmia_a=0.5)
  curve = evaluate.rounds_curve(rec, owner, attack, **kw)
  pooled = scores.pooled_round_scores(rec, owner, attack, **kw)
  per_round, labels = pooled['scores'], pooled['labels']
  assert curve['round'] == [5, 10, 15]
  for i in range(3):
    final = per_round[:i + 1].mean(0) if attack != 'grad_cosine' else per_round[i]
    assert curve['auc'][i] == pytest.approx(metrics.roc_auc(final, labels))
    tpr = metrics.tpr_at_fpr(final, labels, 1e-3)
    assert curve['tpr_at_fpr_1e-3'][i] == pytest.approx(tpr)
    assert curve['tpr_at_fpr_1e-3_ci_low'][i] <= tpr <= curve['tpr_at_fpr_1e-3_ci_high'][i]
  # The running mean differs from the last round alone, and the options reach the scores.
  if attack != 'grad_cosine':
    assert curve['auc'][2] != pytest.approx(metrics.roc_auc(per_round[2], labels))
  other = evaluate.rounds_curve(rec, owner, attack, default_filter='leave_one_out')
  if attack in ('fedmia_ii', 'rmia'):
    assert other['auc'] != pytest.approx(curve['auc'])
  # The scoring reaches the scores: public_code_2024 leaves the test rows out.
  c24 = evaluate.rounds_curve(rec, owner, attack, scoring='public_code_2024', **kw)
  assert c24['auc'] != pytest.approx(curve['auc'])


def test_rounds_curve_public_code_uses_the_generator():
  rec = _recording(seed=7)
  a = evaluate.rounds_curve(rec, rec['owner'], 'loss_series', scoring='public_code',
                            rng=np.random.default_rng(1))
  b = evaluate.rounds_curve(rec, rec['owner'], 'loss_series', scoring='public_code',
                            rng=np.random.default_rng(2))
  assert a['auc'][1:] != pytest.approx(b['auc'][1:])
