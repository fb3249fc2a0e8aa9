"""`pipelines.fedmia_replicates`: one point's metrics over replicated trainings, and their keys."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from fl_privacy.attacks.passive import evaluate
from fl_privacy.eval import replicated
from fl_privacy.pipelines import fedmia_replicates


def _entries(rng, shift, num_clients=4, num_queries=50):
  owner = rng.integers(0, num_clients, num_queries)
  target = np.repeat(np.arange(num_clients), num_queries)
  groups = np.tile(np.arange(num_queries), num_clients)
  labels = (owner[groups] == target).astype(np.int8)
  scores = rng.normal(size=labels.size) + shift * labels
  return dict(scores=scores, labels=labels, target=target, groups=groups)


def _replicate(rng, shift, test_correct):
  e = _entries(rng, shift)
  m = evaluate.score_metrics(e['scores'], e['labels'], e['target'], e['groups'])
  m.update(test_accuracy=test_correct / 100, test_accuracy_ci_low=0.0,
           test_accuracy_ci_high=1.0, train_accuracy=float('nan'), dp_epsilon=float('inf'),
           dp_unit='client', train_seconds=2.0 * shift)
  return m, e


def test_combine_reports_the_replicated_statistics_under_the_usual_names():
  rng = np.random.default_rng(0)
  per = [_replicate(rng, s, c) for s, c in ((0.5, 80), (1.0, 90), (1.5, 85))]
  out = fedmia_replicates.combine(per, rng=np.random.default_rng(1), num_resamples=20)
  want = replicated.metrics([e for _, e in per], rng=np.random.default_rng(1),
                            num_resamples=20)
  assert out['replicates'] == 3 and out['interval_method'] == 't'
  for name in fedmia_replicates.ATTACK:
    assert out[name] == pytest.approx(want[name])
    assert (out[f'{name}_ci_low'], out[f'{name}_ci_high']) == (want[f'{name}_low'],
                                                                 want[f'{name}_high'])
    assert out[f'{name}_replicates'] == pytest.approx([m[name] for m, _ in per])
  # Counts add up over the trainings; other numbers are their mean.
  for name in ('n_pos', 'n_neg', 'n_neg_distinct'):
    assert out[name] == sum(m[name] for m, _ in per)
  assert out['log_auc'] == pytest.approx(np.mean([m['log_auc'] for m, _ in per]))
  assert out['train_seconds'] == pytest.approx(2.0)
  assert out['dp_unit'] == 'client' and out['dp_epsilon'] == float('inf')
  # Utility: the mean with the t-interval over the replicates, not one training's interval.
  assert out['test_accuracy'] == pytest.approx(0.85)
  mean, low, high = replicated.t_interval([0.8, 0.9, 0.85], bounds=(0.0, 1.0))
  assert (out['test_accuracy_ci_low'], out['test_accuracy_ci_high']) == pytest.approx(
      (low, high))
  assert out['test_accuracy_replicates'] == pytest.approx([0.8, 0.9, 0.85])
  assert np.isnan(out['train_accuracy']) and 'train_accuracy_ci_low' not in out
  # Each training's own intervals are kept beside, not reported.
  assert len(out['conditional']) == 3
  assert out['conditional'][2]['auc_ci_low'] == per[2][0]['auc_ci_low']


def test_one_replicate_keeps_its_utility_interval():
  rng = np.random.default_rng(2)
  per = [_replicate(rng, 1.0, 90)]
  out = fedmia_replicates.combine(per, rng=np.random.default_rng(3), num_resamples=20)
  assert out['replicates'] == 1
  assert out['interval_method'] == 'two_way_bootstrap_conditional'
  assert (out['test_accuracy_ci_low'], out['test_accuracy_ci_high']) == (0.0, 1.0)


def test_replicate_keys_are_fold_ins_and_differ():
  key = jax.random.key(5)
  assert jax.random.key_data(fedmia_replicates.key(key, 2)).tolist() == jax.random.key_data(
      jax.random.fold_in(key, 2)).tolist()
  assert (jax.random.key_data(fedmia_replicates.key(key, 0)).tolist() !=
          jax.random.key_data(fedmia_replicates.key(key, 1)).tolist())


def test_combine_keeps_flags_and_labels_and_drops_what_one_replicate_lacks():
  rng = np.random.default_rng(6)
  per = [_replicate(rng, s, c) for s, c in ((0.5, 90), (1.0, 92))]
  per[0][0].update(flag=True, mixed=True, label='a', labels='a', only_first=1.0,
                   big=np.float32(2.0**24), small=np.float32(1.0))
  per[1][0].update(flag=True, mixed=False, label='a', labels='b', big=np.float32(1.0),
                   small=np.float32(2.0))
  out = fedmia_replicates.combine(per, rng=np.random.default_rng(1), num_resamples=20)
  # A flag every replicate agrees on stays a flag; disagreeing ones become the rate.
  assert out['flag'] is True and out['mixed'] == 0.5
  assert out['label'] == 'a' and out['labels'] == ['a', 'b']
  assert 'only_first' not in out
  # Means in float64, whatever the replicates' dtype (float32 loses the 1 beside 2^24).
  assert out['small'] == 1.5 and out['big'] == (2.0**24 + 1) / 2
  # One training's intervals are kept under `conditional`; the top level reports the t.
  assert out['conditional'][0]['auc_ci_low'] == per[0][0]['auc_ci_low']
  assert out['auc_ci_low'] == out['auc_low'] != per[0][0]['auc_ci_low']
  # Two replicates: the t-interval over them, clipped to [0, 1].
  mean, low, high = replicated.t_interval([0.9, 0.92], bounds=(0.0, 1.0))
  assert (out['test_accuracy_ci_low'], out['test_accuracy_ci_high']) == pytest.approx(
      (low, high))
  assert 0.5 < low < 0.9 and high == 1.0


def test_one_replicate_bootstraps_with_the_given_resamples():
  rng = np.random.default_rng(7)
  per = [_replicate(rng, 1.0, 90)]
  per[0][0].update(flag=False)
  out = fedmia_replicates.combine(per, rng=np.random.default_rng(8), num_resamples=25)
  assert out['flag'] is False
  want = replicated.metrics([per[0][1]], rng=np.random.default_rng(8), num_resamples=25)
  assert out['num_resamples'] == want['num_resamples'] == 25
  assert (out['auc_ci_low'], out['auc_ci_high']) == (want['auc_low'], want['auc_high'])


_SHIFTS = {'fedmia_ii': 1.5, 'grad_cosine': 1.0, 'avg_cosine': 0.4, 'lira_offline': 1.4}


def _planted_entries(config, rec, attack):
  """Stands in for the recording's scores: replicate rec['r']'s fixed entries, each attack
  its own member shift and noise."""
  del config
  e = dict(_entries(np.random.default_rng(rec['r']), 0.0))
  noise = np.random.default_rng([rec['r'], len(attack)]).normal(size=e['labels'].size)
  e['scores'] = noise + _SHIFTS[attack] * e['labels']
  return e


def test_claims_compare_each_pair_of_present_attacks_on_the_same_entries(monkeypatch):
  from configs import digits  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  from fl_privacy import data as data_lib  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  from fl_privacy.report import point_key  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  config = digits.get_config()
  config.fedmia.attacks = tuple(_SHIFTS)
  config.fedmia.bootstrap_resamples = 20
  monkeypatch.setattr(fedmia_replicates, '_entries', _planted_entries)
  key = jax.random.key(3)
  # One replicate ('one') is where the keyed bootstrap is the reported interval.
  records = {'mlp': [dict(r=r) for r in range(3)], 'cnn': [dict(r=r) for r in range(3, 5)],
             'one': [dict(r=5)]}
  out = fedmia_replicates.claims(config, key, records)
  assert set(out) == {'mlp', 'cnn', 'one'}
  # Only the claims whose two attacks ran: the paper's two for FedMIA-II, then LiRA offline.
  want_pairs = [('fedmia_ii', 'grad_cosine'), ('fedmia_ii', 'avg_cosine'),
                ('fedmia_ii', 'lira_offline')]
  for model, recs in records.items():
    rows = out[model]
    assert [(r['winner'], r['loser']) for r in rows] == want_pairs
    for row in rows:
      want = replicated.compare(
          [_planted_entries(config, rec, row['winner']) for rec in recs],
          [_planted_entries(config, rec, row['loser']) for rec in recs],
          rng=data_lib.rng_from_key(point_key(key, {'claim': row['winner'],
                                                    'versus': row['loser'], 'model': model})),
          num_resamples=20)
      assert row['num_trainings'] == len(recs) and row['num_resamples'] == want['num_resamples']
      for name in ('auc_diff', 'auc_diff_low', 'auc_diff_high', 'tpr_diff', 'tpr_diff_low',
                   'tpr_diff_high', 'auc_a', 'auc_b'):
        assert row[name] == pytest.approx(want[name]), (model, row['loser'], name)
  # FedMIA-II planted above Avg-Cosine in every replicate: the interval says so.
  assert out['mlp'][1]['auc_diff_low'] > 0
  lines = fedmia_replicates.claim_lines(config, out['mlp'])
  assert lines[0] == '### Claims as paired differences (aligned)' and lines[-1] == ''
  assert '3 replicated trainings' in lines[2] and "Student's t" in lines[2]
  body = [l for l in lines if l.startswith('| FedMIA')]
  assert len(body) == 3 and 'Avg-Cosine' in body[1] and 'LiRA' in body[2]
  r = out['mlp'][1]
  assert (f'{r["auc_a"]:.3f} | {r["auc_b"]:.3f} | {r["auc_diff"]:+.3f} '
          f'[{r["auc_diff_low"]:+.3f}, {r["auc_diff_high"]:+.3f}]') in body[1]
  assert out['one'][0]['interval_method'] == 'two_way_bootstrap_conditional'
  assert lines[:2] == ['### Claims as paired differences (aligned)', '']
  assert lines[2] == (
      'A minus B on the same members and non-members of 3 replicated trainings: the mean of '
      "the per-replicate differences with a 95% interval (Student's t over the per-replicate "
      "values, R - 1 degrees of freedom; each training's threshold chosen on its own "
      "entries): the paper's claims (FedMIA-II over Grad-Cosine and Avg-Cosine, FedMIA-I over "
      "Blackbox-Loss and Loss-Series) and FedMIA-II against LiRA and RMIA, each for FedMIA "
      "with the paper's filter and with ours (leave-one-out). The 6 verdicts form one "
      'family. The "verdict" columns are each at 95% alone, not adjusted for it: they are '
      'exploratory; with no difference anywhere about 0.3 of them would read "better" or '
      '"worse" by chance. The "Holm" columns adjust the whole family (Holm 1979, two-sided '
      'p-values of the same per-replicate t statistics, family-wise 95%). An interval of zero '
      'width (replicates that agree) supports no verdict: "not estimable".')
  assert lines[3:6] == [
      '', '| A | B | AUC A | AUC B | A - B, AUC [95%] | verdict (AUC) | Holm (AUC) | '
      'TPR@0.1% A | TPR@0.1% B | A - B, TPR@0.1% (points) [95%] | verdict (TPR@0.1%) | '
      'Holm (TPR@0.1%) |', '|' + '---|' * 12]
  # The family: every row of a model, AUC and TPR, Holm-adjusted together.
  for model, rows in out.items():
    want = replicated.holm_family([{k: v for k, v in row.items() if 'holm' not in k
                                    and k != 'family_size'} for row in rows])
    for row, w in zip(rows, want):
      assert row['family_size'] == 2 * len(rows)
      for q in ('auc', 'tpr'):
        assert row[f'{q}_verdict_holm'] == w[f'{q}_verdict_holm']
        assert row[f'{q}_verdict_holm'] in body[0] + body[1] + body[2] or model != 'mlp'
  assert out['mlp'][1]['auc_p_holm'] >= out['mlp'][1]['auc_diff_p']
  assert all(c.count(' | ') == 11 for c in body)  # 12 cells
  assert body[0].startswith('| FedMIA-II (paper filter) | Grad-Cosine |')
  one = fedmia_replicates.claim_lines(config, out['one'][:1])
  assert 'of 1 replicated trainings' in one[2] and 'conditional on it' in one[2]
  assert (f'{100 * r["tpr_a"]:.2f} | {100 * r["tpr_b"]:.2f} | {100 * r["tpr_diff"]:+.2f} '
          f'[{100 * r["tpr_diff_low"]:+.2f}, {100 * r["tpr_diff_high"]:+.2f}]') in body[1]
  assert body[1].count('A better') >= 1
  assert fedmia_replicates.claim_lines(config, []) == []


def _small_recording(seed, num_rounds=3, num_clients=4, per_client=30, num_test=80):
  rng = np.random.default_rng(seed)
  q = num_clients * per_client + num_test
  owner = np.r_[np.repeat(np.arange(num_clients), per_client), np.full(num_test, -1)]
  own = owner[None, None, :] == np.arange(num_clients)[None, :, None]
  phi = 2.0 * rng.normal(size=q) + rng.normal(size=(num_rounds, num_clients, q)) + own
  loss = np.logaddexp(0.0, -phi)
  return dict(loss=loss, margin=phi, cos=phi + rng.normal(size=phi.shape), diff=-phi,
              grad_sq=loss[:, 0], rounds=np.arange(num_rounds) * 5 + 4, owner=owner)


def test_the_figure_phase_reads_point_scorings_aligned_scores_and_they_equal_a_fresh_scoring(
    monkeypatch):
  from configs import digits  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  from fl_privacy.attacks.passive import scores as scores_lib  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  from fl_privacy.pipelines import fedmia_figures  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  config = digits.get_config()
  s = config.fedmia
  s.attacks = ('blackbox_loss', 'avg_cosine', 'fedmia_ii', 'grad_cosine', 'loss_series',
               'fedmia_i', 'fedmia_ii@leave_one_out')
  s.single_round = 10
  s.bootstrap_resamples = 20
  key = jax.random.key(7)
  recs = [_small_recording(r) for r in range(3)]
  scored = fedmia_replicates.Scored()
  for r, rec in enumerate(recs):
    for a in s.attacks:
      _, e = evaluate.recording_metrics(
          dict(rec, num_test=np.array(80), test_correct=np.array([1, 2, 3]),
               train_seconds=np.array(1.0)),
          a, scoring='aligned', single_round=10, default_filter=s.outlier_filter,
          rng=np.random.default_rng(r), entries=True, **fedmia_figures.attack_options(config))
      scored.put('mlp', a, r, e)
  assert 'round_scores' in scored.get('mlp', 'fedmia_ii', 0)
  assert 'round_scores' not in scored.get('mlp', 'fedmia_ii', 1)  # only replicate 0's drawn
  assert scored.get('mlp', 'fedmia_ii', 3) is None and scored.get('cnn', 'fedmia_ii', 0) is None
  # Kept or scored again, the claims and the rounds curves are the same numbers.
  fresh = fedmia_replicates.claims(config, key, {'mlp': recs})
  assert len(fresh['mlp']) == 6
  # (repr: equal NaNs, e.g. an undefined interval, compare equal there)
  assert repr(fedmia_replicates.claims(config, key, {'mlp': recs}, scored)) == repr(fresh)
  curves = fedmia_figures.round_curves(config, key, {'mlp': recs[0]}, scored)
  assert repr(curves) == repr(fedmia_figures.round_curves(config, key, {'mlp': recs[0]}))
  # ... and what is kept is what they read: other kept scores give other numbers.
  flipped = fedmia_replicates.Scored()
  for a in s.attacks:
    e = dict(scored.get('mlp', a, 0))
    e['scores'], e['round_scores'] = -e['scores'], -e['round_scores']
    flipped.put('mlp', a, 0, e)
  other = fedmia_replicates.claims(config, key, {'mlp': recs}, flipped)
  assert [r['auc_a'] for r in other['mlp']] != [r['auc_a'] for r in fresh['mlp']]
  other_curves = fedmia_figures.round_curves(config, key, {'mlp': recs[0]}, flipped)
  assert (other_curves['mlp']['aligned']['fedmia_ii']['auc']
          != curves['mlp']['aligned']['fedmia_ii']['auc'])
  # The public code's redraws are never read from the kept aligned scores.
  assert other_curves['mlp']['public_code'] == curves['mlp']['public_code']
  with pytest.raises(ValueError, match='aligned'):
    evaluate.rounds_curve(recs[0], recs[0]['owner'], 'fedmia_ii', scoring='public_code',
                          rng=np.random.default_rng(0), scored=scored.get('mlp', 'fedmia_ii', 0))
  # The ROC scores only what it was not given: the public code's curves.
  calls = []
  real = scores_lib.pooled_round_scores
  monkeypatch.setattr(scores_lib, 'pooled_round_scores',
                      lambda *a, **kw: calls.append(kw['scoring']) or real(*a, **kw))
  fedmia_figures._plt().close(fedmia_figures.roc_figure(config, key, {'mlp': recs[0]}, scored))
  assert calls and set(calls) == {'public_code'}


def test_the_figure_phase_scores_what_it_lacks_with_the_runs_filter_and_rmia_options():
  """Scored again (nothing kept: a resumed run), the entries are point scoring's: the run's
  default filter and RMIA's gamma and a reach `_entries` as they reach `recording_metrics`."""
  from configs import digits  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  from fl_privacy.pipelines import fedmia_figures  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  config = digits.get_config()
  s = config.fedmia
  s.single_round, s.outlier_filter, s.rmia_gamma, s.rmia_a = 10, 'leave_one_out', 1.5, 0.3
  rec = dict(_small_recording(4), num_test=np.array(80), test_correct=np.array([1, 2, 3]),
             train_seconds=np.array(1.0))
  for attack in ('rmia', 'fedmia_ii'):
    _, kept = evaluate.recording_metrics(
        rec, attack, scoring='aligned', single_round=10, default_filter=s.outlier_filter,
        rng=np.random.default_rng(0), entries=True, **fedmia_figures.attack_options(config))
    fresh = fedmia_replicates._entries(config, rec, attack)
    assert set(fresh) == {'scores', 'labels', 'target', 'groups'}
    for k, v in fresh.items():
      np.testing.assert_array_equal(v, kept[k], err_msg=f'{attack} {k}')
    # ... and they are the options' entries, not the defaults'.
    default = evaluate.final_scores(rec, rec['owner'], attack, single_index=1)
    assert not np.array_equal(fresh['scores'], default['scores']), attack


