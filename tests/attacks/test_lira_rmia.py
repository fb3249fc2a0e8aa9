"""LiRA (offline, online, fixed variance) and RMIA on recordings: analytic optima, limits, and
re-derivations by hand."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special
from scipy.stats import norm as stats_norm

from fl_privacy.attacks.passive import evaluate
from fl_privacy.attacks.passive import lira
from fl_privacy.attacks.passive import rmia
from fl_privacy.attacks.passive import scores
from fl_privacy.eval import metrics
from fl_privacy.fl import losses


def _loss_of(phi):
  """The cross-entropy loss whose logit margin is phi: -log(sigmoid(phi))."""
  return np.logaddexp(0.0, -np.asarray(phi, np.float64))


def _margin_of(loss):
  """The logit margin of a cross-entropy loss, log(p / (1 - p)) with p = exp(-loss)."""
  loss = np.asarray(loss, np.float64)
  return -loss - np.log(-np.expm1(-loss))


def _optimum(delta, s):
  """AUC of the likelihood ratio test between N(mu, s^2) and N(mu + delta, s^2)."""
  return float(special.ndtr(abs(delta) / (s * math.sqrt(2.0))))


# --- phi and Pr(x | theta) from the logit margin ----------------------------------------------


def test_phi_is_the_recorded_margin_and_a_recording_without_margins_is_refused():
  margin = np.array([[[60.0, -3.0, 0.25]]], np.float32)
  got = lira.phi({'margin': margin, 'loss': np.zeros_like(margin)})
  assert got.dtype == np.float64
  np.testing.assert_array_equal(got, margin.astype(np.float64))  # not derived from the loss
  for module_fn in (lambda r: lira.phi(r), lambda r: rmia.recording_loss(r),
                    lambda r: scores.signed_measurement(r, 'phi'),
                    lambda r: scores.signed_measurement(r, 'log_p')):
    with pytest.raises(ValueError, match='re-record'):
      module_fn({'loss': np.ones((1, 2, 3))})


def test_rmia_probability_from_the_margin_is_exact_where_the_float32_loss_is_zero():
  # log p_y = -log(1 + e^-m): about -e^-m for large m, where float32 cross-entropy is 0.
  m = np.arange(10.0, 61.0)
  got = rmia.loss_from_margin(m)
  np.testing.assert_allclose(got, np.log1p(np.exp(-m)), rtol=1e-14)
  np.testing.assert_allclose(got[m >= 40], np.exp(-m[m >= 40]), rtol=1e-15)
  assert (np.diff(got) < 0).all()  # strictly decreasing: confident models still rank
  assert (np.float32(np.exp(-m[m >= 20])) + np.float32(1) == np.float32(1)).all()
  # Negative margins: -log p = -m + log(1 + e^m), no overflow at -1000.
  np.testing.assert_allclose(rmia.loss_from_margin([-1000.0, 0.0]), [1000.0, math.log(2.0)],
                             rtol=1e-15)


# --- LiRA reaches the optimum on Gaussian statistics --------------------------------------------


def _gaussian_queries(rng, num_queries, delta, s):
  """Query means (difficulty), membership of the target, and the target's phi."""
  mu = 2.0 * rng.normal(size=num_queries)
  member = np.arange(num_queries) % 2 == 0
  x = mu + delta * member + s * rng.normal(size=num_queries)
  return mu, member, x


@pytest.mark.parametrize('fixed_variance', [False, True])
def test_offline_lira_reaches_the_optimal_auc(fixed_variance):
  rng = np.random.default_rng(0)
  delta, s, num_queries, num_shadows = 1.0, 1.0, 4000, 200
  mu, member, x = _gaussian_queries(rng, num_queries, delta, s)
  shadows = mu + s * rng.normal(size=(num_shadows, num_queries))
  values = np.concatenate([x[None], shadows])[None]  # [1 round, 1 + m rows, Q]
  got = lira.offline_scores(values, target=0, fixed_variance=fixed_variance)
  assert got.shape == (1, num_queries)
  auc, low, high = metrics.auc_interval(got[0], member)
  # DeLong's 95% interval of 2000 + 2000 entries: half-width ~ 1.96 sqrt(2 * 0.045 / 2000).
  assert high - low < 0.03
  # The estimated mean adds s^2 / m of variance: optimum lowered by < 0.001, inside the interval.
  assert low <= _optimum(delta, s) <= high


@pytest.mark.parametrize('fixed_variance', [False, True])
def test_online_lira_reaches_the_optimal_auc(fixed_variance):
  rng = np.random.default_rng(1)
  delta, s, num_queries, n = -0.8, 0.5, 4000, 64  # members have the lower mean here
  mu, member, x = _gaussian_queries(rng, num_queries, delta, s)
  phi_in = mu + delta + s * rng.normal(size=(n, num_queries))
  phi_out = mu + s * rng.normal(size=(n, num_queries))
  got = lira.online_scores(x, phi_in, phi_out, fixed_variance=fixed_variance)
  auc, low, high = metrics.auc_interval(got, member)
  assert high - low < 0.03
  assert low <= _optimum(delta, s) <= high


