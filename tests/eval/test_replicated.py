"""`eval.replicated` and `eval.coverage`: weighted statistics against sklearn and copied
entries, the t-interval by hand, Owen's two-way weights, the checks, and coverage by
simulation (the t-interval over replicates near 95%, the conditional interval well below it
when trainings differ)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import stats as sps
from sklearn import metrics as skm

from fl_privacy.eval import bootstrap
from fl_privacy.eval import coverage
from fl_privacy.eval import metrics
from fl_privacy.eval import paired
from fl_privacy.eval import replicated
from fl_privacy.eval import stats

FPRS = [0.0, 1e-3, 0.01, 0.05, 0.2, 0.5, 1.0]


def _rep(rng, num_clients=4, num_queries=30, shift=1.0, ties=False):
  """One training's entries: every query scored against every client, query q owned by
  client q % K for the first half of the queries, by no one after."""
  target = np.repeat(np.arange(num_clients), num_queries) + 10  # ids need not be 0 .. K - 1
  groups = np.tile(np.arange(num_queries), num_clients) * 3
  owner = np.where(np.arange(num_queries) < num_queries // 2,
                   np.arange(num_queries) % num_clients, -1)
  labels = (owner[groups // 3] == target - 10).astype(int)
  scores = rng.normal(size=target.size) + shift * labels + rng.normal(size=num_queries)[groups // 3]
  if ties:
    scores = np.round(scores)
  return dict(scores=scores, labels=labels, target=target, groups=groups)


@pytest.mark.parametrize('ties', [False, True])
def test_weighted_auc_equals_sklearn_with_sample_weight(ties):
  rng = np.random.default_rng(0)
  rep = _rep(rng, ties=ties)
  w = rng.integers(0, 4, size=(25, rep['scores'].size))
  got = replicated.weighted_auc(rep['scores'], rep['labels'], w)
  for b in range(w.shape[0]):
    want = skm.roc_auc_score(rep['labels'], rep['scores'], sample_weight=w[b])
    assert got[b] == pytest.approx(want, abs=1e-12)
  assert replicated.weighted_auc(rep['scores'], rep['labels'], w[3]) == pytest.approx(got[3])
  ones = np.ones(rep['scores'].size, int)
  assert replicated.weighted_auc(rep['scores'], rep['labels'], ones) == pytest.approx(
      metrics.roc_auc(rep['scores'], rep['labels']), abs=1e-12)
  only_members = rep['labels'].astype(int)[None, :]
  assert np.isnan(replicated.weighted_auc(rep['scores'], rep['labels'], only_members)[0])


def test_equal_infinite_scores_tie():
  scores = np.array([np.inf, np.inf, 1.0, 0.0, -np.inf, 2.0, -np.inf])
  labels = np.array([1, 0, 1, 0, 0, 1, 1])
  w = np.array([2, 1, 1, 3, 1, 1, 2])
  finite = np.clip(scores, -1e300, 1e300)
  assert replicated.weighted_auc(scores, labels, w) == pytest.approx(
      skm.roc_auc_score(labels, finite, sample_weight=w), abs=1e-12)
  copies = np.repeat(np.arange(7), w)
  for f in (0.0, 0.2, 0.5):
    assert replicated.weighted_tpr_at_fpr(scores, labels, f, w) == metrics.tpr_at_fpr(
        finite[copies], labels[copies], f)


@pytest.mark.parametrize('ties', [False, True])
def test_weighted_tpr_equals_the_tpr_of_repeated_entries(ties):
  rng = np.random.default_rng(1)
  rep = _rep(rng, num_clients=10, num_queries=200, ties=ties)
  s, y = rep['scores'], rep['labels']
  w = rng.integers(0, 3, size=(12, s.size))
  # Weight taken off the top of the ranking moves a low FPR's threshold below the tail that
  # `tail_runs` looks at first: the redo on all runs must find it.
  w[0, np.argsort(-s)[:300]] = 0
  got = replicated.weighted_tpr_at_fpr(s, y, FPRS, w)
  for b in range(w.shape[0]):
    copies = np.repeat(np.arange(s.size), w[b])
    np.testing.assert_array_equal(got[:, b], metrics.tpr_at_fpr(s[copies], y[copies], FPRS))
  assert replicated.weighted_tpr_at_fpr(s, y, 0.01, np.ones(s.size)) == metrics.tpr_at_fpr(
      s, y, 0.01)
  with pytest.raises(ValueError, match='fpr'):
    replicated.weighted_tpr_at_fpr(s, y, 1.5, w)
  with pytest.raises(ValueError, match='non-negative'):
    replicated.weighted_tpr_at_fpr(s, y, 0.1, -w)


def test_t_interval_matches_scipy_by_hand():
  values = [0.61, 0.64, 0.58, 0.66, 0.60]
  mean, low, high = replicated.t_interval(values, 0.95)
  sem = np.std(values, ddof=1) / np.sqrt(5)
  q = sps.t.ppf(0.975, 4)  # 2.776: a normal quantile (1.96) would be far narrower
  assert mean == pytest.approx(np.mean(values))
  assert (low, high) == pytest.approx((mean - q * sem, mean + q * sem), rel=1e-12)
  assert (low, high) == pytest.approx(sps.t.interval(0.95, 4, loc=mean, scale=sem), rel=1e-12)
  assert replicated.t_interval(values, 0.9)[2] < high
  assert replicated.t_interval([0.2, 0.9], 0.95, (0.0, 1.0))[1:] == (0.0, 1.0)
  one = replicated.t_interval([0.7])
  assert one[0] == 0.7 and np.isnan(one[1]) and np.isnan(one[2])


@pytest.mark.parametrize('num_resamples,chunk', [(6, None), (1, None), (5, 40)])
def test_hierarchical_bootstrap_weighs_entries_by_client_times_query_multiplicity(
    num_resamples, chunk, monkeypatch):
  if chunk is not None:
    # A chunk of one resample (36 entries a replicate): the chunk loop's bounds are exercised.
    monkeypatch.setattr(replicated, 'CHUNK_ELEMENTS', chunk)
  rng = np.random.default_rng(2)
  reps = [_rep(rng, num_clients=3, num_queries=12, shift=s) for s in (0.5, 1.0, 1.5)]
  checked = [replicated._Replicate(r, i) for i, r in enumerate(reps)]
  (auc, tpr), = replicated.hierarchical_resamples([checked], np.array([0.1]),
                                                  rng=np.random.default_rng(7),
                                                  num_resamples=num_resamples)
  # The same draws, in the same order, applied by copying entries.
  draws = np.random.default_rng(7)
  slots = draws.integers(0, 3, size=(num_resamples, 3))
  if num_resamples == 1:
    assert np.unique(slots).size < 3  # a replicate left out: the loop must go on past it
  want_auc = np.zeros((num_resamples, 3))
  want_tpr = np.zeros((num_resamples, 3))
  for r, rep in enumerate(reps):
    b_idx, j_idx = np.nonzero(slots == r)
    clients = bootstrap.resample_counts(3, b_idx.size, draws)
    queries = bootstrap.resample_counts(12, b_idx.size, draws)
    client = bootstrap.group_index(rep['target'])[0]
    query = bootstrap.group_index(rep['groups'])[0]
    for i, (b, j) in enumerate(zip(b_idx, j_idx)):
      w = clients[i][client] * queries[i][query]
      copies = np.repeat(np.arange(w.size), w)
      y, s = rep['labels'][copies], rep['scores'][copies]
      want_auc[b, j] = skm.roc_auc_score(y, s) if 0 < y.sum() < y.size else np.nan
      want_tpr[b, j] = metrics.tpr_at_fpr(s, y, 0.1) if 0 < y.sum() < y.size else np.nan
  np.testing.assert_allclose(auc, want_auc.mean(axis=1), atol=1e-12)
  np.testing.assert_allclose(tpr[0], want_tpr.mean(axis=1), atol=1e-12)


@pytest.mark.parametrize('ties', [False, True])
def test_low_fpr_threshold_below_the_tail_is_found(ties):
  # Low FPRs only, so the first pass reads only the top runs (`tail_runs`); zero weight on
  # the top 600 entries puts the threshold below them for some rows, which must be redone.
  rng = np.random.default_rng(11)
  rep = _rep(rng, num_clients=10, num_queries=400, ties=ties)
  s, y = rep['scores'], np.asarray(rep['labels'])
  checked = replicated._Replicate(rep, 0)
  assert checked.tail_runs(0.01) < np.unique(s).size
  w = rng.integers(0, 3, size=(6, s.size))
  top = np.argsort(-s)[:600]
  top_negatives = top[y[top] == 0]
  w[:3, top_negatives] = 0
  # Row 3 keeps 25 of them (about 0.75% of its non-member weight): its tail is wholly
  # admissible at 1% but not at 0.5%, so the redo must follow the largest FPR.
  w[3, top_negatives] = 0
  w[3, top_negatives[:25]] = 1
  low = [1e-3, 0.01, 0.005]
  got = replicated.weighted_tpr_at_fpr(s, y, low, w)
  for b in range(w.shape[0]):
    copies = np.repeat(np.arange(s.size), w[b])
    np.testing.assert_array_equal(got[:, b], metrics.tpr_at_fpr(s[copies], y[copies], low))


def test_one_entry_of_a_class_is_enough_and_none_is_nan():
  scores = np.array([0.1, 0.4, 0.35, 0.8, 0.2])
  labels = np.array([0, 1, 0, 1, 0])
  one_member = np.array([[1, 1, 1, 0, 1]])  # W_pos = 1
  one_nonmember = np.array([[0, 1, 1, 1, 0]])  # W_neg = 1
  for w in (one_member, one_nonmember):
    want = skm.roc_auc_score(labels, scores, sample_weight=w[0])
    assert replicated.weighted_auc(scores, labels, w)[0] == pytest.approx(want)
    copies = np.repeat(np.arange(5), w[0])
    assert replicated.weighted_tpr_at_fpr(scores, labels, 0.5, w)[0] == metrics.tpr_at_fpr(
        scores[copies], labels[copies], 0.5)
  for w in ([[0, 1, 0, 1, 0]], [[1, 0, 1, 0, 1]]):  # members only, non-members only
    assert np.isnan(replicated.weighted_auc(scores, labels, np.array(w))[0])
    assert np.isnan(replicated.weighted_tpr_at_fpr(scores, labels, 0.5, np.array(w))[0])


def test_metrics_estimator_intervals_and_counts():
  rng = np.random.default_rng(3)
  reps = [_rep(rng, num_clients=5, num_queries=80, shift=s) for s in (0.8, 1.0, 1.3)]
  out = replicated.metrics(reps, rng=np.random.default_rng(4), num_resamples=300,
                           fprs={'tpr_at_fpr_1e-2': 1e-2}, resample=True)
  aucs = [metrics.roc_auc(r['scores'], r['labels']) for r in reps]
  assert out['auc_replicates'] == pytest.approx(aucs)
  assert out['auc'] == pytest.approx(np.mean(aucs))
  assert out['interval_method'] == 't' and out['num_trainings'] == 3
  assert (out['auc_low'], out['auc_high']) == (out['auc_t_low'], out['auc_t_high'])
  assert (out['auc_t_low'], out['auc_t_high']) == pytest.approx(
      replicated.t_interval(aucs, 0.95)[1:])
  assert out['auc_boot_low'] < out['auc'] < out['auc_boot_high']
  assert out['num_targets'] == 15 and out['num_queries'] == 240
  assert out['num_entries'] == 1200 and out['num_members'] == 120
  assert out['num_resamples'] == 300
  name = 'tpr_at_fpr_1e-2'
  pooled_s = np.concatenate([r['scores'] for r in reps])
  pooled_y = np.concatenate([r['labels'] for r in reps])
  hits = round(metrics.tpr_at_fpr(pooled_s, pooled_y, 1e-2) * 120)
  assert out[f'{name}_members_above'] == hits
  assert (out[f'{name}_cp_low'], out[f'{name}_cp_high']) == stats.clopper_pearson(hits, 120)
  assert out[f'{name}_distinct_negatives'] == sum(
      bootstrap.distinct_negatives(r['scores'], r['labels'], r['groups'], 1e-2) for r in reps)
  # The union of the t-interval and Clopper-Pearson: it holds the reported mean (which the
  # pooled counts' interval alone need not) and is never narrower than either.
  assert out[f'{name}_low'] == min(out[f'{name}_t_low'], out[f'{name}_cp_low'])
  assert out[f'{name}_high'] == max(out[f'{name}_t_high'], out[f'{name}_cp_high'])
  assert out[f'{name}_low'] <= out[name] <= out[f'{name}_high']
  widened = (out[f'{name}_cp_low'] < out[f'{name}_t_low'] or
             out[f'{name}_cp_high'] > out[f'{name}_t_high'])
  assert out[f'{name}_interval'] == ('t+clopper_pearson' if widened else 't')


def test_one_training_has_no_t_interval_and_says_what_it_reports():
  rng = np.random.default_rng(5)
  out = replicated.metrics([_rep(rng, num_queries=60)], rng=rng, num_resamples=200)
  assert out['num_trainings'] == 1
  assert out['interval_method'] == 'two_way_bootstrap_conditional'
  assert np.isnan(out['auc_t_low']) and np.isnan(out['auc_t_high'])
  assert (out['auc_low'], out['auc_high']) == (out['auc_boot_low'], out['auc_boot_high'])
  for name in replicated.DEFAULT_FPRS:
    assert out[f'{name}_interval'] in ('two_way_bootstrap_conditional',
                                       'two_way_bootstrap_conditional+clopper_pearson')
    assert not np.isnan(out[f'{name}_low'])
  # Student's t at every R >= 2 (the bootstrap over-covered from R = 5 on in the simulation).
  for r in (2, 3, 30, 31, 1000):
    assert replicated.interval_method(r) == 't'
  with pytest.raises(ValueError, match='num_trainings must be positive'):
    replicated.interval_method(0)


def test_the_bootstrap_runs_by_default_only_where_it_is_reported():
  rng = np.random.default_rng(8)
  reps = [_rep(rng, num_queries=40) for _ in range(3)]
  out = replicated.metrics(reps, rng=rng, num_resamples=50)
  assert out['interval_method'] == 't' and out['num_resamples'] == 0
  assert np.isnan(out['auc_boot_low']) and not np.isnan(out['auc_low'])
  diff = replicated.compare(reps, reps, rng=rng, num_resamples=50)
  assert diff['num_resamples'] == 0 and np.isnan(diff['auc_diff_boot_low'])
  one = replicated.metrics(reps[:1], rng=rng, num_resamples=50)
  assert one['num_resamples'] == 50 and not np.isnan(one['auc_boot_low'])


def test_compare_is_paired_and_refuses_different_entries():
  rng = np.random.default_rng(6)
  reps = [_rep(rng) for _ in range(3)]
  same = replicated.compare(reps, reps, rng=rng, num_resamples=100, fpr=0.05, resample=True)
  for name in ('auc_diff', 'tpr_diff'):
    assert same[name] == same[f'{name}_low'] == same[f'{name}_high'] == 0.0
    assert same[f'{name}_boot_low'] == same[f'{name}_boot_high'] == 0.0
  # A against itself: a zero-width interval, which shows nothing either way.
  assert same['auc_verdict'].startswith('not estimable')
  better = [dict(r, scores=r['scores'] + 3.0 * np.asarray(r['labels'])) for r in reps]
  out = replicated.compare(better, reps, rng=rng, num_resamples=100, fpr=0.05)
  assert out['interval_method'] == 't' and out['auc_diff_low'] > 0
  assert out['auc_verdict'] == paired.verdict(out['auc_diff_low'], out['auc_diff_high'])
  assert out['auc_verdict'].startswith('A better')
  assert out['auc_diff_replicates'] == pytest.approx(
      [metrics.roc_auc(a['scores'], a['labels']) - metrics.roc_auc(b['scores'], b['labels'])
       for a, b in zip(better, reps)])
  for field in ('labels', 'target', 'groups'):
    other = [dict(r) for r in reps]
    other[1] = dict(other[1], **{field: np.roll(other[1][field], 1)})
    with pytest.raises(ValueError, match=f'replicate 1: A and B differ in {field}'):
      replicated.compare(reps, other, rng=rng, num_resamples=10)
  with pytest.raises(ValueError, match='replicates'):
    replicated.compare(reps, reps[:2], rng=rng, num_resamples=10)
  with pytest.raises(ValueError, match='lacks'):
    replicated.metrics([{'scores': reps[0]['scores']}], rng=rng, num_resamples=10)


def test_row_statistics_of_the_simulation_equal_the_metrics():
  design = coverage.Design(num_clients=4, num_queries=30)
  sim = coverage.simulate(design, 6, np.random.default_rng(8))
  assert (sim['labels'].sum(axis=1) == design.num_members).all()
  aucs = coverage.row_auc(sim['scores_a'], sim['labels'])
  tprs = coverage.row_tpr_at_fpr(sim['scores_a'], sim['labels'], 0.05)
  for r in range(6):
    assert aucs[r] == pytest.approx(metrics.roc_auc(sim['scores_a'][r], sim['labels'][r]))
    assert tprs[r] == metrics.tpr_at_fpr(sim['scores_a'][r], sim['labels'][r], 0.05)


def test_coverage_t_near_nominal_conditional_below_it_under_a_training_effect():
  # A strong training effect: the signal's sd over trainings is 0.8 around 1.0.
  design = dataclasses.replace(coverage.Design(num_clients=5, num_queries=20),
                               training_sd=0.8)
  rng = np.random.default_rng(9)
  truth = coverage.estimand(design, rng=rng, num_trainings=40000)
  n = 300
  result = coverage.coverage(design, 3, truth, rng=rng, num_experiments=n, num_resamples=100,
                             hierarchical=False, conditional=('conditional_pooled',))
  # Acceptance region of a two-sided binomial test at level 0.002 for a true coverage
  # anywhere in [0.93, 0.97] (the t-interval is exact only for normal replicate values).
  low, high = sps.binom.ppf(0.001, n, 0.93), sps.binom.ppf(0.999, n, 0.97)
  for quantity in ('auc_a', 'auc_diff'):
    t = result[(quantity, 't')]
    assert low <= t['covered'] <= high, (quantity, t)
    # The query-cluster bootstrap of the pooled entries misses the training effect: its
    # coverage is clearly below 95% (the 99.9% upper Clopper-Pearson bound under 0.9).
    pooled = result[(quantity, 'conditional_pooled')]
    assert stats.clopper_pearson_one_sided(pooled['covered'], n, 0.999) < 0.9, (quantity,
                                                                                  pooled)


def test_t_interval_edges():
  nan3 = replicated.t_interval([])
  assert all(isinstance(x, float) and np.isnan(x) for x in nan3)
  assert all(np.isnan(x) for x in replicated.t_interval([0.5, float('nan'), 0.7]))
  mean, low, high = replicated.t_interval([0.25])
  assert mean == 0.25 and np.isnan(low) and np.isnan(high)
  assert replicated.t_interval(np.array([[0.2, 0.4], [0.6, 0.8]]))[0] == pytest.approx(0.5)
  for bad in (0.0, 1.0, 1.5, -0.1):
    with pytest.raises(ValueError, match=r'confidence must be in \(0, 1\)'):
      replicated.t_interval([0.1, 0.2], confidence=bad)


def _separated(rng, direction=1.0, num_clients=8, num_queries=80):
  """A replicate whose members all score above (direction 1: AUC 1, TPR 1) or below
  (direction -1: AUC 0, TPR 0) every non-member."""
  rep = _rep(rng, num_clients=num_clients, num_queries=num_queries, shift=0.0)
  rep['scores'] = rng.uniform(size=rep['scores'].size) + direction * 10.0 * rep['labels']
  return rep


def test_checks_name_what_is_wrong():
  rng = np.random.default_rng(11)
  good = _rep(rng)
  for reps in ({'scores': good['scores']}, []):
    with pytest.raises(ValueError, match='^reps must be a non-empty list of per-replicate dicts$'):
      replicated.metrics(reps, rng=rng, num_resamples=10)
  with pytest.raises(ValueError, match=r"replicate 1 lacks \['groups'\]"):
    replicated.metrics([good, {k: v for k, v in good.items() if k != 'groups'}], rng=rng)
  with pytest.raises(ValueError, match='needs the same entries in the same order$'):
    replicated.compare([good], [dict(good, groups=good['groups'] + 3)], rng=rng)
  for call in (replicated.metrics, lambda r, **k: replicated.compare(r, r, **k)):
    call([good], rng=rng, num_resamples=1, resample=False)  # one resample is a valid B
    with pytest.raises(ValueError, match=r'num_resamples must be positive \(got 0\)'):
      call([good], rng=rng, num_resamples=0)
    for bad in (0.0, 1.0, 1.5):
      with pytest.raises(ValueError, match=r'confidence must be in \(0, 1\)'):
        call([good], rng=rng, confidence=bad)
  # Checked before any resampling (`t_interval` would only refuse it afterwards).
  for bad in (0.0, 1.0, 1.5):
    with pytest.raises(ValueError, match=rf'^confidence must be in \(0, 1\) \(got {bad}\)$'):
      replicated._check_resampling(10, bad)
  replicated._check_resampling(1, 0.5)


def test_percentile_interval_of_the_resamples():
  values = np.r_[np.arange(1001.0), np.nan]  # a NaN resample (one class missing) is dropped
  assert replicated._percentile(values, 0.9) == pytest.approx((50.0, 950.0))
  assert replicated._percentile(values, 0.5) == pytest.approx((250.0, 750.0))
  assert all(np.isnan(replicated._percentile(np.full(4, np.nan), 0.95)))


def test_union_with_clopper_pearson_and_its_label():
  union = replicated._with_clopper_pearson
  assert union('t', (np.nan, np.nan), (0.1, 0.3)) == (0.1, 0.3, 'clopper_pearson')
  assert union('t', (0.1, 0.3), (0.15, 0.25)) == (0.1, 0.3, 't')
  assert union('t', (0.1, 0.3), (0.1, 0.3)) == (0.1, 0.3, 't')  # equal limits widen nothing
  assert union('t', (0.1, 0.3), (0.05, 0.2)) == (0.05, 0.3, 't+clopper_pearson')
  assert union('t', (0.1, 0.3), (0.2, 0.4)) == (0.1, 0.4, 't+clopper_pearson')
  assert union('hierarchical_bootstrap', (0.1, 0.3), (0.0, 0.5)) == (
      0.0, 0.5, 'hierarchical_bootstrap+clopper_pearson')


def test_metrics_records_what_it_used_and_clips_to_the_range():
  rng = np.random.default_rng(12)
  reps = [_separated(rng), _separated(rng), _rep(rng, 8, 80, shift=0.5)]
  name = 'tpr_at_fpr_1e-2'
  out = replicated.metrics(reps, rng=np.random.default_rng(13), fprs={name: 1e-2},
                           confidence=0.9, resample=True)
  assert out['confidence'] == 0.9 and out['num_resamples'] == 1000  # the default B
  assert out['num_nonmembers'] == out['num_entries'] - out['num_members'] == 3 * 600
  tprs = [metrics.tpr_at_fpr(r['scores'], r['labels'], 1e-2) for r in reps]
  assert tprs[:2] == [1.0, 1.0] and tprs[2] < 0.5
  assert out[f'{name}_replicates'] == pytest.approx(tprs)
  aucs = out['auc_replicates']
  # Unclipped, both t-intervals leave [0, 1]; the recorded ones stop at its ends.
  assert replicated.t_interval(aucs, 0.9)[2] > 1.0
  lo, hi = replicated.t_interval(tprs, 0.9)[1:]
  assert lo < 0.0 and hi > 1.0
  assert out['auc_t_high'] == 1.0 and out['auc_t_low'] == replicated.t_interval(aucs, 0.9)[1]
  assert (out[f'{name}_t_low'], out[f'{name}_t_high']) == (0.0, 1.0)
  hits = out[f'{name}_members_above']
  assert (out[f'{name}_cp_low'], out[f'{name}_cp_high']) == stats.clopper_pearson(hits, 120, 0.9)
  assert stats.clopper_pearson(hits, 120, 0.9) != stats.clopper_pearson(hits, 120)
  assert out[f'{name}_boot_low'] < out[f'{name}_boot_high']
  assert out['auc_boot_low'] < out['auc_boot_high']


def test_compare_records_what_it_used_and_clips_to_the_range():
  rng = np.random.default_rng(14)
  best = [_separated(rng), _separated(rng), _rep(rng, 8, 80, shift=0.3)]
  worst = [dict(r, scores=-r['scores']) for r in best[:2]] + [_separated(rng, -1.0)]
  worst[2] = dict(best[2], scores=_separated(np.random.default_rng(15), -1.0)['scores'])
  out = replicated.compare(best, worst, rng=np.random.default_rng(16), fpr=0.05,
                           confidence=0.9, resample=True)
  assert (out['num_trainings'], out['confidence'], out['fpr']) == (3, 0.9, 0.05)
  assert out['num_resamples'] == 1000
  diffs = out['auc_diff_replicates']
  assert replicated.t_interval(diffs, 0.9)[2] > 1.0 and out['auc_diff_t_high'] == 1.0
  assert out['auc_diff_t_low'] == replicated.t_interval(diffs, 0.9)[1] < out['auc_diff_t_high']
  back = replicated.compare(worst, best, rng=np.random.default_rng(16), fpr=0.05,
                            confidence=0.9, resample=True)
  assert replicated.t_interval(back['auc_diff_replicates'], 0.9)[1] < -1.0
  assert back['auc_diff_t_low'] == -1.0
  assert back['auc_diff_boot_low'] < back['auc_diff_boot_high']
  assert out['tpr_diff_boot_low'] < out['tpr_diff_boot_high']


def test_resamples_missing_a_class_are_counted_out():
  # Two target clients, the second owning nothing: a client resample drawing it twice holds
  # no member (probability 1/4), so about 3/4 of the B resamples count.
  rng = np.random.default_rng(17)
  rep = _rep(rng, num_clients=2, num_queries=20)
  rep['labels'] = ((rep['target'] == 10) & (rep['groups'] // 3 < 10)).astype(int)
  num = 400
  one = replicated.metrics([rep], rng=np.random.default_rng(18), num_resamples=num)
  low, high = sps.binom.ppf([0.001, 0.999], num, 0.75)
  assert low <= one['num_resamples'] <= high
  diff = replicated.compare([rep], [dict(rep, scores=-rep['scores'])],
                            rng=np.random.default_rng(18), num_resamples=num)
  assert low <= diff['num_resamples'] <= high
  # One training reports its conditional bootstrap, not the (NaN) t-interval.
  assert diff['interval_method'] == 'two_way_bootstrap_conditional'
  assert (diff['auc_diff_low'], diff['auc_diff_high']) == (diff['auc_diff_boot_low'],
                                                           diff['auc_diff_boot_high'])
  assert not np.isnan(diff['auc_diff_low'])


def test_a_malformed_replicate_is_named_with_what_is_wrong():
  rng = np.random.default_rng(21)
  good = _rep(rng, num_clients=2, num_queries=6)
  n = good['scores'].size
  cases = [
      (dict(good, labels=good['labels'] * 2), r'^replicate 1: labels must be 0/1 or bool$'),
      (dict(good, groups=good['groups'][:-1]),
       rf'^replicate 1: scores, labels, target and groups differ in length \({n}, {n}, {n}, '
       rf'{n - 1}\)$'),
      (dict(good, scores=np.r_[np.nan, good['scores'][1:]]),
       r'^replicate 1: scores contain NaN$'),
      (dict(good, labels=np.ones(n, int)), r'^replicate 1 needs both members and non-members$'),
      (dict(good, labels=np.zeros(n, int)), r'^replicate 1 needs both members and non-members$'),
  ]
  for bad, message in cases:
    with pytest.raises(ValueError, match=message):
      replicated.metrics([good, bad], rng=rng, num_resamples=5)
  # Bool labels are taken as they are; arrays of any shape are read flat.
  flat = replicated.metrics([good], rng=np.random.default_rng(1), num_resamples=20)
  folded = replicated.metrics([{k: np.asarray(v).reshape(2, -1) for k, v in
                                dict(good, labels=good['labels'].astype(bool)).items()}],
                              rng=np.random.default_rng(1), num_resamples=20)
  assert folded['auc'] == flat['auc'] and folded['auc_boot_low'] == flat['auc_boot_low']
  assert folded['num_entries'] == n


def test_weighted_statistics_shapes_chunks_and_checks(monkeypatch):
  rng = np.random.default_rng(22)
  scores, labels = rng.normal(size=7), np.array([1, 0, 1, 0, 0, 1, 0])
  w1 = rng.integers(0, 3, size=7)
  w1[:2] = 1  # a member and a non-member weigh something
  rows = rng.integers(0, 3, size=(40, 7))  # more resamples than entries
  rows[:, :2] = 1
  auc = replicated.weighted_auc(scores, labels, w1)
  assert isinstance(auc, float)
  assert auc == pytest.approx(skm.roc_auc_score(labels, scores, sample_weight=w1))
  tpr = replicated.weighted_tpr_at_fpr(scores, labels, 0.5, w1)
  assert np.ndim(tpr) == 0
  assert replicated.weighted_tpr_at_fpr(scores, labels, [0.25, 0.5], w1).shape == (2,)
  assert replicated.weighted_tpr_at_fpr(scores, labels, 0.5, rows).shape == (40,)
  assert replicated.weighted_tpr_at_fpr(scores, labels, [0.25, 0.5], rows).shape == (2, 40)
  want_auc = replicated.weighted_auc(scores, labels, rows)
  want_tpr = replicated.weighted_tpr_at_fpr(scores, labels, [0.25, 0.5], rows)
  assert want_auc == pytest.approx([skm.roc_auc_score(labels, scores, sample_weight=r)
                                    for r in rows])
  # Resamples weighed a few rows at a time give the same numbers (3 rows a chunk, 14 chunks).
  monkeypatch.setattr(replicated, 'CHUNK_ELEMENTS', 21)
  np.testing.assert_array_equal(replicated.weighted_auc(scores, labels, rows), want_auc)
  np.testing.assert_array_equal(replicated.weighted_tpr_at_fpr(scores, labels, [0.25, 0.5],
                                                               rows), want_tpr)
  assert replicated.weighted_auc(scores.reshape(1, 7), labels, w1) == auc
  for bad in (np.ones((2, 2, 7)), np.ones(6), np.ones((3, 6))):
    with pytest.raises(ValueError, match=r'^weights must be \[N\] or \[B, N\] with N = 7 '):
      replicated.weighted_auc(scores, labels, bad)
  with pytest.raises(ValueError, match='^weights must be non-negative$'):
    replicated.weighted_auc(scores, labels, -w1)
  with pytest.raises(ValueError, match='^replicate 0: scores contain NaN$'):
    replicated.weighted_auc(np.r_[np.nan, scores[1:]], labels, w1)


def test_replicates_that_agree_give_a_zero_width_interval_no_test_and_no_verdict():
  # 0.1 three times sums to 0.30000000000000004: its sd is rounding (~1e-17), not spread.
  for values in ([0.1] * 3, [-0.07] * 3, [2 / 320 - 5 / 320] * 5, [0.1, 0.1 + 1e-15, 0.1]):
    mean, low, high = replicated.t_interval(values, bounds=(-1.0, 1.0))
    assert low == mean == high
    assert all(np.isnan(x) for x in replicated.t_test(values))
    assert paired.verdict(low, high) == paired.NOT_ESTIMABLE
    assert replicated.all_equal(values)
  # One count apart at 320 members is spread, not rounding.
  assert not replicated.all_equal([0.1, 0.1 + 1 / 320, 0.1])
  assert replicated.t_interval([0.1, 0.1 + 1 / 320, 0.1])[1] < 0.1
  assert replicated.all_equal([1e6, 1e6 + 1e-6]) and not replicated.all_equal([0.0, 1e-10])


def test_compare_of_replicates_whose_differences_agree_prints_no_verdict():
  rng = np.random.default_rng(21)
  reps = [_rep(rng, num_clients=4, num_queries=40) for _ in range(3)]
  # B ranks exactly like A except one fixed member pushed to the bottom in every replicate:
  # the TPR difference at a loose FPR is the same count in every training.
  worse = []
  for r in reps:
    s = np.array(r['scores'], float)
    s[np.flatnonzero(r['labels'])[0]] = s.min() - 1.0
    worse.append(dict(r, scores=s))
  out = replicated.compare(reps, worse, rng=rng, num_resamples=20, fpr=1.0)
  diffs = out['tpr_diff_replicates']
  assert replicated.all_equal(diffs) and diffs[0] == 0.0
  assert out['tpr_verdict'] == paired.NOT_ESTIMABLE
  assert np.isnan(out['tpr_diff_p']) and np.isnan(out['tpr_diff_t_stat'])
  assert not replicated.all_equal(out['auc_diff_replicates'])
  t, p = sps.ttest_1samp(out['auc_diff_replicates'], 0.0)
  assert (out['auc_diff_t_stat'], out['auc_diff_p']) == pytest.approx((t, p), rel=1e-12)


def test_t_test_is_the_test_the_t_interval_inverts():
  rng = np.random.default_rng(22)
  for _ in range(40):
    r = int(rng.integers(2, 8))
    values = rng.normal(rng.normal(0.0, 0.05), 0.05, size=r)
    t, p = replicated.t_test(values)
    sem = np.std(values, ddof=1) / np.sqrt(r)
    assert t == pytest.approx(np.mean(values) / sem, rel=1e-10)
    assert p == pytest.approx(2 * sps.t.sf(abs(t), r - 1), rel=1e-10)
    _, low, high = replicated.t_interval(values)
    if abs(p - 0.05) > 1e-6:  # away from the boundary: the interval excludes 0 iff p < 0.05
      assert (p < 0.05) == (low > 0 or high < 0)
  assert all(np.isnan(x) for x in replicated.t_test([0.3]))
  assert all(np.isnan(x) for x in replicated.t_test([0.3, float('nan')]))


def test_holm_family_adjusts_every_claim_together():
  # m = 4 tests (2 rows x AUC, TPR). Sorted p: 0.005, 0.01, 0.03, 0.04 -> 4 x 0.005 = 0.02,
  # 3 x 0.01 = 0.03, max(0.03, 2 x 0.03) = 0.06, max(0.06, 0.04) = 0.06 (Holm 1979).
  rows = [dict(auc_diff=0.1, auc_diff_p=0.01, tpr_diff=-0.02, tpr_diff_p=0.04, x=1),
          dict(auc_diff=-0.2, auc_diff_p=0.03, tpr_diff=0.05, tpr_diff_p=0.005, x=2)]
  out = replicated.holm_family(rows)
  assert [r['x'] for r in out] == [1, 2] and 'auc_p_holm' not in rows[0]
  assert [r['family_size'] for r in out] == [4, 4]
  got = [out[0]['auc_p_holm'], out[0]['tpr_p_holm'], out[1]['auc_p_holm'], out[1]['tpr_p_holm']]
  assert got == pytest.approx([0.03, 0.06, 0.06, 0.02])
  assert out[0]['auc_verdict_holm'].startswith('A better')
  assert out[0]['tpr_verdict_holm'].startswith('no difference shown')
  assert out[1]['auc_verdict_holm'].startswith('no difference shown')
  assert out[1]['tpr_verdict_holm'].startswith('A better')
  # A claim with no test counts in the family and is not estimable.
  rows[1]['tpr_diff_p'] = float('nan')
  out = replicated.holm_family(rows)
  assert out[1]['tpr_verdict_holm'].startswith('not estimable')
  assert np.isnan(out[1]['tpr_p_holm'])
  assert out[0]['auc_p_holm'] == pytest.approx(0.04)  # 4 x 0.01: m is still 4
  bad = dict(auc_diff=-0.2, auc_diff_p=0.001, tpr_diff=0.0, tpr_diff_p=0.9)
  assert replicated.holm_family([bad])[0]['auc_verdict_holm'].startswith('B better')


def test_variance_ratio_pools_chi_square_by_hand():
  # Two points: s^2 / w = 0.5 (df 2) and 2.0 (df 4): (2 x 0.5 + 4 x 2) / 6 = 1.5.
  out = coverage.variance_ratio([0.5, 8.0], [1.0, 4.0], [2, 4])
  assert out['ratio'] == pytest.approx(1.5) and (out['df'], out['points']) == (6.0, 2)
  assert out['low'] == pytest.approx(9.0 / sps.chi2.ppf(0.975, 6))
  assert out['high'] == pytest.approx(9.0 / sps.chi2.ppf(0.025, 6))
  assert out['low'] < 1.5 < out['high']
  # Replicates drawn with a known ratio: the 95% interval holds it in most of 200 draws.
  rng = np.random.default_rng(23)
  held = 0
  for _ in range(200):
    w = rng.uniform(0.5, 2.0, size=8)
    s2 = [np.var(rng.normal(0, np.sqrt(2.0 * wi), size=3), ddof=1) for wi in w]
    o = coverage.variance_ratio(s2, w, [2] * 8)
    held += o['low'] <= 2.0 <= o['high']
  assert sps.binom.cdf(held, 200, 0.95) > 0.001  # not fewer than a 95% interval would hold
  for bad in (([1.0], [0.0], [2]), ([1.0], [1.0], [0]), ([1.0, 2.0], [1.0], [2]),
              ([-1.0], [1.0], [2])):
    with pytest.raises(ValueError):
      coverage.variance_ratio(*bad)


def test_simulated_ratio_is_near_one_without_and_grows_with_a_training_effect():
  design = coverage.Design(num_clients=4, num_queries=30)
  rng = np.random.default_rng(24)
  kw = dict(num_trainings=1500, num_within=40, num_resamples=150)
  none = coverage.simulated_ratio(dataclasses.replace(design, training_sd=0.0), rng=rng, **kw)
  strong = coverage.simulated_ratio(dataclasses.replace(design, training_sd=0.8), rng=rng, **kw)
  assert 0.6 < none['auc_a'] < 1.5 and 0.6 < none['auc_diff'] < 1.5
  assert strong['auc_a'] > 2.5 * none['auc_a'] and strong['auc_diff'] > 2.5 * none['auc_diff']
  sd, ratios = coverage.fit_training_sd(design, strong['auc_a'], (0.0, 0.8), rng=rng,
                                        quantity='auc_a', **kw)
  assert sd == 0.8 and set(ratios) == {0.0, 0.8}
  assert coverage.fit_training_sd(design, 0.3, (0.0, 0.8), rng=rng, quantity='auc_a',
                                  **kw)[0] == 0.0


def test_the_paired_tpr_difference_is_simulated_and_intervalled():
  design = coverage.Design(num_clients=4, num_queries=60, training_sd=0.0)
  rng = np.random.default_rng(25)
  out = coverage.experiment(design, 3, rng=rng, num_resamples=30, fpr=0.05, auc=False,
                            tpr_diff=True, resample=False, conditional=('conditional_one',))
  assert set(out) == {'tpr_a', 'tpr_diff'}
  assert set(out['tpr_diff']) == {'conditional_one', 't', 'reported'}
  assert set(out['tpr_a']) == {'conditional_one', 't', 'reported', 'clopper_pearson'}
  # The t-interval of tpr_diff is replicated.compare's on the same draws (its own check).
  assert out['tpr_diff']['t'] == out['tpr_diff']['reported']
  truth = coverage.estimand(design, rng=rng, num_trainings=500, fpr=0.05)
  assert {'tpr_a', 'tpr_diff', 'tpr_a_se', 'tpr_diff_se'} <= set(truth)
  res = coverage.coverage(design, 3, truth, rng=rng, num_experiments=4, num_resamples=20,
                          fpr=0.05, auc=False, tpr_diff=True, hierarchical=False)
  assert res[('tpr_diff', 't')]['num_experiments'] == 4
  assert 0 <= res[('tpr_diff', 't')]['not_estimable'] <= 4
  with pytest.raises(ValueError, match='tpr_diff needs an fpr'):
    coverage.experiment(design, 3, rng=rng, tpr_diff=True)


def test_zero_width_intervals_are_counted_as_not_estimable(monkeypatch):
  design = coverage.Design(num_clients=4, num_queries=20)
  calls = iter(range(1000))

  def fake(*args, **kwargs):
    del args, kwargs
    i = next(calls)
    return {'auc_a': {'t': (0.5, 0.5) if i % 2 else (0.0, 1.0)}}

  monkeypatch.setattr(coverage, 'experiment', fake)
  res = coverage.coverage(design, 3, {'auc_a': 0.7}, rng=np.random.default_rng(0),
                          num_experiments=6)
  assert res[('auc_a', 't')]['not_estimable'] == 3 and res[('auc_a', 't')]['covered'] == 3


def test_all_equal_edges():
  # From mutation survivors: one value agrees with itself, no values do not, the tolerance
  # is relative to max(1, |value|) and inclusive (a spread of exactly EQUAL_TOL: 0 and 1e-11
  # are exact doubles and their difference is exact).
  assert replicated.all_equal([0.3]) and not replicated.all_equal([])
  assert replicated.all_equal([0.0, replicated.EQUAL_TOL])
  assert not replicated.all_equal([0.0, 1.5 * replicated.EQUAL_TOL])
  assert replicated.all_equal([3.0, 3.0 + 2.5 * replicated.EQUAL_TOL])


def test_holm_family_reads_a_missing_p_as_no_test_and_its_alpha():
  # From mutation survivors. m = 4; sorted p 0.001, 0.004, 0.02, (missing): x 4, 3, 2 = 0.004,
  # 0.012, 0.04.
  rows = [dict(auc_diff=0.1, auc_diff_p=0.02, tpr_diff=0.05),  # a row written before p
          dict(auc_diff=0.1, auc_diff_p=0.001, tpr_diff=0.05, tpr_diff_p=0.004)]
  out = replicated.holm_family(rows)
  assert np.isnan(out[0]['tpr_p_holm']) and out[0]['tpr_verdict_holm'].startswith('not estim')
  assert [out[1]['auc_p_holm'], out[1]['tpr_p_holm'], out[0]['auc_p_holm']] == pytest.approx(
      [0.004, 0.012, 0.04])
  assert all(out[i][f'{q}_verdict_holm'].startswith('A better')
             for i, q in ((1, 'auc'), (1, 'tpr'), (0, 'auc')))
  strict = replicated.holm_family(rows, alpha=0.01)
  assert strict[1]['auc_verdict_holm'].startswith('A better')
  assert strict[1]['tpr_verdict_holm'].startswith('no difference')
  assert strict[0]['auc_verdict_holm'].startswith('no difference')


def test_simulated_ratio_equals_a_direct_computation_with_sklearn():
  # From mutation survivors (the TPR branch, the variances' ddof): the same draws, the
  # trainings' statistics by eval.metrics and the resamples' by sklearn's weighted AUC and
  # metrics.tpr_at_fpr of the repeated entries.
  design = coverage.Design(num_clients=3, num_queries=40, training_sd=0.3)
  kw = dict(fpr=0.1, num_trainings=6, num_within=3, num_resamples=8)
  out = coverage.simulated_ratio(design, rng=np.random.default_rng(26), **kw)
  rng = np.random.default_rng(26)
  sim = coverage.simulate(design, 6, rng)
  y, g = sim['labels'], sim['groups']

  def stats_of(r, w=None):
    a, b = sim['scores_a'][r], sim['scores_b'][r]
    if w is None:
      ta, tb = (float(metrics.tpr_at_fpr(s, y[r], 0.1)) for s in (a, b))
      return metrics.roc_auc(a, y[r]), metrics.roc_auc(b, y[r]), ta, tb
    aa, ab = (skm.roc_auc_score(y[r], s, sample_weight=w) for s in (a, b))
    ta, tb = (float(metrics.tpr_at_fpr(np.repeat(s, w), np.repeat(y[r], w), 0.1))
              for s in (a, b))
    return aa, ab, ta, tb

  total = np.array([stats_of(r) for r in range(6)])
  within = []
  for r in range(3):
    counts = bootstrap.resample_counts(design.num_queries, 8, rng)
    per = np.array([stats_of(r, c[g]) for c in counts])
    within.append([np.var(per[:, 0], ddof=1), np.var(per[:, 0] - per[:, 1], ddof=1),
                   np.var(per[:, 2], ddof=1), np.var(per[:, 2] - per[:, 3], ddof=1)])
  within = np.mean(within, axis=0)
  want = [np.var(total[:, 0], ddof=1) / within[0],
          np.var(total[:, 0] - total[:, 1], ddof=1) / within[1],
          np.var(total[:, 2], ddof=1) / within[2],
          np.var(total[:, 2] - total[:, 3], ddof=1) / within[3]]
  got = [out[k] for k in ('auc_a', 'auc_diff', 'tpr_a', 'tpr_diff')]
  np.testing.assert_allclose(got, want, rtol=1e-9)


def test_fit_training_sd_passes_its_options_and_sets_each_sd():
  design = coverage.Design(num_clients=3, num_queries=30, training_sd=0.0)
  kw = dict(num_trainings=40, num_within=4, num_resamples=10)
  sd, ratios = coverage.fit_training_sd(design, 0.0, (0.8,), rng=np.random.default_rng(27),
                                        fpr=0.1, quantity='tpr_diff', **kw)
  want = coverage.simulated_ratio(dataclasses.replace(design, training_sd=0.8),
                                  rng=np.random.default_rng(27), fpr=0.1, **kw)
  assert sd == 0.8 and ratios == {0.8: pytest.approx(want['tpr_diff'], rel=1e-12)}
  # The default quantity is the AUC difference.
  _, ratios = coverage.fit_training_sd(design, 0.0, (0.8,), rng=np.random.default_rng(27),
                                       **kw)
  assert ratios[0.8] == pytest.approx(want['auc_diff'], rel=1e-12)


def test_variance_ratio_edges():
  # From mutation survivors: one point, R = 2 (df 1) and replicates that agree (s^2 = 0) are
  # valid; no points, a confidence of 0 or 1 are not, each with its message.
  assert coverage.variance_ratio([0.0], [1.0], [1])['ratio'] == 0.0
  with pytest.raises(ValueError, match=r'one equal, non-zero length \(got 0, 0, 0\)'):
    coverage.variance_ratio([], [], [])
  with pytest.raises(ValueError, match='^within_var and df must be positive, replicate_var '
                     'non-negative$'):
    coverage.variance_ratio([1.0], [1.0], [0])
  for bad in (0.0, 1.0):
    with pytest.raises(ValueError, match=r'confidence must be in \(0, 1\)'):
      coverage.variance_ratio([1.0], [1.0], [2], confidence=bad)