def test_keep_holds_the_aligned_points_of_the_main_trainings_only():
  entries = [({}, dict(scores=np.r_[r, 1.0], labels=np.r_[0, 1], target=np.r_[0, 0],
                       groups=np.r_[0, 1], round_scores=np.zeros((2, 2)) + r)) for r in range(2)]
  scored = fedmia_replicates.Scored()
  main, sweep = dict(sweep='main', model='mlp'), dict(sweep='noniid', model='mlp')
  scored.keep(sweep, 'fedmia_ii', 'aligned', entries)
  scored.keep(main, 'fedmia_ii', 'public_code', entries)
  assert scored.get('mlp', 'fedmia_ii', 0) is None
  scored.keep(main, 'fedmia_ii', 'aligned', entries)
  assert scored.entries('mlp', 'fedmia_ii', 1)['scores'].tolist() == [1.0, 1.0]
  assert scored.aligned('mlp', 'fedmia_ii', 'aligned')['round_scores'].sum() == 0
  assert scored.aligned('mlp', 'fedmia_ii', 'public_code') is None


def test_the_orderings_verdict_comes_from_intervals_never_from_point_estimates():
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import fedmia_tables  # pylint: disable=g-import-not-at-top
  config = digits.get_config('smoke')
  s = config.fedmia

  def row(tpr, low, high):
    return {'tpr_at_fpr_1e-3': tpr, 'tpr_at_fpr_1e-3_ci_low': low,
            'tpr_at_fpr_1e-3_ci_high': high}

  def verdict(w, l):
    key = lambda a: (s.models[0], a, 'none', None, math.inf, int(s.num_clients),  # noqa: E731
                     int(s.local_epochs), 'aligned')
    idx = {key('fedmia_ii'): w, key('grad_cosine'): l}
    lines = [x for x in fedmia_tables._ordering_lines(idx, config, s.models[0])
             if 'Grad-Cosine' in x]
    assert len(lines) == 1, lines
    return lines[0].rsplit(': ', 1)[1]

  assert verdict(row(0.3, 0.2, 0.4), row(0.1, 0.0, 0.15)) == 'holds (intervals disjoint)'
  assert verdict(row(0.1, 0.0, 0.15), row(0.3, 0.2, 0.4)) == (
      'does not hold (intervals disjoint, reversed)')
  # Overlapping intervals: no verdict either way, whichever point estimate is higher.
  assert verdict(row(0.3, 0.1, 0.5), row(0.2, 0.1, 0.4)) == (
      'not shown (intervals overlap; higher as a point estimate)')
  assert verdict(row(0.2, 0.1, 0.4), row(0.3, 0.1, 0.5)) == (
      'not shown (intervals overlap; not higher as a point estimate)')
  # Zero-width or undefined intervals (replicates that agree) show nothing, even disjoint.
  assert verdict(row(0.3, 0.3, 0.3), row(0.1, 0.0, 0.15)).startswith('not estimable')
  assert verdict(row(0.3, 0.2, 0.4), row(0.1, 0.1, 0.1 + 1e-15)).startswith('not estimable')
  assert verdict(row(0.3, 0.2, 0.4), row(0.1, math.nan, 0.15)).startswith('not estimable')