def _recording(rng, num_clients, per_client, num_test, delta, s, num_rounds=1):
  """phi of client j on query q: mu_q + delta [owner_q == j] + s N(0, 1), stored as the margin
  (and its loss for the loss-based attacks)."""
  q = num_clients * per_client + num_test
  owner = np.r_[np.repeat(np.arange(num_clients), per_client), np.full(num_test, -1)]
  mu = 2.0 * rng.normal(size=q)
  own = owner[None, :] == np.arange(num_clients)[:, None]
  phi = mu + delta * own + s * rng.normal(size=(num_rounds, num_clients, q))
  return dict(loss=_loss_of(phi), margin=phi, rounds=np.arange(num_rounds)), owner


def test_offline_lira_on_a_recording_reaches_the_optimum_and_pools_like_scores():
  rng = np.random.default_rng(2)
  delta, s = 1.0, 1.0
  rec, owner = _recording(rng, num_clients=50, per_client=20, num_test=1000, delta=delta, s=s)
  pooled = lira.pooled_round_scores(rec, owner, exclude_owner=True)
  # The layout of scores.pooled_round_scores: same labels and targets, entry by entry.
  ref = scores.pooled_round_scores(dict(rec, cos=rec['loss'], diff=rec['loss'],
                                        grad_sq=rec['loss'][:, 0]), owner, 'loss_series')
  np.testing.assert_array_equal(pooled['labels'], ref['labels'])
  np.testing.assert_array_equal(pooled['target'], ref['target'])
  assert pooled['scores'].shape == ref['scores'].shape
  m = evaluate.score_metrics(lira.combine_rounds(pooled['scores']), pooled['labels'],
                             pooled['target'])
  assert m['n_pos'] == 1000 and m['n_neg'] == 50 * 2000 - 1000
  # 48 shadows per query: the estimated mean lowers the optimum by ~0.002; the interval of 1000
  # members is ~ +-0.017.
  assert m['auc_ci_high'] - m['auc_ci_low'] < 0.04
  assert m['auc_ci_low'] <= _optimum(delta, s) <= m['auc_ci_high']


def test_offline_lira_round_scores_are_the_per_round_test_of_the_other_clients():
  rng = np.random.default_rng(3)
  rec, owner = _recording(rng, 4, 3, 5, delta=1.0, s=1.0, num_rounds=3)
  got = lira.round_scores(rec, owner, target=2)
  phi = rec['margin']
  members, nonmembers = np.flatnonzero(owner == 2), np.flatnonzero(owner != 2)
  order = np.r_[members, nonmembers]
  for t in range(3):
    for i, q in enumerate(order):
      shadows = phi[t, [0, 1, 3], q]
      z = (phi[t, 2, q] - shadows.mean()) / math.sqrt(shadows.var(ddof=1) + 1e-8)
      assert got['scores'][t, i] == pytest.approx(special.ndtr(z), rel=1e-12)
  np.testing.assert_array_equal(got['labels'], np.r_[np.ones(3), np.zeros(14)])
  # exclude_owner drops the owner's row: query 0 (client 0) keeps rows 1 and 3 only.
  got = lira.round_scores(rec, owner, target=2, exclude_owner=True)
  shadows = phi[0, [1, 3], 0]
  z = (phi[0, 2, 0] - shadows.mean()) / math.sqrt(shadows.var(ddof=1) + 1e-8)
  assert got['scores'][0, list(order).index(0)] == pytest.approx(special.ndtr(z), rel=1e-12)


@pytest.mark.parametrize('module', [lira, rmia])
def test_rounds_are_averaged(module):
  rng = np.random.default_rng(9)
  rec, owner = _recording(rng, 3, 4, 6, delta=1.0, s=1.0, num_rounds=3)
  per_round = module.pooled_round_scores(rec, owner)['scores']
  assert per_round.shape == (3, 3 * 18)
  np.testing.assert_allclose(module.combine_rounds(per_round),
                             (per_round[0] + per_round[1] + per_round[2]) / 3, rtol=1e-15)
  np.testing.assert_allclose(module.combine_rounds(per_round, upto=2),
                             (per_round[0] + per_round[1]) / 2, rtol=1e-15)
  assert not np.allclose(per_round.max(axis=0), per_round.mean(axis=0))


# --- fixed variance ---------------------------------------------------------------------------


def test_fixed_and_per_query_variance_agree_when_the_true_variances_are_equal():
  rng = np.random.default_rng(4)
  m, num_queries = 2000, 20
  mu = rng.normal(size=num_queries)
  for s_q, equal in ((np.full(num_queries, 1.5), True), (np.r_[[1.0] * 10, [2.0] * 10], False)):
    shadows = mu + s_q * rng.normal(size=(m, num_queries))
    x = mu + 1.5 * s_q  # z = 1.5 under the query's own sigma
    values = np.concatenate([x[None], shadows])
    z_q = special.ndtri(lira.offline_scores(values, 0))
    z_f = special.ndtri(lira.offline_scores(values, 0, fixed_variance=True))
    ratio = z_q / z_f  # = sigma_fixed / sigma_q up to the shared mean
    if equal:
      # sd of sigma_hat / sigma is 1 / sqrt(2 (m - 1)); 5 of them cover 20 queries.
      assert np.abs(ratio - 1).max() < 5 / math.sqrt(2 * (m - 1))
    else:
      # sigma_fixed = sqrt((1 + 4) / 2): the per-query and fixed scores differ, both ways.
      np.testing.assert_allclose(ratio, np.r_[[math.sqrt(2.5)] * 10, [math.sqrt(2.5) / 2] * 10],
                                 rtol=5 / math.sqrt(2 * (m - 1)))


