"""Fast rule checks of `fl_privacy.eval.auditing` (small score sets, no Monte Carlo).

- validation limits at their ends, with the error message matched;
- the `'split'` strategy (its fraction and seed) reaches every bound that uses it,
  compared with jax-privacy's auditor called directly;
- `privacy_profile` against an independent brute force: every threshold, both DP
  inequalities (TPR - e^eps FPR and TNR - e^eps FNR), Clopper-Pearson upper bounds from
  `scipy.stats.beta`, Bonferroni over the 2 (n + 1) rates of the fixed family
  (n = n_in + n_out, whatever the ties);
- `'bonferroni'` divides by n + 1, not by the size of the ROC frontier;
- `attack_bounds` is `audit_scores` on members vs non-members.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from fl_privacy.eval import auditing


def _scores(seed, n_in=120, n_out=140, shift=1.5, decimals=None):
  rng = np.random.default_rng(seed)
  a, b = rng.normal(shift, 1, n_in), rng.normal(0, 1, n_out)
  if decimals is not None:  # ties within and across the two sides
    a, b = np.round(a, decimals), np.round(b, decimals)
  return a, b


# --- Validation limits ---------------------------------------------------------------


@pytest.mark.parametrize('delta', [0.0, 1.0, -1e-5, 1.5])
def test_delta_outside_open_interval_raises(delta):
  with pytest.raises(ValueError, match=r'delta must be in \(0, 1\)'):
    auditing.audit_scores([1.0, 2.0], [0.0, 1.0], delta=delta)


@pytest.mark.parametrize('confidence', [0.5, 1.0, 0.2, 1.2])
def test_confidence_outside_open_interval_raises(confidence):
  with pytest.raises(ValueError, match=r'confidence must be in \(0\.5, 1\)'):
    auditing.audit_scores([1.0, 2.0], [0.0, 1.0], delta=1e-5,
                          confidence=confidence)


@pytest.mark.parametrize('fraction', [0.0, 1.0, -0.1, 1.1])
def test_split_fraction_outside_open_interval_raises(fraction):
  with pytest.raises(ValueError, match=r'split_fraction must be in \(0, 1\)'):
    auditing.audit_scores([1.0, 2.0], [0.0, 1.0], delta=1e-5,
                          threshold_strategy='split', split_fraction=fraction)


def test_split_fraction_is_ignored_by_bonferroni():
  a, b = _scores(0, 30, 30)
  plain = auditing.audit_scores(a, b, delta=1e-5, fdp=False, threshold_strategy='bonferroni')
  odd = auditing.audit_scores(a, b, delta=1e-5, fdp=False, split_fraction=1.0,
                              threshold_strategy='bonferroni')
  assert odd['epsilon_cp'] == plain['epsilon_cp']


def test_bad_strategy_and_bootstrap_messages():
  with pytest.raises(ValueError, match=r"threshold_strategy must be one of .*'holm'"):
    auditing.audit_scores([1.0], [0.0], delta=1e-5, threshold_strategy='holm')
  with pytest.raises(ValueError, match=r'bootstrap must be >= 0 \(got -1\)'):
    auditing.audit_scores([1.0], [0.0], delta=1e-5, bootstrap=-1)


@pytest.mark.parametrize('delta,confidence', [(1e-12, 0.5000001), (0.5, 0.999999),
                                              (0.999, 0.6)])
def test_values_just_inside_the_limits_are_accepted(delta, confidence):
  a, b = _scores(1, 20, 20)
  result = auditing.audit_scores(a, b, delta=delta, confidence=confidence, fdp=False)
  assert result['audit_delta'] == delta
  assert result['audit_confidence'] == confidence
  assert result['epsilon_cp'] >= 0


@pytest.mark.parametrize('fraction', [0.2, 0.8])
def test_split_fraction_just_inside_is_accepted(fraction):
  a, b = _scores(2, 40, 40)
  result = auditing.audit_scores(a, b, delta=1e-5, threshold_strategy='split',
                                 split_fraction=fraction, fdp=False)
  assert result['audit_threshold_strategy'] == 'split'


@pytest.mark.parametrize('name', ['in_scores', 'out_scores'])
@pytest.mark.parametrize('bad,message', [
    ([[1.0, 2.0]], r'must be 1-dimensional \(got shape \(1, 2\)\)'),
    ([], r'needs at least 1 score \(got 0\)'),
    ([1.0, np.nan], r'must be finite \(got NaN or inf\)'),
    ([-np.inf], r'must be finite'),
])
def test_bad_scores_name_the_argument(name, bad, message):
  args = {'in_scores': [1.0, 2.0], 'out_scores': [0.0, 1.0]}
  args[name] = bad
  with pytest.raises(ValueError, match=f'^{name} {message}'):
    auditing.audit_scores(args['in_scores'], args['out_scores'], delta=1e-5)
  with pytest.raises(ValueError, match=f'^{name} {message}'):
    auditing.privacy_profile(args['in_scores'], args['out_scores'], [1.0])


def test_one_score_per_side_is_enough_for_bonferroni_two_for_split():
  result = auditing.audit_scores([1.0], [0.0], delta=1e-5, fdp=False,
                                 threshold_strategy='bonferroni')
  assert (result['n_in'], result['n_out']) == (1, 1)
  assert auditing.privacy_profile([1.0], [0.0], 0.0) >= 0
  with pytest.raises(ValueError, match=r"'split' .* needs scores of each side in both "
                     r'parts \(got 1 IN, 2 OUT\)'):
    auditing.audit_scores([1.0], [0.0, 1.0], delta=1e-5, fdp=False)
  two = auditing.audit_scores([1.0, 2.0], [0.0, 1.0], delta=1e-5, fdp=False)
  assert two['audit_threshold_strategy'] == 'split'
  assert auditing.split_possible(2, 2) and not auditing.split_possible(2, 1)
  assert not auditing.split_possible(10, 10, 0.05)  # int(10 x 0.05) = 0 chooses nothing


@pytest.mark.parametrize('confidence', [0.0, 1.0, -0.5, 1.5])
def test_profile_confidence_limits(confidence):
  with pytest.raises(ValueError, match=r'confidence must be in \(0, 1\)'):
    auditing.privacy_profile([1.0], [0.0], [1.0], confidence=confidence)


@pytest.mark.parametrize('epsilons', [[-1e-9], [np.nan], [np.inf], [0.0, -np.inf]])
def test_profile_epsilon_limits(epsilons):
  with pytest.raises(ValueError, match=r'^epsilons must be finite and >= 0$'):
    auditing.privacy_profile([1.0], [0.0], epsilons)


# --- The 'split' strategy reaches every bound ----------------------------------------


def test_split_strategy_reaches_every_bound_with_its_fraction_and_seed():
  from jax_privacy import auditing as library  # pylint: disable=g-import-not-at-top
  a, b = _scores(3, 150, 150, shift=2.0)
  significance, delta = 0.1, 1e-4
  result = auditing.audit_scores(a, b, delta=delta, confidence=1 - significance,
                                 threshold_strategy='split', split_fraction=0.3,
                                 seed=11)
  auditor = library.CanaryScoreAuditor(a, b)

  def direct(fraction, seed):
    split = library.Split(threshold_estimation_frac=fraction, seed=seed)
    return (auditor.epsilon_clopper_pearson(significance, delta, threshold_strategy=split),
            auditor.epsilon_one_run(significance, delta, threshold_strategy=split),
            auditor.epsilon_one_run_fdp(significance, delta, threshold_strategy=split))

  bonf = library.Bonferroni()
  others = [direct(0.5, 11), direct(0.3, 12),
            (auditor.epsilon_clopper_pearson(significance, delta, threshold_strategy=bonf),
             auditor.epsilon_one_run(significance, delta, threshold_strategy=bonf),
             auditor.epsilon_one_run_fdp(significance, delta, threshold_strategy=bonf))]
  keys = ('epsilon_cp', 'epsilon_one_run', 'epsilon_one_run_fdp')
  for key, want in zip(keys, direct(0.3, 11)):
    assert result[key] == pytest.approx(want, rel=1e-9), key
    assert want > 0, key
    # The check has teeth: every other strategy (another fraction, another seed,
    # Bonferroni) gives a different number for this key.
    for other in others:
      assert other[keys.index(key)] != pytest.approx(want, rel=1e-6), key
  assert result['audit_threshold_strategy'] == 'split'
  # gdp_mu has its own Bonferroni correction: the strategy does not apply.
  plain = auditing.audit_scores(a, b, delta=delta, confidence=1 - significance, fdp=False)
  assert result['gdp_mu'] == plain['gdp_mu'] > 0
  assert result['epsilon_gdp'] == plain['epsilon_gdp'] > 0


def test_bonferroni_is_the_library_search_at_significance_over_n_plus_one():
  from jax_privacy import auditing as library  # pylint: disable=g-import-not-at-top
  a, b = _scores(4, 100, 130, shift=2.0)
  result = auditing.audit_scores(a, b, delta=1e-3, confidence=0.8,
                                 threshold_strategy='bonferroni')
  auditor = library.CanaryScoreAuditor(a, b)
  family = 100 + 130 + 1
  frontier = len(auditor._fn_counts)  # pylint: disable=protected-access
  assert 2 < frontier < family  # the data's frontier is far smaller than the family
  assert result['audit_threshold_family'] == family
  # Every threshold at 0.2 / (n + 1): the library's all-threshold search at that level.
  each = 0.2 / family
  cp, _ = auditor._epsilon_clopper_pearson_all_thresholds(  # pylint: disable=protected-access
      each, 1e-3, True)
  one_run, _ = auditor._epsilon_one_run_all_thresholds(  # pylint: disable=protected-access
      each, 1e-3, True)
  fdp, _ = auditor._epsilon_one_run_all_thresholds(  # pylint: disable=protected-access
      each, 1e-3, True, use_fdp=True)
  assert result['epsilon_cp'] == pytest.approx(cp, rel=1e-9)
  assert result['epsilon_one_run'] == pytest.approx(one_run, rel=1e-6)
  assert result['epsilon_one_run_fdp'] == pytest.approx(fdp, rel=1e-6)
  assert result['epsilon_one_run_fdp'] > 0
  # The library's own Bonferroni divides by the frontier (a family the data chose):
  # larger, invalid values. The fixed family must give strictly less.
  bonf = library.Bonferroni()
  assert result['epsilon_cp'] < auditor.epsilon_clopper_pearson(
      0.2, 1e-3, threshold_strategy=bonf) - 1e-3
  assert result['epsilon_one_run'] < auditor.epsilon_one_run(
      0.2, 1e-3, threshold_strategy=bonf) - 1e-3
  assert result['gdp_mu'] == pytest.approx(
      auditing.gdp_mu_lower_bound(auditor, 0.2, 1e-3), rel=1e-12)
  assert result['epsilon_gdp'] == pytest.approx(
      auditing.gdp_epsilon(result['gdp_mu'], 1e-3), rel=1e-12)


# --- privacy_profile against a brute force --------------------------------------------


def _cp_upper(k, n, level):
  """One-sided Clopper-Pearson upper bound on a rate at `level` (scipy's beta)."""
  return 1.0 if k == n else float(sps.beta.ppf(level, k + 1, n - k))


def _brute_profile(in_scores, out_scores, epsilon, confidence):
  thresholds = sorted(set(in_scores) | set(out_scores)) + [math.inf]
  # Bonferroni over 2 rates at each of the n + 1 thresholds of the fixed family (as many
  # as there can be; with ties the data show fewer).
  level = 1 - (1 - confidence) / (2 * (len(in_scores) + len(out_scores) + 1))
  best = 0.0
  for t in thresholds:
    # "IN iff score >= t".
    fn = sum(s < t for s in in_scores)
    fp = sum(s >= t for s in out_scores)
    fnr = _cp_upper(fn, len(in_scores), level)
    fpr = _cp_upper(fp, len(out_scores), level)
    tpr_lb, tnr_lb = 1 - fnr, 1 - fpr
    best = max(best,
               tpr_lb - math.exp(epsilon) * fpr,   # IN guessed on score >= t
               tnr_lb - math.exp(epsilon) * fnr)   # OUT guessed on score < t
  return best


@pytest.mark.parametrize('seed,n_in,n_out,shift,decimals,confidence', [
    (5, 30, 25, 4.0, None, 0.95),  # the TNR - e^eps FNR rule wins at eps > 0
    (6, 15, 15, 4.0, 0, 0.7),      # ties: the family is still n + 1, not the distinct scores
    (7, 8, 20, 3.0, 1, 0.5),       # the TPR - e^eps FPR rule wins at eps > 0
    (8, 25, 6, 5.0, None, 0.3),
])
def test_profile_equals_brute_force(seed, n_in, n_out, shift, decimals, confidence):
  a, b = _scores(seed, n_in, n_out, shift=shift, decimals=decimals)
  epsilons = np.array([0.0, 0.1, 0.5, 1.0, 3.0])
  got = auditing.privacy_profile(a, b, epsilons, confidence=confidence)
  want = [_brute_profile(list(a), list(b), e, confidence) for e in epsilons]
  assert got.shape == epsilons.shape
  np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
  assert want[0] > 0.25 and want[2] > 0  # non-trivial curves
  assert got.dtype == np.float64
  # Scalar in, scalar out; a 2-D grid keeps its shape.
  assert auditing.privacy_profile(a, b, 0.5, confidence=confidence) == pytest.approx(
      want[2], rel=1e-9)
  grid = auditing.privacy_profile(a, b, epsilons.reshape(5, 1), confidence=confidence)
  np.testing.assert_allclose(grid[:, 0], want, rtol=1e-9, atol=1e-12)


def test_profile_directions_are_symmetric():
  # Exchanging IN and OUT and negating the scores (no ties) maps each test to its
  # mirror; exchanging them alone makes "higher = IN" useless, so the bound is 0.
  a, b = _scores(5, 30, 25, shift=4.0)
  eps = np.array([0.0, 0.7])
  got = auditing.privacy_profile(a, b, eps)
  assert np.all(got > 0.1)
  np.testing.assert_allclose(got, auditing.privacy_profile(-b, -a, eps), rtol=1e-12)
  assert np.all(auditing.privacy_profile(b, a, eps) == 0.0)


def test_profile_is_zero_without_evidence():
  same = np.arange(10.0)
  assert np.all(auditing.privacy_profile(same, same, [0.0, 1.0]) == 0.0)


# --- attack_bounds -------------------------------------------------------------------


@pytest.mark.parametrize('delta,confidence', [(1e-5, 0.95), (1e-2, 0.7)])
def test_attack_bounds_is_audit_scores_on_members(delta, confidence):
  a, b = _scores(10, 60, 80, shift=2.5)
  scores = np.concatenate([b[:40], a, b[40:]])
  labels = np.r_[np.zeros(40, int), np.ones(60, int), np.zeros(40, int)]
  got = auditing.attack_bounds(scores, labels, delta, confidence=confidence)
  want = auditing.audit_scores(a, b, delta=delta, confidence=confidence, fdp=False)
  assert set(got) == {'attack_epsilon_cp', 'attack_gdp_mu'}
  assert got['attack_epsilon_cp'] == want['epsilon_cp'] > 0
  assert got['attack_gdp_mu'] == want['gdp_mu'] > 0
  assert all(type(v) is float for v in got.values())  # pylint: disable=unidiomatic-typecheck
  # Boolean labels mean the same; flipping them swaps members and non-members.
  assert auditing.attack_bounds(scores, labels.astype(bool), delta,
                                confidence=confidence) == got
  flipped = auditing.attack_bounds(-scores, 1 - labels, delta, confidence=confidence)
  assert flipped['attack_epsilon_cp'] == pytest.approx(
      auditing.audit_scores(-b, -a, delta=delta, confidence=confidence,
                            fdp=False)['epsilon_cp'], rel=1e-12)


def test_attack_bounds_default_confidence_is_095():
  a, b = _scores(11, 50, 50, shift=2.5)
  scores, labels = np.r_[a, b], np.r_[np.ones(50), np.zeros(50)]
  got = auditing.attack_bounds(scores, labels, 1e-5)
  want = auditing.audit_scores(a, b, delta=1e-5, confidence=0.95, fdp=False)
  assert got == {'attack_epsilon_cp': want['epsilon_cp'], 'attack_gdp_mu': want['gdp_mu']}
  other = auditing.attack_bounds(scores, labels, 1e-5, confidence=0.6)
  assert other['attack_gdp_mu'] != got['attack_gdp_mu']


@pytest.mark.parametrize('scores,labels', [
    ([1.0, 0.0, np.nan], [1, 0, 0]),
    ([1.0, np.inf, 0.0], [1, 1, 0]),
    ([1.0, 2.0], [1, 1]),
    ([1.0, 2.0], [0, 0]),
])
def test_attack_bounds_nan_without_two_sides_or_finite_scores(scores, labels):
  got = auditing.attack_bounds(scores, labels, 1e-5)
  assert set(got) == {'attack_epsilon_cp', 'attack_gdp_mu'}
  assert all(math.isnan(v) for v in got.values())


# --- gdp_mu's delta filter, bootstrap settings -----------------------------------------


def test_gdp_mu_skips_thresholds_with_an_upper_bound_at_or_above_one_minus_delta():
  # At the top threshold FNR = 4/10 has an upper bound ~0.90 (Bonferroni over 2 x 211
  # rates) and FPR = 0/200 a small one: mu > 0 when 0.90 < 1 - delta, and that threshold
  # is skipped at delta = 0.4.
  in_scores, out_scores = [10.0] * 6 + [0.0] * 4, [0.0] * 200
  assert auditing.audit_scores(in_scores, out_scores, delta=0.01, fdp=False)['gdp_mu'] > 0.3
  assert auditing.audit_scores(in_scores, out_scores, delta=0.4, fdp=False)['gdp_mu'] == 0.0


def test_bootstrap_equals_the_library_calls():
  from jax_privacy import auditing as library  # pylint: disable=g-import-not-at-top
  a, b = _scores(12, 150, 150, shift=1.0)
  result = auditing.audit_scores(a, b, delta=1e-3, confidence=0.8, bootstrap=20,
                                 raw_min_count=5, fdp=False, seed=2)
  auditor = library.CanaryScoreAuditor(a, b)
  params = library.BootstrapParams.confidence_interval(num_samples=20, confidence=0.8,
                                                       seed=2)
  low, high = auditor.epsilon_raw_counts(5, 1e-3, bootstrap_params=params)
  assert result['epsilon_raw'] == float(auditor.epsilon_raw_counts(5, 1e-3))
  assert (result['epsilon_raw_ci_low'], result['epsilon_raw_ci_high']) == (low, high)
  assert result['audit_bootstrap'] == 20
  assert auditing.audit_scores(a, b, delta=1e-3, confidence=0.8, bootstrap=20,
                               raw_min_count=5, fdp=False, seed=2) == result


def test_split_default_seed_is_zero():
  from jax_privacy import auditing as library  # pylint: disable=g-import-not-at-top
  a, b = _scores(3, 150, 150, shift=2.0)
  result = auditing.audit_scores(a, b, delta=1e-4, confidence=0.9,
                                 threshold_strategy='split', fdp=False)
  auditor = library.CanaryScoreAuditor(a, b)
  assert result['epsilon_cp'] == pytest.approx(auditor.epsilon_clopper_pearson(
      0.1, 1e-4, threshold_strategy=library.Split(threshold_estimation_frac=0.5, seed=0)),
      rel=1e-9)


# --- The Bonferroni family is fixed: n + 1 thresholds, not the ROC frontier -------------


def _separated(n_pos=50, n_neg=50):
  # Every IN score above every OUT score: the frontier is 3 thresholds (0, 1, +inf)
  # whatever n is, so a frontier-sized family would divide by 3, the fixed one by n + 1.
  return np.ones(n_pos), np.zeros(n_neg)


def test_separated_scores_have_a_frontier_of_three_thresholds():
  from jax_privacy import auditing as library  # pylint: disable=g-import-not-at-top
  a, b = _separated()
  assert len(library.CanaryScoreAuditor(a, b)._fn_counts) == 3  # pylint: disable=protected-access
  assert auditing.threshold_family(50, 50) == 101


@pytest.mark.parametrize('n', [20, 50, 400])
def test_gdp_mu_closed_form_uses_the_fixed_family(n):
  # The one informative threshold (t = 1) has FN = FP = 0; a one-sided Clopper-Pearson
  # upper bound of 0 / n at level 1 - s is 1 - s^(1/n). With s = 0.05 / (2 (2n + 1)):
  # mu = Phi^-1(1 - FPR_ub) - Phi^-1(FNR_ub) = 2 Phi^-1(s^(1/n)).
  a, b = _separated(n, n)
  got = auditing.audit_scores(a, b, delta=1e-5, confidence=0.95, fdp=False,
                              threshold_strategy='bonferroni')
  each = 0.05 / (2 * (2 * n + 1))
  assert got['gdp_mu'] == pytest.approx(2 * sps.norm.ppf(each ** (1 / n)), rel=1e-9)
  # The frontier-sized family (2 x 3 rates) would claim more.
  frontier = 2 * sps.norm.ppf((0.05 / 6) ** (1 / n))
  assert got['gdp_mu'] < frontier - 0.05
  assert got['audit_threshold_family'] == 2 * n + 1


@pytest.mark.parametrize('n', [20, 50, 400])
def test_bonferroni_cp_closed_form_uses_the_fixed_family(n):
  # The same threshold under the library's Clopper-Pearson, which splits each
  # threshold's significance s' = 0.05 / (2n + 1) between FNR and FPR: with
  # r = (s' / 2)^(1/n), TPR_lb = r and FPR_ub = 1 - r, epsilon = log(r - delta) - log(1 - r).
  a, b = _separated(n, n)
  delta = 1e-5
  got = auditing.audit_scores(a, b, delta=delta, confidence=0.95, fdp=False,
                              threshold_strategy='bonferroni')['epsilon_cp']
  r = (0.05 / (2 * n + 1) / 2) ** (1 / n)
  assert got == pytest.approx(math.log(r - delta) - math.log(1 - r), rel=1e-9)
  r_frontier = (0.05 / 3 / 2) ** (1 / n)
  assert got < math.log(r_frontier - delta) - math.log(1 - r_frontier) - 0.05


def test_the_family_does_not_depend_on_the_scores():
  # Same n, different data (separated vs overlapping, ties vs none): the same family,
  # hence the same per-threshold level, wherever the frontier lies.
  sets = [_separated(60, 60), _scores(9, 60, 60), _scores(9, 60, 60, decimals=0)]
  fams = {auditing.audit_scores(a, b, delta=1e-5, fdp=False)['audit_threshold_family']
          for a, b in sets}
  assert fams == {121}


def test_split_is_the_default_strategy():
  a, b = _scores(13, 200, 200, shift=2.0)
  default = auditing.audit_scores(a, b, delta=1e-5, fdp=False)
  split = auditing.audit_scores(a, b, delta=1e-5, fdp=False, threshold_strategy='split',
                                split_fraction=0.5, seed=0)
  bonf = auditing.audit_scores(a, b, delta=1e-5, fdp=False, threshold_strategy='bonferroni')
  assert default == split
  assert default['audit_threshold_strategy'] == 'split'
  assert default['epsilon_cp'] != bonf['epsilon_cp']


# --- The one-run bound's delta term ------------------------------------------------------


@pytest.mark.parametrize('strategy,fraction,m', [('split', 0.5, 130), ('split', 0.3, 182),
                                                 ('bonferroni', 0.5, 260)])
def test_one_run_delta_term_is_two_m_delta_of_the_bounding_trials(strategy, fraction, m):
  # 120 IN + 140 OUT; 'split' bounds on the rest after int(n x fraction) of each side.
  a, b = _scores(14, 120, 140)
  got = auditing.audit_scores(a, b, delta=1e-4, fdp=False, threshold_strategy=strategy,
                              split_fraction=fraction)
  assert auditing.one_run_trials(120, 140, strategy, fraction) == m
  assert got['one_run_delta_term'] == pytest.approx(2 * m * 1e-4, rel=1e-12)


def test_one_run_bound_depends_on_m_delta_against_the_level_of_each_test():
  # Same scores (2,000 trials, shift 2), only delta moves. The one-run p-value is
  # beta + alpha x 2 m delta against the level of each test: 0.05 under 'split' (m =
  # 1,000), 0.05 / 2,001 under 'bonferroni' (m = 2,000). CP does not move.
  a, b = _scores(15, 1000, 1000, shift=2.0)

  def one_run(delta, strategy):
    return auditing.audit_scores(a, b, delta=delta, fdp=False,
                                 threshold_strategy=strategy)

  # 'bonferroni': 2 m delta = 0.04 swamps 2.5e-5 at delta 1e-5; 4e-4 at 1e-7 does not.
  assert one_run(1e-5, 'bonferroni')['epsilon_one_run'] == 0.0
  assert one_run(1e-7, 'bonferroni')['epsilon_one_run'] > 2.0
  # 'split': 2 m delta = 2 at delta 1e-3 costs about a third of the bound at 1e-7.
  big, small = one_run(1e-3, 'split'), one_run(1e-7, 'split')
  assert big['one_run_delta_term'] == pytest.approx(2.0)
  assert 0.0 < big['epsilon_one_run'] < small['epsilon_one_run'] - 0.5
  assert big['epsilon_cp'] == pytest.approx(small['epsilon_cp'], rel=0.05)


# --- 'explicit': one threshold fixed before the data -------------------------------------


def test_explicit_threshold_is_the_library_explicit_at_full_significance():
  from jax_privacy import auditing as library  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(16)
  bits = rng.random(600) < 0.5
  guesses = np.where(rng.random(600) < 0.2, ~bits, bits).astype(float)  # 0/1 guesses
  a, b = guesses[bits], guesses[~bits]
  got = auditing.audit_scores(a, b, delta=1e-5, confidence=0.9, fdp=False,
                              threshold_strategy='explicit', threshold=1.0)
  auditor = library.CanaryScoreAuditor(a, b)
  one = library.Explicit(1.0)
  assert got['epsilon_cp'] == pytest.approx(
      auditor.epsilon_clopper_pearson(0.1, 1e-5, threshold_strategy=one), rel=1e-12)
  assert got['epsilon_one_run'] == pytest.approx(
      auditor.epsilon_one_run(0.1, 1e-5, threshold_strategy=one), rel=1e-9)
  assert got['epsilon_cp'] > 0 and got['one_run_delta_term'] == pytest.approx(2 * 600 * 1e-5)
  # GDP at that one threshold: its two rates at 0.05 each (no family).
  fn, fp = int(np.sum(a < 1)), int(np.sum(b >= 1))
  fnr_ub = sps.beta.ppf(0.95, fn + 1, a.size - fn)
  fpr_ub = sps.beta.ppf(0.95, fp + 1, b.size - fp)
  assert got['gdp_mu'] == pytest.approx(sps.norm.isf(fpr_ub) - sps.norm.ppf(fnr_ub),
                                        rel=1e-9)
  # Tighter than any data-chosen threshold on the same guesses.
  for strategy in ('split', 'bonferroni'):
    other = auditing.audit_scores(a, b, delta=1e-5, confidence=0.9, fdp=False,
                                  threshold_strategy=strategy)
    assert other['epsilon_cp'] < got['epsilon_cp'] and other['gdp_mu'] < got['gdp_mu']


@pytest.mark.parametrize('threshold', [None, math.inf, math.nan])
def test_explicit_needs_a_finite_threshold(threshold):
  with pytest.raises(ValueError, match=r"'explicit' needs a finite threshold"):
    auditing.audit_scores([1.0, 0.0], [0.0, 0.0], delta=1e-5,
                          threshold_strategy='explicit', threshold=threshold)


# --- From the mutation run after issue 28 ------------------------------------------------


def test_explicit_threshold_is_the_one_given_not_the_best_one_after_the_fact():
  # Continuous scores and a poor threshold fixed beforehand: the bound is the library's at
  # that threshold, well below what the best threshold chosen on the same data would give
  # (`Explicit(None)`: every threshold at the full significance, which is not valid).
  from jax_privacy import auditing as library  # pylint: disable=g-import-not-at-top
  a, b = _scores(17, 400, 400, shift=2.0)
  got = auditing.audit_scores(a, b, delta=1e-5, confidence=0.9, fdp=False,
                              threshold_strategy='explicit', threshold=-0.5)
  auditor = library.CanaryScoreAuditor(a, b)
  at = library.Explicit(-0.5)
  assert got['epsilon_cp'] == pytest.approx(
      auditor.epsilon_clopper_pearson(0.1, 1e-5, threshold_strategy=at), rel=1e-12)
  assert got['epsilon_one_run'] == pytest.approx(
      auditor.epsilon_one_run(0.1, 1e-5, threshold_strategy=at), rel=1e-9)
  best = library.Explicit(None)
  assert got['epsilon_cp'] < 0.5 * auditor.epsilon_clopper_pearson(
      0.1, 1e-5, threshold_strategy=best)


def test_split_needs_both_parts_at_the_fraction_given():
  # int(3 x 0.2) = 0 scores of each side would choose the threshold: refused at 0.2, while
  # the default 0.5 (1 of 3) would pass.
  with pytest.raises(ValueError, match=r"^threshold_strategy 'split' \(fraction 0\.2\) needs "
                     r'scores of each side in both parts \(got 3 IN, 3 OUT\); use '
                     r"'bonferroni' for so few trials$"):
    auditing.audit_scores([1.0, 2.0, 3.0], [0.0, 0.5, 1.0], delta=1e-5, fdp=False,
                          split_fraction=0.2)
  assert auditing.audit_scores([1.0, 2.0, 3.0], [0.0, 0.5, 1.0], delta=1e-5,
                               fdp=False)['n_in'] == 3
  # one_run_trials' default fraction is the bound's default: half of each side bounds.
  assert auditing.one_run_trials(120, 141, 'split') == 60 + 71


@pytest.mark.parametrize('confidence', [0.0, 1.0, 1.5])
def test_profile_confidence_outside_open_interval_raises(confidence):
  # Refused by the profile's own check, which names the value given (the rates' intervals
  # downstream would refuse a level above 1 too, but with another value in the message).
  with pytest.raises(ValueError, match=rf'^confidence must be in \(0, 1\) \(got {confidence}\)$'):
    auditing.privacy_profile([1.0], [0.0], [1.0], confidence=confidence)


def test_profile_violation_is_the_profile_above_the_claimed_curve():
  a, b = _scores(18, 300, 300, shift=2.5)
  grid = np.array([0.0, 0.5, 1.0, 2.0])
  lower = auditing.privacy_profile(a, b, grid, confidence=0.9)
  seen = []

  def curve(eps, value):
    seen.append(eps)
    return value

  # Claimed below the bound where it is lowest, above it elsewhere: violated there.
  claimed = lower + np.array([0.1, 0.1, -0.05, 0.1])
  got = auditing.profile_violation(a, b, lambda e: curve(e, claimed), [0, 0.5, 1, 2],
                                   confidence=0.9)
  assert seen[-1].dtype == np.float64 and list(seen[-1]) == list(grid)
  assert got == {'profile_violation': 1.0, 'profile_excess': pytest.approx(0.05),
                 'profile_epsilon': 1.0}
  # The claimed curve is evaluated at float64 epsilons even when given integers.
  got = auditing.profile_violation(a, b, lambda e: curve(e, np.ones(3)), [0, 1, 2],
                                   confidence=0.9)
  assert seen[-1].dtype == np.float64 and got['profile_violation'] == 0.0
  # A claim equal to the bound everywhere is not refuted; its excess is 0 at the first epsilon.
  got = auditing.profile_violation(a, b, lambda e: curve(e, lower), grid, confidence=0.9)
  assert got == {'profile_violation': 0.0, 'profile_excess': 0.0, 'profile_epsilon': 0.0}
  # The confidence reaches the profile: a lower one bounds higher.
  high = auditing.profile_violation(a, b, lambda e: np.zeros_like(e), grid, confidence=0.5)
  assert high['profile_excess'] > auditing.profile_violation(
      a, b, lambda e: np.zeros_like(e), grid, confidence=0.99)['profile_excess']
