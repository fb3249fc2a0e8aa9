"""Passive attacks (FedMIA and baselines): filters, per-round scores, scorings, metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats
from sklearn import metrics as skm

from fl_privacy.attacks.passive import evaluate
from fl_privacy.attacks.passive import fedmia
from fl_privacy.attacks.passive import scores


@pytest.mark.parametrize('m', range(2, 11))
def test_paper_filter_never_fires_with_at_most_ten_shadows(m):
  rng = np.random.default_rng(m)
  s = rng.normal(size=(m, 2000))
  s[0] = 1e6  # a planted, absurd outlier in every column
  s[:, :5] = 0.0
  s[1, :5] = 1.0  # the extreme case: one value against m - 1 equal ones (z = sqrt(m - 1))
  assert not fedmia.outlier_mask(s, 'paper').any()


@pytest.mark.parametrize('m', [3, 5, 9, 10, 20])
def test_leave_one_out_removes_a_planted_outlier(m):
  rng = np.random.default_rng(m)
  s = rng.normal(size=(m, 500))
  s[m // 2] = 100.0
  mask = fedmia.outlier_mask(s, 'leave_one_out')
  assert mask[m // 2].all()
  # On Gaussian shadows alone it removes few values (more with few shadows).
  assert mask[np.arange(m) != m // 2].mean() < (0.2 if m == 3 else 0.05)


def test_paper_filter_can_fire_with_many_shadows():
  s = np.zeros((20, 1))
  s[3] = 1.0  # z = sqrt(19) > 3
  assert fedmia.outlier_mask(s, 'paper')[3, 0] and fedmia.outlier_mask(s, 'paper').sum() == 1


def test_leave_one_out_matches_definition():
  rng = np.random.default_rng(0)
  s = rng.standard_t(2, size=(9, 300))
  mask = fedmia.outlier_mask(s, 'leave_one_out')
  for j in range(9):
    others = np.delete(s, j, axis=0)
    want = s[j] > others.mean(0) + 3 * others.std(0)
    np.testing.assert_array_equal(mask[j], want)


def _loo_tie_columns(m: int) -> np.ndarray:
  """Columns where x_0 - mu_{-0} = 3 sigma_{-0} exactly in binary: the others alternate
  +-2^-e around an offset (mean offset, population sd 2^-e)."""
  cols = []
  for offset, e in [(0.0, 0), (0.5, 4), (-3.0, 10), (1024.0, 7), (-0.0625, 20)]:
    others = offset + np.resize([1.0, -1.0], m - 1) * 2.0 ** -e
    cols.append(np.r_[offset + 3 * 2.0 ** -e, others])
  return np.stack(cols, axis=1)


@pytest.mark.parametrize('m', [3, 5, 19])
def test_leave_one_out_decides_exact_ties_and_hard_columns_as_the_direct_form(m):
  # The O(m n) shortcut must give the decisions of the direct O(m^2 n) sums on every column,
  # ties included: float32 measurements put exact ties on real data.
  ties = _loo_tie_columns(m)
  if m % 2 == 1:  # m - 1 even: the others' mean is the offset exactly
    assert not fedmia.outlier_mask(ties, 'leave_one_out')[0].any()
    nudged = ties.copy()
    nudged[0] += np.abs(nudged[0]) * 2.0 ** -40 + 2.0 ** -60
    assert fedmia.outlier_mask(nudged, 'leave_one_out')[0].all()
  rng = np.random.default_rng(m)
  hard = [ties,
          np.float32(rng.normal(size=(m, 4000)) * 1e-3 - 4.3e-3).astype(np.float64),
          rng.integers(-2, 3, size=(m, 4000)).astype(np.float64),  # many equal values
          1e6 + rng.normal(size=(m, 500)),                          # offset >> spread
          np.zeros((m, 3))]
  spike = np.zeros((m, 4))
  spike[1] = [1.0, 1e-300, -1.0, 1e300]
  hard.append(spike)
  for s in hard:
    want = fedmia._leave_one_out_direct(s)  # pylint: disable=protected-access
    want[:, want.all(axis=0)] = False
    np.testing.assert_array_equal(fedmia.outlier_mask(s, 'leave_one_out'), want)


def test_round_scores_are_the_gaussian_cdf_of_kept_shadows():
  rng = np.random.default_rng(1)
  v = rng.normal(size=(6, 50))
  v[2, :10] = 40.0  # shadow 2 owns the first ten queries
  for method in fedmia.FILTERS:
    got, removed = fedmia.round_scores(v, target=4, method=method)
    shadows = np.delete(v, 4, axis=0)
    keep = ~fedmia.outlier_mask(shadows, method)
    for q in range(50):
      kept = shadows[keep[:, q], q]
      want = scipy_stats.norm.cdf(v[4, q], kept.mean(), np.sqrt(kept.var() + 1e-8))
      assert got[q] == pytest.approx(want, rel=1e-9, abs=1e-12)
    np.testing.assert_array_equal(removed, ~keep)
  _, removed = fedmia.round_scores(v, target=4, method='leave_one_out')
  assert removed[2, :10].all()  # rows of `removed` skip the target: shadow 2 stays row 2


def _recording(rng, num_rounds=4, num_clients=5, per_client=40, num_test=60, shift=0.0,
               spread=1.0):
  """Synthetic measurements: a per-query difficulty shared by all clients and rounds, noise,
  and `shift` added where a client measures its own data."""
  q = num_clients * per_client + num_test
  owner = np.r_[np.repeat(np.arange(num_clients), per_client), np.full(num_test, -1)]
  difficulty = spread * rng.normal(size=q)
  cos = difficulty[None, None, :] + 0.3 * rng.normal(size=(num_rounds, num_clients, q))
  cos += shift * (owner[None, None, :] == np.arange(num_clients)[None, :, None])
  return dict(loss=-cos, cos=cos, diff=cos, grad_sq=rng.normal(size=(num_rounds, q)) ** 2,
              rounds=np.arange(num_rounds) * 2 + 1), owner


def test_pooled_counts_and_labels():
  rng = np.random.default_rng(2)
  rec, owner = _recording(rng)
  pooled = scores.pooled_round_scores(rec, owner, 'fedmia_ii')
  q = owner.size
  assert pooled['scores'].shape == (4, 5 * q)
  assert pooled['labels'].sum() == 200 and (pooled['labels'] == 0).sum() == 5 * q - 200
  m = evaluate.evaluate(rec, owner, 'avg_cosine')
  assert m['n_pos'] == 200 and m['n_neg'] == 5 * q - 200


def test_public_code_scoring_inflates_low_fpr_but_aligned_does_not():
  """Queries differ in difficulty; members get no signal at all. Aligned scoring sees
  chance; averaging different non-members per round (the public code) narrows the null."""
  rng = np.random.default_rng(3)
  rec, owner = _recording(rng, num_rounds=10, shift=0.0, spread=1.0)
  aligned = evaluate.evaluate(rec, owner, 'avg_cosine', scoring='aligned')
  public = evaluate.evaluate(rec, owner, 'avg_cosine', scoring='public_code',
                             rng=np.random.default_rng(0))
  assert aligned['tpr_at_fpr_1e-2_ci_low'] <= 0.02
  assert public['tpr_at_fpr_1e-2_ci_low'] > 0.1
  # One round: the redraw only reorders non-members, so nothing changes.
  single_a = evaluate.evaluate(rec, owner, 'grad_cosine', scoring='aligned')
  single_p = evaluate.evaluate(rec, owner, 'grad_cosine', scoring='public_code',
                               rng=np.random.default_rng(0))
  assert single_a['auc'] == single_p['auc']
  assert single_a['tpr_at_fpr_1e-3'] == single_p['tpr_at_fpr_1e-3']


def test_fedmia_removes_per_query_difficulty():
  """FedMIA compares with the same query's values at other clients, so a shared difficulty
  cancels and a small member shift is found; Avg-Cosine is swamped by the difficulty."""
  rng = np.random.default_rng(4)
  rec, owner = _recording(rng, num_rounds=6, shift=0.5, spread=3.0)
  fm = evaluate.evaluate(rec, owner, 'fedmia_ii', default_filter='none')
  avg = evaluate.evaluate(rec, owner, 'avg_cosine')
  assert fm['auc_ci_low'] > avg['auc_ci_high']


def test_best_round_is_at_least_every_single_round():
  rng = np.random.default_rng(5)
  rec, owner = _recording(rng, num_rounds=5, shift=0.4)
  best = evaluate.evaluate(rec, owner, 'grad_cosine_best_round')
  for i in range(5):
    single = evaluate.evaluate(rec, owner, 'grad_cosine', single_index=i)
    assert best['tpr_at_fpr_1e-3'] >= single['tpr_at_fpr_1e-3']
  assert best['round'] in set(rec['rounds'] + 1)


def test_score_metrics_against_sklearn():
  rng = np.random.default_rng(6)
  labels = rng.integers(0, 2, 3000)
  s = rng.normal(size=3000) + labels
  m = evaluate.score_metrics(s, labels, target=rng.integers(0, 3, 3000))
  assert m['auc'] == pytest.approx(skm.roc_auc_score(labels, s))
  fpr, tpr, _ = skm.roc_curve(labels, s, drop_intermediate=False)
  assert m['tpr_at_fpr_1e-2'] == pytest.approx(tpr[fpr <= 1e-2].max(), abs=1 / labels.sum())
  for name in ('auc', 'tpr_at_fpr_1e-2', 'tpr_at_fpr_1e-3'):
    assert m[f'{name}_ci_low'] <= m[name] <= m[f'{name}_ci_high']
  assert m['auc_target_min'] <= m['auc'] <= m['auc_target_max']


def test_attack_names():
  # Without a suffix FedMIA is the paper's filter (Eqs. 8-9); ours keeps its own name.
  assert scores.parse('fedmia_ii') == ('fedmia_ii', 'paper')
  assert scores.parse('fedmia_i') == ('fedmia_i', 'paper')
  assert scores.parse('fedmia_ii@leave_one_out') == ('fedmia_ii', 'leave_one_out')
  assert scores.parse('fedmia_i@paper') == ('fedmia_i', 'paper')
  assert scores.label('fedmia_ii') == 'FedMIA-II (paper filter)'
  assert scores.label('fedmia_ii@leave_one_out') == 'FedMIA-II (leave-one-out filter)'
  assert scores.parse('avg_cosine') == ('avg_cosine', None)
  assert scores.parse('rmia') == ('rmia', None)
  for bad in ('fedmia_iii', 'avg_cosine@paper', 'fedmia_ii@median', 'lira_offline@paper',
              'lira_online@paper', 'lira'):
    with pytest.raises(ValueError):
      scores.parse(bad)


def _loss_recording(rng, num_rounds=3, num_clients=5, per_client=60, num_test=150, shift=1.5):
  """Losses whose logit confidence is a per-query difficulty + noise, + `shift` where a
  client measures its own data (members)."""
  q = num_clients * per_client + num_test
  owner = np.r_[np.repeat(np.arange(num_clients), per_client), np.full(num_test, -1)]
  phi = 2.0 * rng.normal(size=q) + rng.normal(size=(num_rounds, num_clients, q))
  phi += shift * (owner[None, None, :] == np.arange(num_clients)[None, :, None])
  loss = np.logaddexp(0.0, -phi)  # phi = logit(exp(-loss))
  return dict(loss=loss, margin=phi, cos=phi, diff=phi, grad_sq=loss[:, 0],
              rounds=np.arange(num_rounds)), owner


# Online LiRA needs IN measurements: tests/attacks/test_lira_rmia.py.
@pytest.mark.parametrize('attack', [a for a in scores.REFERENCE if a not in scores.ONLINE])
def test_lira_and_rmia_through_evaluate_equal_the_library_and_beat_chance(attack):
  from fl_privacy.attacks.passive import lira  # pylint: disable=g-import-not-at-top
  from fl_privacy.attacks.passive import rmia  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(11)
  rec, owner = _loss_recording(rng)
  m = evaluate.evaluate(rec, owner, attack, rmia_gamma=1.5, rmia_a=0.4)
  if attack == 'rmia':
    direct = rmia.pooled_round_scores(rec, owner, gamma=1.5, a=0.4)
    final = rmia.combine_rounds(direct['scores'])
  else:
    direct = lira.pooled_round_scores(rec, owner,
                                      fixed_variance=attack == 'lira_offline_fixed')
    final = lira.combine_rounds(direct['scores'])
  want = evaluate.score_metrics(final, direct['labels'], direct['target'])
  for name, value in want.items():
    assert m[name] == pytest.approx(value, rel=1e-12, abs=1e-15), name
  assert m['auc_ci_low'] > 0.6
  assert m['round'] == 3 and np.isnan(m['filter_removed_fraction'])
  # The options reach RMIA: another gamma gives other scores.
  if attack == 'rmia':
    assert evaluate.evaluate(rec, owner, attack, rmia_gamma=1.0, rmia_a=0.4)['auc'] != m['auc']


@pytest.mark.parametrize('attack', ['fedmia_ii', 'lira_offline', 'rmia', 'avg_cosine'])
@pytest.mark.parametrize('scoring', scores.SCORINGS)
def test_distinct_negatives_and_bootstrap_fields(attack, scoring):
  if not scores.supports(attack, scoring):
    pytest.skip(f'{attack} is not scored under {scoring}')
  rng = np.random.default_rng(12)
  rec, owner = _loss_recording(rng, shift=0.7)
  m = evaluate.evaluate(rec, owner, attack, scoring=scoring, rng=np.random.default_rng(3))
  # Every query but the test rows (public_code_2024) is some target's non-member.
  want_distinct = (owner >= 0).sum() if scoring == 'public_code_2024' else owner.size
  assert m['n_neg_distinct'] == want_distinct < m['n_neg']
  for name, fpr in evaluate.FPRS.items():
    assert m[f'{name}_boot_low'] <= m[name] <= m[f'{name}_boot_high']
    assert 0.0 <= m[f'{name}_boot_low'] and m[f'{name}_boot_high'] <= 1.0
    # The false positives at the threshold are at most fpr * n_neg entries, from at most as
    # many distinct queries.
    assert 0 <= m[f'{name}_distinct_negatives'] <= min(m['n_neg_distinct'],
                                                      math.floor(fpr * m['n_neg'] + 1e-9))
  # More false positives at 1% than at 0.1% FPR: at least as many distinct queries.
  assert m['tpr_at_fpr_1e-2_distinct_negatives'] >= m['tpr_at_fpr_1e-3_distinct_negatives']
  # No Generator, no bootstrap; the rest equal.
  plain = evaluate.evaluate(rec, owner, attack, scoring=scoring,
                            rng=np.random.default_rng(3) if scoring == 'public_code' else None)
  if scoring != 'public_code':
    assert 'tpr_at_fpr_1e-3_boot_low' not in plain
    assert plain['tpr_at_fpr_1e-3_distinct_negatives'] == m['tpr_at_fpr_1e-3_distinct_negatives']


def test_distinct_negatives_count_queries_not_entries():
  """A test query scored against every target: 5 entries, one query. With the queries as
  groups the false positives of one query count once."""
  labels = np.r_[np.ones(10), np.zeros(1000)]
  s = np.r_[np.full(10, 5.0), np.full(5, 3.0), np.zeros(995)]  # 5 top non-member entries
  groups = np.r_[np.arange(10), np.full(5, 10), 11 + np.arange(995)]
  m = evaluate.score_metrics(s, labels, groups=groups)
  assert m['tpr_at_fpr_1e-2'] == 1.0 and m['tpr_at_fpr_1e-2_distinct_negatives'] == 1
  m = evaluate.score_metrics(s, labels, groups=np.arange(1010))
  assert m['tpr_at_fpr_1e-2_distinct_negatives'] == 5


def test_public_code_2024_nonmembers_are_the_other_clients_training_rows():
  rng = np.random.default_rng(13)
  rec, owner = _loss_recording(rng, num_clients=4, per_client=10, num_test=7)
  for k in range(4):
    members, nonmembers = scores.target_views(owner, k, 'public_code_2024')
    np.testing.assert_array_equal(members, np.flatnonzero(owner == k))
    np.testing.assert_array_equal(nonmembers, np.flatnonzero((owner != k) & (owner != -1)))
  pooled = scores.pooled_round_scores(rec, owner, 'fedmia_i', scoring='public_code_2024')
  queries = scores.pooled_queries(owner, 4, 'public_code_2024')
  assert (owner[queries[pooled['labels'] == 0]] >= 0).all()
  assert (owner[queries[pooled['labels'] == 0]] != pooled['target'][pooled['labels'] == 0]).all()
  # Aligned: the scores of the entries it keeps are the aligned scoring's, entry by entry.
  aligned = scores.pooled_round_scores(rec, owner, 'fedmia_i')
  keep = owner[scores.pooled_queries(owner, 4)] != -1
  np.testing.assert_array_equal(pooled['scores'], aligned['scores'][:, keep])
  m = evaluate.evaluate(rec, owner, 'lira_offline', scoring='public_code_2024')
  assert m['n_pos'] == 40 and m['n_neg'] == 4 * 30


def test_rmia_refuses_the_public_code_scoring():
  rng = np.random.default_rng(15)
  rec, owner = _loss_recording(rng, num_rounds=2)
  assert not scores.supports('rmia', 'public_code')
  aligned_only = {'rmia', 'lira_online', 'lira_online_fixed'}
  assert all(scores.supports(a, sc) for a in scores.ATTACKS for sc in scores.SCORINGS
             if a not in aligned_only or sc != 'public_code')
  assert not any(scores.supports(a, 'public_code') for a in aligned_only)
  with pytest.raises(ValueError, match='RMIA is scored aligned only'):
    evaluate.evaluate(rec, owner, 'rmia', scoring='public_code', rng=np.random.default_rng(0))
  assert evaluate.evaluate(rec, owner, 'rmia', scoring='public_code_2024')['auc'] > 0.6


def test_public_code_lira_keeps_members_and_uses_the_rng():
  rng = np.random.default_rng(14)
  rec, owner = _loss_recording(rng, num_rounds=4)
  for attack in ('lira_offline', 'lira_offline_fixed'):
    aligned = scores.pooled_round_scores(rec, owner, attack)
    public = scores.pooled_round_scores(rec, owner, attack, scoring='public_code',
                                        rng=np.random.default_rng(0))
    again = scores.pooled_round_scores(rec, owner, attack, scoring='public_code',
                                       rng=np.random.default_rng(0))
    np.testing.assert_array_equal(public['scores'], again['scores'])
    member = public['labels'] == 1
    assert not np.array_equal(public['scores'][:, ~member], aligned['scores'][:, ~member])
    if attack == 'lira_offline':  # members aligned in every row: their test is unchanged
      np.testing.assert_array_equal(public['scores'][:, member], aligned['scores'][:, member])
    else:  # the fixed variance pools the permuted non-member columns too
      assert not np.array_equal(public['scores'][:, member], aligned['scores'][:, member])
    # evaluate's bootstrap Generator is spawned: the permutations are those of the rng given.
    m = evaluate.evaluate(rec, owner, attack, scoring='public_code',
                          rng=np.random.default_rng(0))
    want = evaluate.score_metrics(public['scores'].mean(axis=0), public['labels'])
    assert m['auc'] == want['auc'] and m['tpr_at_fpr_1e-3'] == want['tpr_at_fpr_1e-3']


def test_compare_is_the_paired_difference_of_what_evaluate_scores():
  rng = np.random.default_rng(21)
  rec, owner = _loss_recording(rng, num_rounds=3, shift=1.0)
  rec = dict(rec, owner=owner)
  kw = dict(rmia_gamma=1.5, rmia_a=0.4)
  out = evaluate.compare(rec, 'fedmia_i', 'blackbox_loss', rng=np.random.default_rng(0),
                         single_index=0, num_resamples=200, **kw)
  a = evaluate.evaluate(rec, owner, 'fedmia_i', **kw)
  b = evaluate.evaluate(rec, owner, 'blackbox_loss', single_index=0, **kw)
  assert out['auc_a'] == pytest.approx(a['auc']) and out['auc_b'] == pytest.approx(b['auc'])
  assert out['tpr_a'] == pytest.approx(a['tpr_at_fpr_1e-3'])
  assert out['tpr_b'] == pytest.approx(b['tpr_at_fpr_1e-3'])
  assert out['auc_diff'] == pytest.approx(a['auc'] - b['auc'])
  # The multi-round mean beats one round here, and the paired interval says so.
  assert out['auc_diff_low'] > 0
  assert out['num_groups'] == owner.size and out['num_resamples'] == 200
  # The single round is the one asked for, not the last.
  last = evaluate.compare(rec, 'fedmia_i', 'blackbox_loss', rng=np.random.default_rng(0),
                          num_resamples=200, **kw)
  assert last['auc_b'] == pytest.approx(evaluate.evaluate(rec, owner, 'blackbox_loss', **kw)['auc'])
  assert last['auc_b'] != pytest.approx(out['auc_b'])
  # RMIA's options reach the scores, at 1% FPR too.
  r = evaluate.compare(rec, 'rmia', 'rmia', rng=np.random.default_rng(1), fpr=0.01,
                       num_resamples=50, **kw)
  assert r['auc_a'] == pytest.approx(evaluate.evaluate(rec, owner, 'rmia', **kw)['auc'])
  assert r['tpr_a'] == pytest.approx(evaluate.evaluate(rec, owner, 'rmia', **kw)['tpr_at_fpr_1e-2'])
  assert r['auc_diff_low'] == r['auc_diff_high'] == 0.0
  other = evaluate.compare(rec, 'rmia', 'rmia', rng=np.random.default_rng(1), num_resamples=50)
  assert other['auc_a'] != pytest.approx(r['auc_a'])


def test_final_scores_name_the_round_and_the_queries():
  rng = np.random.default_rng(22)
  rec, owner = _loss_recording(rng, num_rounds=3)
  f = evaluate.final_scores(rec, owner, 'grad_cosine', single_index=1)
  assert f['round'] == 2 and f['scores'].shape == f['labels'].shape == f['groups'].shape
  np.testing.assert_array_equal(f['groups'], scores.pooled_queries(owner, 5))
  assert evaluate.final_scores(rec, owner, 'loss_series')['round'] == 3
  best = evaluate.final_scores(rec, owner, 'grad_cosine_best_round')
  assert best['round'] == evaluate.evaluate(rec, owner, 'grad_cosine_best_round')['round']