def test_fixed_variance_by_hand_with_a_single_shadow_for_one_query():
  sd = math.sqrt(10 / 3)  # pooled: (SS 2 + SS 8 + SS 0) / (dof 2 + 1 + 0)
  garbage = 1e3
  values = np.array([
      [2 + sd, 2.0, 5 - sd],        # target row
      [1.0, 0.0, 5.0],
      [2.0, 4.0, garbage],
      [3.0, garbage, garbage],
  ])
  mask = np.array([[True] * 3, [True] * 3, [True, True, False], [True, False, False]])
  got = lira.offline_scores(values, 0, shadow_mask=mask, fixed_variance=True)
  z = np.array([sd, 0.0, -sd]) / math.sqrt(10 / 3 + 1e-8)
  np.testing.assert_allclose(got, special.ndtr(z), rtol=1e-12)
  with pytest.raises(ValueError, match='two shadows per query'):
    lira.offline_scores(values, 0, shadow_mask=mask)


def test_online_fixed_variance_is_the_global_sigma_in_and_sigma_out_by_hand():
  # IN: two models, query means 4 and 1, SS 2 and 0 -> sigma_in^2 = 2 / 2 = 1.
  # OUT: three models, means 1 and 3, SS 2 and 6 -> sigma_out^2 = 8 / 4 = 2.
  phi_in = np.array([[3.0, 1.0], [5.0, 1.0]])
  phi_out = np.array([[0.0, 2.0], [1.0, 2.0], [2.0, 5.0]])
  x = np.array([2.5, 0.0])
  v_in, v_out = 1.0 + 1e-8, 2.0 + 1e-8
  want = (-0.5 * np.log(v_in) - (x - [4.0, 1.0]) ** 2 / (2 * v_in)
          + 0.5 * np.log(v_out) + (x - [1.0, 3.0]) ** 2 / (2 * v_out))
  np.testing.assert_allclose(lira.online_scores(x, phi_in, phi_out, fixed_variance=True), want,
                             rtol=1e-12)
  # Not one sigma shared by IN and OUT (10 / 6): the log-variance term would vanish.
  shared = 10 / 6 + 1e-8
  assert not np.allclose(lira.online_scores(x, phi_in, phi_out, fixed_variance=True),
                         ((x - [1.0, 3.0]) ** 2 - (x - [4.0, 1.0]) ** 2) / (2 * shared))
  # Per-query variances by hand (ddof 1): in var 2, 0; out var 1, 3.
  v_in, v_out = np.array([2.0, 0.0]) + 1e-8, np.array([1.0, 3.0]) + 1e-8
  want = (-0.5 * np.log(v_in) - (x - [4.0, 1.0]) ** 2 / (2 * v_in)
          + 0.5 * np.log(v_out) + (x - [1.0, 3.0]) ** 2 / (2 * v_out))
  np.testing.assert_allclose(lira.online_scores(x, phi_in, phi_out), want, rtol=1e-10)
  # One IN model has no IN spread, per query or global.
  for fixed in (False, True):
    with pytest.raises(ValueError, match='two shadows'):
      lira.online_scores(x, phi_in[:1], phi_out, fixed_variance=fixed)


def test_online_fixed_variance_recovers_different_in_and_out_spreads():
  """IN ~ N(mu_q + 1, 0.5^2), OUT ~ N(mu_q, 2^2): the global variances are estimated apart,
  so the fixed-variance score equals the per-query one computed with the true variances, to
  the estimates' sampling error (ratio of variances within 5 sd of 1)."""
  rng = np.random.default_rng(11)
  q, n = 400, 50
  mu = rng.normal(size=q)
  phi_in = mu + 1 + 0.5 * rng.normal(size=(n, q))
  phi_out = mu + 2.0 * rng.normal(size=(n, q))
  x = np.zeros(q) + mu
  got = lira.online_scores(x, phi_in, phi_out, fixed_variance=True)
  # Recover sigma_in^2 from the score's curvature in x: d^2 / dx^2 = -1/v_in + 1/v_out.
  h = 0.5
  curv = (lira.online_scores(x + h, phi_in, phi_out, True) - 2 * got +
          lira.online_scores(x - h, phi_in, phi_out, True)) / h ** 2
  want = -1 / 0.25 + 1 / 4.0
  tol = 5 * math.sqrt(2 / (q * (n - 1))) * (1 / 0.25 + 1 / 4.0)
  np.testing.assert_allclose(curv, want, atol=tol)
  assert np.ptp(curv) < 1e-9  # one global pair of variances: the same curvature everywhere


# --- online LiRA on recordings (IN measurements `loss_in`) -------------------------------------


def _tiny_online():
  """3 clients, queries owned by 0, 1, 2 and a test row; 2 rounds, 2 IN models per query."""
  owner = np.array([0, 1, 2, -1])
  phi = np.array([[[3.0, 0.0, 1.0, -1.0], [0.5, 2.0, -1.0, 0.0], [1.5, -2.0, 2.0, 1.0]],
                  [[4.0, 1.0, 0.0, 0.0], [1.0, 3.0, 1.0, -2.0], [2.0, 0.0, 3.0, 2.0]]])
  phi_in = np.array([[[2.0, 1.0, 0.0, 0.5], [4.0, 2.0, 3.0, 1.5]],
                     [[3.0, 2.0, 1.0, -1.0], [6.0, 2.5, 2.0, 0.0]]])
  rec = dict(loss=_loss_of(phi), margin=phi, loss_in=_loss_of(phi_in), margin_in=phi_in,
             rounds=np.arange(2))
  return rec, owner, phi, phi_in