def test_claim_lines_print_no_verdict_from_a_zero_width_interval():
  from configs import digits  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  config = digits.get_config()
  base = dict(winner='fedmia_ii', loser='grad_cosine', num_trainings=3, interval_method='t',
              auc_a=0.8, auc_b=0.7, tpr_a=0.1, tpr_b=0.17)
  # The well-generalising run's "-0.07 [-0.07, -0.07], B better": replicates that agree.
  flat = dict(base, auc_diff=0.1, auc_diff_low=0.05, auc_diff_high=0.15, auc_diff_p=0.01,
              tpr_diff=-0.07, tpr_diff_low=-0.07, tpr_diff_high=-0.07,
              tpr_diff_p=float('nan'))
  rows = fedmia_replicates.replicated.holm_family([flat])
  line = [l for l in fedmia_replicates.claim_lines(config, rows) if l.startswith('| FedMIA')][0]
  cells = line.split(' | ')
  assert cells[5] == 'A better (interval above 0)' and cells[6].startswith('A better')
  assert cells[10].startswith('not estimable') and cells[11].startswith('not estimable')
  assert 'B better' not in line
  # Rows from before Holm (a claims.json written earlier) still print, saying so.
  old = {k: v for k, v in flat.items() if k != 'tpr_diff_p'}
  line = fedmia_replicates.claim_lines(config, [old])[-2]
  assert line.endswith(' | not computed (run before Holm) |')
  # From mutation survivors: an interval method without words is named as it is; the
  # winner's label carries the run's filter (leave-one-out here), not the default.
  config.fedmia.outlier_filter = 'leave_one_out'
  lines = fedmia_replicates.claim_lines(config, [dict(old, interval_method='other')])
  assert '95% interval (other; each training' in lines[2]
  assert lines[-2].startswith('| FedMIA-II (leave-one-out filter) | Grad-Cosine |')