def _by_hand(x, phi_in, phi_out, fixed):
  """The online likelihood ratio in logs, written out: ddof-1 variances (+1e-8), or the global
  sigma_in and sigma_out (each pooled over the queries)."""
  mi, mo = phi_in.mean(0), phi_out.mean(0)
  ssi, sso = ((phi_in - mi) ** 2).sum(0), ((phi_out - mo) ** 2).sum(0)
  if fixed:
    vi = ssi.sum() / ((len(phi_in) - 1) * x.size) + 1e-8
    vo = sso.sum() / ((len(phi_out) - 1) * x.size) + 1e-8
  else:
    vi, vo = ssi / (len(phi_in) - 1) + 1e-8, sso / (len(phi_out) - 1) + 1e-8
  return (-0.5 * np.log(2 * np.pi * vi) - (x - mi) ** 2 / (2 * vi)
          + 0.5 * np.log(2 * np.pi * vo) + (x - mo) ** 2 / (2 * vo))


@pytest.mark.parametrize('attack', ['lira_online', 'lira_online_fixed'])
def test_online_lira_on_a_tiny_recording_by_hand(attack):
  rec, owner, phi, phi_in = _tiny_online()
  fixed = attack == 'lira_online_fixed'
  pooled = scores.pooled_round_scores(rec, owner, attack)
  # Target 0 first: its member (query 0), then its non-members 1, 2, 3; shadows clients 1, 2.
  want = np.stack([_by_hand(phi[t, 0], phi_in[t], phi[t, 1:], fixed) for t in range(2)])
  np.testing.assert_allclose(pooled['scores'][:, :4], want, rtol=1e-7, atol=1e-7)
  # Target 2 (last): member query 2, then 0, 1, 3; shadows clients 0, 1.
  cols = [2, 0, 1, 3]
  want2 = np.stack([_by_hand(phi[t, 2, cols], phi_in[t][:, cols], phi[t, :2][:, cols], fixed)
                    for t in range(2)])
  np.testing.assert_allclose(pooled['scores'][:, 8:], want2, rtol=1e-7, atol=1e-7)
  # Rounds combine by their mean (Eq. 12 of FedMIA; the log LR of independent rounds / R).
  final = scores.combine_rounds(pooled['scores'], attack)
  np.testing.assert_allclose(final[:4], want.mean(0), rtol=1e-7, atol=1e-7)
  assert not np.allclose(final[:4], want.max(0))  # a max over rounds would fail here
  m = evaluate.evaluate(rec, owner, attack)
  assert m['n_pos'] == 3 and m['n_neg'] == 9


def test_online_lira_is_scored_aligned_only():
  """The public code has no IN models: 'public_code' is refused, the aligned scorings run."""
  rec, owner, _, _ = _tiny_online()
  for attack in ('lira_online', 'lira_online_fixed'):
    assert not scores.supports(attack, 'public_code')
    assert scores.supports(attack, 'aligned') and scores.supports(attack, 'public_code_2024')
    with pytest.raises(ValueError, match="online LiRA is scored aligned only.*'public_code'"):
      scores.pooled_round_scores(rec, owner, attack, scoring='public_code',
                                 rng=np.random.default_rng(3))
    assert scores.pooled_round_scores(rec, owner, attack, scoring='public_code_2024')[
        'scores'].shape[0] == 2


def test_online_lira_refuses_a_recording_without_in_measurements():
  rec, owner, _, _ = _tiny_online()
  del rec['margin_in']
  for attack in ('lira_online', 'lira_online_fixed'):
    with pytest.raises(ValueError, match='in_models > 0'):
      scores.pooled_round_scores(rec, owner, attack)
  assert scores.label('lira_online') == 'LiRA (online)'
  assert {'lira_online', 'lira_online_fixed'} <= set(scores.MULTI_ROUND)


@pytest.mark.parametrize('attack', ['lira_online', 'lira_online_fixed'])
def test_online_lira_on_a_recording_reaches_the_optimum(attack):
  """IN ~ N(mu_q + delta, s^2) and OUT ~ N(mu_q, s^2): the pooled AUC of the attack (through
  `evaluate`) is the likelihood ratio test's, inside its DeLong interval."""
  rng = np.random.default_rng(4)
  delta, s, num_in = 1.0, 1.0, 64
  rec, owner = _recording(rng, num_clients=50, per_client=20, num_test=1000, delta=delta, s=s)
  # `_recording` draws the query means first: the same seed gives them back.
  rng2 = np.random.default_rng(4)
  q = 50 * 20 + 1000
  mu_q = 2.0 * rng2.normal(size=q)
  rec['margin_in'] = mu_q + delta + s * rng.normal(size=(1, num_in, q))
  m = evaluate.evaluate(rec, owner, attack)
  assert m['n_pos'] == 1000
  # 1000 members: DeLong half-width ~0.017. A non-member of another client has its owner's IN
  # upload among its 49 OUT values (mean off by delta / 49): the optimum moves by < 0.005.
  assert m['auc_ci_high'] - m['auc_ci_low'] < 0.04
  assert m['auc_ci_low'] <= _optimum(delta, s) <= m['auc_ci_high']


# --- RMIA -------------------------------------------------------------------------------------


def _naive_rmia(loss, owner, target, gamma, a):
  """The RMIA score by its definition: double loop over candidates and population."""
  num_rounds, num_clients, num_queries = loss.shape
  population = [q for q in range(num_queries) if owner[q] == -1]
  refs = [j for j in range(num_clients) if j != target]
  order = ([q for q in range(num_queries) if owner[q] == target]
           + [q for q in range(num_queries) if owner[q] != target])
  out = np.zeros((num_rounds, num_queries))
  for t in range(num_rounds):
    def marginal(q):
      pr_out = sum(math.exp(-loss[t, j, q]) for j in refs) / len(refs)
      return ((1 + a) * pr_out + (1 - a)) / 2
    for i, x in enumerate(order):
      px = math.exp(-loss[t, target, x]) / marginal(x)
      hits = total = 0
      for z in population:
        if z == x:
          continue
        pz = math.exp(-loss[t, target, z]) / marginal(z)
        total += 1
        hits += (px / pz) >= gamma
      out[t, i] = hits / total
  return out


@pytest.mark.parametrize('gamma,a', [(1.0, 1.0), (2.0, 1.0), (1.0, 0.3), (1.5, 0.0)])
def test_rmia_equals_the_naive_double_loop(gamma, a):
  rng = np.random.default_rng(5)
  margin = rng.uniform(-2.0, 3.0, size=(2, 4, 11))
  loss = _loss_of(margin)  # -log sigmoid(margin), as rmia.loss_from_margin
  owner = np.array([0, 0, 1, 1, 2, 3, 3, -1, -1, -1, -1])
  pooled = rmia.pooled_round_scores(dict(margin=margin), owner, gamma=gamma, a=a)
  want = np.concatenate([_naive_rmia(loss, owner, k, gamma, a) for k in range(4)], axis=1)
  np.testing.assert_array_equal(pooled['scores'], want)
  ref = scores.pooled_round_scores(dict(loss=loss, margin=margin, cos=loss, diff=loss,
                                        grad_sq=loss[:, 0]), owner, 'loss_series')
  np.testing.assert_array_equal(pooled['labels'], ref['labels'])
  np.testing.assert_array_equal(pooled['target'], ref['target'])


def test_rmia_scores_decrease_with_gamma_and_rank_the_population():
  rng = np.random.default_rng(6)
  loss = rng.uniform(0.05, 3.0, size=(1, 5, 60))
  owner = np.r_[np.repeat(np.arange(5), 4), np.full(40, -1)]
  population = np.flatnonzero(owner == -1)
  by_gamma = [rmia.query_scores(loss, 1, population, gamma=g)[0] for g in (1.0, 1.5, 3.0)]
  assert (by_gamma[0] >= by_gamma[1]).all() and (by_gamma[1] >= by_gamma[2]).all()
  assert (by_gamma[0] > by_gamma[2]).any()
  # gamma = 1, z == x left out: a population sample's score is its rank among the other 39,
  # so the population's scores are 0, 1/39, ..., 1 (distinct ratios).
  np.testing.assert_allclose(np.sort(by_gamma[0][population]), np.arange(40) / 39, atol=1e-15)


def test_rmia_marginal_limits():
  rng = np.random.default_rng(7)
  ref_loss = rng.uniform(0.0, 4.0, size=(6, 30))
  pr_out = np.exp(-ref_loss).mean(axis=0)
  np.testing.assert_allclose(rmia.log_marginal(ref_loss, 1.0), np.log(pr_out), rtol=1e-13)
  np.testing.assert_allclose(np.exp(rmia.log_marginal(ref_loss, 0.3)),
                             (1.3 * pr_out + 0.7) / 2, rtol=1e-13)
  np.testing.assert_allclose(np.exp(rmia.log_marginal(ref_loss, 0.0)), (pr_out + 1) / 2,
                             rtol=1e-13)
  # Losses whose exp underflows: the log stays exact.
  assert rmia.log_marginal(np.array([[1000.0], [1000.0]]), 1.0)[0] == pytest.approx(-1000.0)
  with pytest.raises(ValueError):
    rmia.log_marginal(ref_loss, 1.5)


def test_rmia_separates_members_on_a_recording():
  rng = np.random.default_rng(8)
  rec, owner = _recording(rng, num_clients=10, per_client=30, num_test=300, delta=1.5, s=1.0,
                          num_rounds=2)
  pooled = rmia.pooled_round_scores(rec, owner, gamma=1.0, a=1.0)
  m = evaluate.score_metrics(rmia.combine_rounds(pooled['scores']), pooled['labels'],
                             pooled['target'])
  assert m['auc_ci_low'] > 0.6


# ----------------------------------------------------------------------------------------------
# Hand cases from a mutation run of lira.py (boundaries and the online pooled variance).