def test_the_ordering_lines_in_full():
  # From fedmia_tables._ordering_lines' mutation survivors: each scoring's lines, the
  # percentages, intervals that touch (no verdict), equal point estimates, and a missing
  # attack that skips only its own line.
  from configs import digits  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  from fl_privacy.pipelines import fedmia_tables  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  config = digits.get_config('smoke')
  s = config.fedmia

  def row(tpr, low, high):
    return {'tpr_at_fpr_1e-3': tpr, 'tpr_at_fpr_1e-3_ci_low': low,
            'tpr_at_fpr_1e-3_ci_high': high}

  def key(attack, scoring):
    return (s.models[0], attack, 'none', None, math.inf, int(s.num_clients),
            int(s.local_epochs), scoring)

  idx = {key('fedmia_ii@leave_one_out', 'aligned'): row(0.02, 0.01, 0.03),
         key('avg_cosine', 'aligned'): row(0.02, 0.005, 0.01),  # touches from below
         key('fedmia_ii', 'public_code'): row(0.3, 0.2, 0.4),
         key('grad_cosine', 'public_code'): row(0.5, 0.4, 0.6),  # touches from above
         key('avg_cosine', 'public_code'): row(0.1, 0.0, 0.15)}
  lines = fedmia_tables._ordering_lines(idx, config, s.models[0])  # pylint: disable=protected-access
  assert lines == [
      '- aligned: FedMIA-II (leave-one-out filter) 2.00% vs Avg-Cosine 2.00% at 0.1% FPR: not '
      'shown (intervals overlap; not higher as a point estimate)',
      '- public_code: FedMIA-II (paper filter) 30.00% vs Grad-Cosine 50.00% at 0.1% FPR: not '
      'shown (intervals overlap; not higher as a point estimate)',
      '- public_code: FedMIA-II (paper filter) 30.00% vs Avg-Cosine 10.00% at 0.1% FPR: holds '
      '(intervals disjoint)']