def test_online_fixed_variance_by_hand_with_one_degree_of_freedom_each():
  # One query, two IN and two OUT measurements: one degree of freedom each is enough.
  phi_in, phi_out, x = np.array([[2.0], [3.0]]), np.array([[0.0], [1.0]]), np.array([1.5])
  v_in = ((2.0 - 2.5) ** 2 + (3.0 - 2.5) ** 2) / 1 + lira.VARIANCE_FLOOR
  v_out = ((0.0 - 0.5) ** 2 + (1.0 - 0.5) ** 2) / 1 + lira.VARIANCE_FLOOR
  want = (-0.5 * math.log(v_in) - (1.5 - 2.5) ** 2 / (2 * v_in)
          + 0.5 * math.log(v_out) + (1.5 - 0.5) ** 2 / (2 * v_out))
  got = lira.online_scores(x, phi_in, phi_out, fixed_variance=True)
  np.testing.assert_allclose(got, [want], rtol=1e-12)
  with pytest.raises(ValueError, match='fixed variance'):
    lira.online_scores(x, phi_in, phi_out[:1], fixed_variance=True)
  # Three IN values with deviations -3, -1, +4 (their squares, not their sum or cubes).
  phi_in = np.array([[2.0], [4.0], [9.0]])
  v_in = (9.0 + 1.0 + 16.0) / 2 + lira.VARIANCE_FLOOR
  want = (-0.5 * math.log(v_in) - (1.5 - 5.0) ** 2 / (2 * v_in)
          + 0.5 * math.log(v_out) + (1.5 - 0.5) ** 2 / (2 * v_out))
  got = lira.online_scores(x, phi_in, phi_out, fixed_variance=True)
  np.testing.assert_allclose(got, [want], rtol=1e-12)


def test_online_scores_refuse_wrong_shapes():
  good = np.zeros((2, 3))
  for x, pin, pout in ((np.zeros((1, 3)), good, good), (np.zeros(3), np.zeros(3), good),
                       (np.zeros(3), good, np.zeros(3))):
    with pytest.raises(ValueError, match='online_scores takes'):
      lira.online_scores(x, pin, pout)


def test_offline_fixed_variance_needs_just_one_query_with_two_shadows():
  # Rows 1-2 shadow query 0; only row 1 shadows query 1 (mask): pooled dof = 1 + 0 = 1.
  values = np.array([[5.0, 5.0], [1.0, 2.0], [3.0, 9.0]])
  mask = np.array([[False, False], [True, True], [True, False]])
  var = ((1.0 - 2.0) ** 2 + (3.0 - 2.0) ** 2) / 1 + lira.VARIANCE_FLOOR
  want = stats_norm.cdf([(5.0 - 2.0) / np.sqrt(var), (5.0 - 2.0) / np.sqrt(var)])
  got = lira.offline_scores(values, 0, mask, fixed_variance=True)
  np.testing.assert_allclose(got, want, rtol=1e-12)
  with pytest.raises(ValueError, match='is not a row of 3 clients'):
    lira.offline_scores(values, 3)


def test_combine_rounds_averages_the_first_rounds_whatever_the_shape():
  r = np.arange(12.0).reshape(4, 3)  # more rounds than columns
  np.testing.assert_allclose(lira.combine_rounds(r), r.mean(axis=0))
  np.testing.assert_allclose(lira.combine_rounds(r, upto=2), r[:2].mean(axis=0))


def test_pooled_defaults_and_exclude_owner_pass_through():
  rng = np.random.default_rng(5)
  rec = {'margin': rng.normal(size=(2, 4, 12))}
  owner = np.r_[np.repeat(np.arange(4), 2), -np.ones(4, int)]
  default = lira.pooled_round_scores(rec, owner)
  np.testing.assert_array_equal(
      default['scores'], lira.pooled_round_scores(rec, owner, fixed_variance=False,
                                                  exclude_owner=False)['scores'])
  assert not np.allclose(default['scores'],
                         lira.pooled_round_scores(rec, owner, fixed_variance=True)['scores'])
  assert not np.allclose(default['scores'],
                         lira.pooled_round_scores(rec, owner, exclude_owner=True)['scores'])
  assert default['target'].dtype == np.int32 and default['labels'].dtype == np.int8


# Boundaries from a mutation run of rmia.py.


def test_rmia_argument_boundaries():
  with pytest.raises(ValueError, match='a must be in'):
    rmia.log_marginal(np.zeros((2, 3)), a=1.5)
  one_ref = np.array([[0.5, 1.0, 2.0]])  # a single reference model is enough
  np.testing.assert_allclose(rmia.log_marginal(one_ref, a=1.0), -one_ref[0])
  for bad in (np.zeros(3), np.zeros((0, 3))):  # not [m, n], or no reference model
    with pytest.raises(ValueError, match=r'ref_loss must be \[m >= 1, n\]'):
      rmia.log_marginal(bad)
  r = np.arange(12.0).reshape(4, 3)  # more rounds than columns
  np.testing.assert_allclose(rmia.combine_rounds(r), r.mean(axis=0))
  np.testing.assert_allclose(rmia.combine_rounds(r, upto=3), r[:3].mean(axis=0))
  with pytest.raises(ValueError, match='gamma must be positive'):
    rmia.pairwise_scores(np.zeros(2), np.zeros(3), gamma=0.0)
  # A candidate that is one of two population samples is compared with the other one only.
  np.testing.assert_allclose(rmia.pairwise_scores([1.0, 0.0], [1.0, 0.0], 1.0, [0, 1]),
                             [1.0, 0.0])
  with pytest.raises(ValueError, match='at least one sample besides'):
    rmia.pairwise_scores([1.0], [1.0], 1.0, [0])


def test_rmia_two_clients_and_defaults_pass_through():
  rng = np.random.default_rng(7)
  loss = rng.exponential(size=(2, 2, 10))
  owner = np.r_[np.zeros(3, int), np.ones(3, int), -np.ones(4, int)]
  out = rmia.query_scores(loss, 0, np.flatnonzero(owner == -1))  # one reference client
  assert out.shape == (2, 10) and np.all((out >= 0) & (out <= 1))
  with pytest.raises(ValueError, match='at least one reference client'):
    rmia.query_scores(loss[:, :1], 0, [6, 7])
  rec = {'margin': rng.normal(size=(2, 3, 10))}
  owner3 = np.r_[np.zeros(2, int), np.ones(2, int), np.full(2, 2), -np.ones(4, int)]
  np.testing.assert_array_equal(rmia.round_scores(rec, owner3, 0)['scores'],
                                rmia.round_scores(rec, owner3, 0, a=1.0, gamma=1.0)['scores'])
  default = rmia.pooled_round_scores(rec, owner3)
  chosen = rmia.pooled_round_scores(rec, owner3, population=np.arange(4, 10))
  assert not np.allclose(default['scores'], chosen['scores'])
  assert default['target'].dtype == np.int32 and default['labels'].dtype == np.int8


# ----------------------------------------------------------------------------------------------
# Confident models: margins where the float32 loss is exactly 0.


def test_lira_and_rmia_rank_members_of_confident_models_whose_float32_loss_is_zero():
  """Every client's margin on every query is in [20, 60], so every float32 loss is 0 and phi
  taken from the loss would be one clipped constant (no ranking at all). From the margins,
  the owner's +6 shows: offline LiRA separates members perfectly, RMIA well (its log Pr(x)
  without cancellation, `rmia.log_marginal`)."""
  rng = np.random.default_rng(12)
  k, per, num_test = 6, 8, 40
  q = k * per + num_test
  owner = np.r_[np.repeat(np.arange(k), per), np.full(num_test, -1)]
  base = rng.uniform(25.0, 45.0, size=q)
  own = owner[None, :] == np.arange(k)[:, None]
  margin = (base + 6.0 * own + 0.3 * rng.normal(size=(2, k, q))).astype(np.float32)
  # The float32 cross-entropy of two-class logits (margin, 0), as `queries.measure` records it.
  logits = np.stack([margin, np.zeros_like(margin)], axis=-1).reshape(-1, 2)
  loss32 = np.asarray(losses.per_example_cross_entropy(
      jnp.asarray(logits), jnp.zeros(len(logits), jnp.int32))).reshape(margin.shape)
  assert (loss32 == 0).all()  # what the float32 cross-entropy records here
  rec = dict(loss=loss32, margin=margin, rounds=np.arange(2))
  # RMIA at gamma 1: with p ~ 1 every likelihood ratio is ~1, so gamma = 2 is never reached.
  for attack in ('lira_offline', 'lira_offline_fixed'):
    m = evaluate.evaluate(rec, owner, attack)
    assert m['auc'] == 1.0, attack
    assert m['tpr_at_fpr_1e-2'] == 1.0, attack
  # RMIA compares a query's ratio with other queries' (whose scale e^-margin differs by 1e9
  # here), so it ranks well, not perfectly; from the float32 loss (p = 1 everywhere) every
  # ratio would be 0 and its AUC exactly 0.5.
  m = evaluate.evaluate(rec, owner, 'rmia', rmia_gamma=1.0)
  assert m['auc'] > 0.85
  flat = evaluate.evaluate(dict(rec, margin=np.full_like(margin, 200.0)), owner, 'rmia',
                           rmia_gamma=1.0)
  assert flat['auc'] == 0.5 and flat['top_tied'] == flat['n_pos'] + flat['n_neg']


def test_top_ties_are_counted_and_never_broken_for_the_members():
  # 3 members and 5 non-members share the top score: with 100 non-members, 1% FPR admits 1
  # false positive, so no threshold at the tie is admissible and TPR@1% is 0.
  scores_ = np.r_[np.ones(8), np.linspace(0.0, 0.5, 100)]
  labels = np.r_[np.ones(3), np.zeros(5), np.zeros(97), np.ones(3)].astype(int)
  m = evaluate.score_metrics(scores_, labels)
  assert m['top_tied'] == 8 and m['top_tied_negatives'] == 5
  assert m['tpr_at_fpr_1e-2'] == 0.0
  # The same entries with the tie broken for the members would read 3 / 6 at 1% FPR.
  broken = scores_.copy()
  broken[:3] += 1e-9
  assert evaluate.score_metrics(broken, labels)['tpr_at_fpr_1e-2'] == 0.5
  assert evaluate.top_ties(broken, labels) == {'top_tied': 3, 'top_tied_negatives': 0}


def test_rmia_reports_its_population_beside_the_rates():
  rng = np.random.default_rng(13)
  rec, owner = _recording(rng, num_clients=4, per_client=5, num_test=7, delta=1.0, s=1.0)
  m = evaluate.evaluate(rec, owner, 'rmia')
  assert m['rmia_population'] == 7
  assert 'top_tied' in m and 'top_tied_negatives' in m
  assert 'rmia_population' not in evaluate.evaluate(rec, owner, 'lira_offline')


def test_rmia_marginal_is_exact_for_confident_reference_models():
  # Losses of 1e-20: Pr(x) = 1 - (1 + a) / 2 * mean(loss) to double precision; a log-sum-exp
  # would round log Pr(x) to 0 and tie every such query.
  ref_loss = np.array([[1e-20, 4e-20], [3e-20, 2e-20]])
  for a in (1.0, 0.33, 0.0):
    want = -(1 + a) / 2 * ref_loss.mean(axis=0)
    np.testing.assert_allclose(rmia.log_marginal(ref_loss, a), want, rtol=1e-12)
  # Both ends in one call: a confident column and one whose exp underflows.
  mixed = np.array([[1e-18, 1000.0], [3e-18, 1000.0]])
  np.testing.assert_allclose(rmia.log_marginal(mixed, 1.0), [-2e-18, -1000.0], rtol=1e-12)
  np.testing.assert_allclose(rmia.log_marginal(mixed, 0.5)[1], math.log(0.25), rtol=1e-12)


def test_offline_fixed_variance_is_one_sigma_per_round_not_across_rounds():
  # Round 1's shadows spread 3x round 0's: each round's global sigma is its own, so the
  # scores of a two-round input equal those of each round alone (from a mutation run).
  rng = np.random.default_rng(14)
  base = rng.normal(size=(6, 9))
  wide = 3.0 * base
  wide[0] = base[0]  # the same target values, shadows spread 3x
  values = np.stack([base, wide])
  both = lira.offline_scores(values, 0, fixed_variance=True)
  for t in range(2):
    np.testing.assert_allclose(both[t], lira.offline_scores(values[t], 0, fixed_variance=True),
                               rtol=1e-12)
  assert not np.allclose(both[0], both[1])


def test_rmia_computes_in_float64_from_float32_recordings():
  # Recordings store float32 margins; -log p and log Pr(x) are float64 whatever comes in
  # (from the rmia mutation run: float32 arithmetic would be off by ~1e-7 relative).
  m32 = np.array([0.3, 7.0, 25.0, 60.0], np.float32)
  got = rmia.loss_from_margin(m32)
  assert got.dtype == np.float64
  np.testing.assert_allclose(got, np.log1p(np.exp(-m32.astype(np.float64))), rtol=1e-14)
  ref32 = np.array([[0.3, 1.7], [0.9, 2.2]], np.float32)
  ref64 = ref32.astype(np.float64)
  got = rmia.log_marginal(ref32, 0.33)
  assert got.dtype == np.float64
  want = np.log((1.33 * np.exp(-ref64).mean(axis=0) + 0.67) / 2)
  np.testing.assert_allclose(got, want, rtol=1e-14)


def test_online_lira_computes_in_float64_from_float32_margins():
  # From the lira mutation run: float32 margins (as recorded) are scored in float64.
  rng = np.random.default_rng(15)
  x, pin, pout = (rng.normal(size=s).astype(np.float32) * 3 + 20
                  for s in ((7,), (3, 7), (5, 7)))
  for fixed in (False, True):
    got = lira.online_scores(x, pin, pout, fixed_variance=fixed)
    assert got.dtype == np.float64
    want = lira.online_scores(x.astype(np.float64), pin.astype(np.float64),
                              pout.astype(np.float64), fixed_variance=fixed)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-12)


def test_round_scores_defaults_to_aligned_and_names_what_it_lacks():
  rng = np.random.default_rng(31)
  owner = np.r_[np.repeat(np.arange(4), 5), np.full(10, -1)]
  values = rng.normal(size=(2, 4, owner.size))
  for kind, kw in (('fedmia', dict(outlier_filter='paper')), ('lira', {}), ('plain', {})):
    default = scores.round_scores(values, owner, 1, kind=kind, **kw)
    aligned = scores.round_scores(values, owner, 1, kind=kind, scoring='aligned', **kw)
    np.testing.assert_array_equal(default['scores'], aligned['scores'])
    np.testing.assert_array_equal(default['labels'], aligned['labels'])
  with pytest.raises(ValueError, match='^lira needs at least 2 non-target clients$'):
    scores.round_scores(values[:, :2], owner % 2, 1, kind='lira')
  with pytest.raises(ValueError, match=r'^lira_online_fixed needs in_values \(IN measurements'):
    scores.round_scores(values, owner, 1, kind='lira_online_fixed')
  with pytest.raises(ValueError, match=r"^scoring='public_code' needs an rng$"):
    scores.round_scores(values, owner, 1, kind='plain', scoring='public_code')
  with pytest.raises(ValueError, match=r"refused, use 'aligned' or 'public_code_2024'$"):
    scores.round_scores(values, owner, 1, kind='lira_online', scoring='public_code',
                        in_values=values[:, :2])
  assert default['labels'].dtype == np.int8
  # Recordings are float32; the statistics are computed in float64 all the same.
  v32 = values.astype(np.float32)
  for kind in ('lira', 'lira_fixed'):
    np.testing.assert_array_equal(
        scores.round_scores(v32, owner, 1, kind=kind)['scores'],
        scores.round_scores(v32.astype(np.float64), owner, 1, kind=kind)['scores'])
  np.testing.assert_array_equal(default['labels'], np.r_[np.ones(5), np.zeros(25)])
