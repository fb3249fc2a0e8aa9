"""Pinned scores of every passive attack of `scores.ATTACKS` on tiny hand-made recordings.

Each expected value is computed here from its definition with scalar arithmetic (FedMIA with two
shadows in closed form: mu = (a + b) / 2, sigma^2 = ((a - b) / 2)^2 + 1e-8; offline LiRA the
same on phi = log(p / (1 - p)), p = exp(-loss), with the unbiased variance (a - b)^2 / 2, or its
fixed variance pooled over the four queries; online LiRA with two IN models as IN, Eq. 4 in logs),
independently of the vectorised library code, and compared with `scores.pooled_round_scores` +
`scores.combine_rounds` and with the final scores `evaluate.evaluate` hands to
`score_metrics`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from fl_privacy.attacks.passive import evaluate
from fl_privacy.attacks.passive import scores

# R = 2 recorded rounds (training rounds 1 and 5), K = 3 clients, Q = 4 queries; query q is
# held by client q, query 3 is a test example.
OWNER = np.array([0, 1, 2, -1])
ROUNDS = np.array([0, 4])
# Pooled order of `scores.pooled_round_scores`: per target, its member, then the others.
ORDER = {0: [0, 1, 2, 3], 1: [1, 0, 2, 3], 2: [2, 0, 1, 3]}
LABELS = [1, 0, 0, 0] * 3
LOSS = np.array([
    [[0.20, 0.90, 0.70, 1.10],   # round 0, client 0
     [0.35, 0.30, 0.80, 1.00],   # client 1
     [0.50, 0.85, 0.40, 1.30]],  # client 2
    [[0.10, 0.95, 0.75, 1.20],   # round 1
     [0.70, 0.20, 0.90, 0.90],
     [0.55, 1.00, 0.25, 1.10]],
])
COS = np.array([
    [[0.30, 0.05, -0.02, 0.01],
     [0.02, 0.25, 0.04, -0.03],
     [-0.01, 0.06, 0.20, 0.00]],
    [[0.40, 0.03, 0.01, -0.02],
     [0.00, 0.35, 0.02, 0.03],
     [0.05, -0.04, 0.10, 0.02]],
])
DIFF = np.array([
    [[1.0, 0.2, 0.4, 0.1],
     [0.3, 0.9, 0.5, 0.2],
     [0.6, 0.1, 0.8, 0.3]],
    [[1.2, 0.5, 0.2, 0.4],
     [0.1, 0.7, 0.6, 0.3],
     [0.4, 0.3, 0.5, 0.2]],
])
GRAD_SQ = np.array([[1.0, 2.0, 0.5, 3.0],
                    [0.8, 1.5, 0.4, 2.5]])
# Online LiRA's IN measurements: the loss of each query under M = 2 server-built IN models.
LOSS_IN = np.array([
    [[0.15, 0.25, 0.30, 0.60],   # round 0, IN model 0
     [0.40, 0.10, 0.50, 0.90]],  # IN model 1
    [[0.05, 0.30, 0.20, 0.70],   # round 1
     [0.30, 0.15, 0.45, 1.00]],
])


def _margin(loss):
  """The logit margin log(p / (1 - p)), p = exp(-loss), in float64 (what a model with these
  losses records as `margin`)."""
  loss = np.asarray(loss, np.float64)
  return -loss - np.log(-np.expm1(-loss))


def _recording():
  return dict(loss=LOSS.copy(), cos=COS.copy(), diff=DIFF.copy(), grad_sq=GRAD_SQ.copy(),
              rounds=ROUNDS.copy(), loss_in=LOSS_IN.copy(), margin=_margin(LOSS),
              margin_in=_margin(LOSS_IN))


def _plain(measurement, t):
  """Round t's pooled scores of a single-round attack: the target's own value (higher =
  member), in the pooled order."""
  out = []
  for k in range(3):
    for q in ORDER[k]:
      if measurement == 'loss':
        out.append(-LOSS[t, k, q])
      elif measurement == 'grad_sq':
        out.append(-GRAD_SQ[t, q])  # not target-specific
      else:
        out.append({'cos': COS, 'diff': DIFF}[measurement][t, k, q])
  return out


def _two_shadow_phi(v, a, b):
  """FedMIA's Phi((v - mu) / sigma) with the two shadows a and b (population variance)."""
  return float(special.ndtr((v - (a + b) / 2) / math.sqrt(((a - b) / 2) ** 2 + 1e-8)))


def _phi(loss):
  """LiRA's logit confidence by its definition."""
  p = math.exp(-loss)
  return math.log(p / (1 - p))


def _lira(t, fixed):
  """Round t's pooled offline LiRA scores: each target against the other two clients' phi."""
  out = []
  for k in range(3):
    i, j = [c for c in range(3) if c != k]
    pairs = [(_phi(LOSS[t, i, q]), _phi(LOSS[t, j, q])) for q in range(4)]
    pooled = sum((a - b) ** 2 / 2 for a, b in pairs) / 4  # 4 queries, 1 dof each
    for q in ORDER[k]:
      a, b = pairs[q]
      var = (pooled if fixed else (a - b) ** 2 / 2) + 1e-8
      out.append(float(special.ndtr((_phi(LOSS[t, k, q]) - (a + b) / 2) / math.sqrt(var))))
  return out


def _log_normal(x, mu, var):
  return -0.5 * math.log(2 * math.pi * var) - (x - mu) ** 2 / (2 * var)


def _lira_online(t, fixed):
  """Round t's pooled online LiRA scores (LiRA's online likelihood ratio, in logs): IN the
  two IN models' phi, OUT the other two clients'; variances (a - b)^2 / 2, or the global
  sigma_in^2 pooled over the 4 queries' IN pairs and sigma_out^2 over their OUT pairs (4 dof
  each)."""
  out = []
  for k in range(3):
    i, j = [c for c in range(3) if c != k]
    outs = [(_phi(LOSS[t, i, q]), _phi(LOSS[t, j, q])) for q in range(4)]
    ins = [(_phi(LOSS_IN[t, 0, q]), _phi(LOSS_IN[t, 1, q])) for q in range(4)]
    pooled_out = sum((a - b) ** 2 / 2 for a, b in outs) / 4
    pooled_in = sum((a - b) ** 2 / 2 for a, b in ins) / 4
    for q in ORDER[k]:
      (a, b), (c, d) = outs[q], ins[q]
      v_out = (pooled_out if fixed else (a - b) ** 2 / 2) + 1e-8
      v_in = (pooled_in if fixed else (c - d) ** 2 / 2) + 1e-8
      x = _phi(LOSS[t, k, q])
      out.append(_log_normal(x, (c + d) / 2, v_in) - _log_normal(x, (a + b) / 2, v_out))
  return out


def _fedmia(values, t):
  """Round t's pooled FedMIA scores: each target against the other two clients."""
  out = []
  for k in range(3):
    i, j = [c for c in range(3) if c != k]
    for q in ORDER[k]:
      out.append(_two_shadow_phi(values[t, k, q], values[t, i, q], values[t, j, q]))
  return out


def _tpr_at_zero_fpr(s):
  """Members strictly above every non-member (the TPR@0.1% FPR of 9 non-members)."""
  s = np.asarray(s)
  lab = np.asarray(LABELS, bool)
  return float(np.mean(s[lab] > s[~lab].max()))


def _auc(s):
  """Mann-Whitney: P[member > non-member] + P[tie] / 2 over the 3 x 9 pairs."""
  pos = [v for v, y in zip(s, LABELS) if y]
  neg = [v for v, y in zip(s, LABELS) if not y]
  return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))


def _per_round(attack):
  """Expected pooled per-round scores [2, 12] of `attack` (without the filter suffix)."""
  base = attack.partition('@')[0]
  if base in ('fedmia_i', 'fedmia_ii'):
    values = -LOSS if base == 'fedmia_i' else COS
    return np.array([_fedmia(values, t) for t in range(2)])
  if base in ('lira_offline', 'lira_offline_fixed'):
    return np.array([_lira(t, base == 'lira_offline_fixed') for t in range(2)])
  if base in ('lira_online', 'lira_online_fixed'):
    return np.array([_lira_online(t, base == 'lira_online_fixed') for t in range(2)])
  return np.array([_plain(scores.MEASUREMENT[base], t) for t in range(2)])


def _expected_final(attack):
  """(final scores [12], 1-based round) as `evaluate.evaluate` defines them, by hand."""
  base = attack.partition('@')[0].removesuffix('_best_round')
  per_round = _per_round(attack)
  if attack.endswith('_best_round'):
    tprs = [_tpr_at_zero_fpr(per_round[t]) for t in range(2)]
    t = 0 if tprs[0] >= tprs[1] else 1  # first round on ties
    return per_round[t], int(ROUNDS[t]) + 1
  if base in scores.SINGLE:
    return per_round[1], int(ROUNDS[1]) + 1  # the last recorded round
  # Series, FedMIA, LiRA: the mean of the two rounds (Eqs. 5 and 12).
  return (per_round[0] + per_round[1]) / 2, int(ROUNDS[1]) + 1


# RMIA's population is the test rows: here one query, which as a candidate is left out of its
# own population, so RMIA cannot score this recording (pinned against its definition by a
# double loop in test_lira_rmia.py, and through `evaluate` there too).
NOT_HERE = ('rmia',)
ALL = tuple(a for a in scores.ATTACKS if a not in NOT_HERE) + (
    'fedmia_i@paper', 'fedmia_i@none', 'fedmia_ii@paper', 'fedmia_ii@none',
    'fedmia_ii@leave_one_out')


def test_the_list_covers_every_attack():
  assert set(scores.ATTACKS) <= {a.partition('@')[0] for a in ALL} | set(NOT_HERE)
  with pytest.raises(ValueError, match='population'):
    scores.pooled_round_scores(_recording(), OWNER, 'rmia')


def test_pooled_queries_name_the_query_of_every_entry():
  np.testing.assert_array_equal(scores.pooled_queries(OWNER, 3),
                                ORDER[0] + ORDER[1] + ORDER[2])


def test_some_literal_values():
  # FedMIA-I, target 0, query 0, round 0: v = -0.20, shadows -0.35 and -0.50: mu = -0.425,
  # sigma^2 = 0.075^2 + 1e-8, z = 0.225 / 0.075 = 3 (times 1 - 9e-7 from the floor).
  got = scores.pooled_round_scores(_recording(), OWNER, 'fedmia_i')['scores']
  assert got[0, 0] == pytest.approx(special.ndtr(0.225 / math.sqrt(0.075 ** 2 + 1e-8)),
                                    rel=1e-12)
  assert got[0, 0] == pytest.approx(special.ndtr(3.0), rel=1e-7)
  # Target 1, query 1 (its member), round 1: v = -0.20, shadows -0.95, -1.00: z = 0.775 / 0.025.
  assert got[1, 4] == pytest.approx(special.ndtr(31.0), abs=1e-12)
  # Target 2, query 3 (test), round 0: v = -1.30, shadows -1.10, -1.00: z = -0.25 / 0.05 = -5.
  assert got[0, 11] == pytest.approx(special.ndtr(-0.25 / math.sqrt(0.05 ** 2 + 1e-8)),
                                     rel=1e-9)
  # FedMIA-II, target 0, query 3, round 1: v = -0.02, shadows 0.03, 0.02: z = -0.045 / 0.005.
  got = scores.pooled_round_scores(_recording(), OWNER, 'fedmia_ii')['scores']
  assert got[1, 3] == pytest.approx(special.ndtr(-0.045 / math.sqrt(0.005 ** 2 + 1e-8)),
                                    rel=1e-9)
  # Loss-Series, target 0, query 1: -(0.90 + 0.95) / 2.
  final = scores.combine_rounds(
      scores.pooled_round_scores(_recording(), OWNER, 'loss_series')['scores'], 'loss_series')
  assert final[1] == pytest.approx(-0.925, abs=1e-15)
  # Avg-Cosine, target 2, query 2 (its member): (0.20 + 0.10) / 2.
  final = scores.combine_rounds(
      scores.pooled_round_scores(_recording(), OWNER, 'avg_cosine')['scores'], 'avg_cosine')
  assert final[8] == pytest.approx(0.15, abs=1e-15)


@pytest.mark.parametrize('attack', ALL)
def test_pooled_round_scores_and_combine_rounds(attack):
  pooled = scores.pooled_round_scores(_recording(), OWNER, attack)
  np.testing.assert_array_equal(pooled['labels'], LABELS)
  np.testing.assert_array_equal(pooled['target'], np.repeat([0, 1, 2], 4))
  np.testing.assert_allclose(pooled['scores'], _per_round(attack), rtol=1e-9, atol=1e-15)
  want, _ = _expected_final(attack)
  base = attack.partition('@')[0]
  if base in scores.MULTI_ROUND:
    final = scores.combine_rounds(pooled['scores'], attack)
    np.testing.assert_allclose(final, want, rtol=1e-9, atol=1e-15)
    # The first round alone (Fig. 5a's first point).
    np.testing.assert_allclose(scores.combine_rounds(pooled['scores'], attack, upto=1),
                               _per_round(attack)[0], rtol=1e-9, atol=1e-15)
  elif base in scores.SINGLE:
    np.testing.assert_allclose(scores.combine_rounds(pooled['scores'], attack, single_index=1),
                               want, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize('attack', ALL)
def test_evaluate_scores_what_the_definition_says(attack, monkeypatch):
  seen = {}
  score_metrics = evaluate.score_metrics

  def spy(final, labels, *args, **kwargs):
    seen['final'], seen['labels'] = np.array(final), np.array(labels)
    return score_metrics(final, labels, *args, **kwargs)

  monkeypatch.setattr(evaluate, 'score_metrics', spy)
  m = evaluate.evaluate(_recording(), OWNER, attack)
  want, round_ = _expected_final(attack)
  np.testing.assert_allclose(seen['final'], want, rtol=1e-9, atol=1e-15)
  np.testing.assert_array_equal(seen['labels'], LABELS)
  assert m['round'] == round_
  assert m['auc'] == pytest.approx(_auc(want), abs=1e-12)
  assert m['n_pos'] == 3 and m['n_neg'] == 9
  # Two shadows: no filter can remove one (leave-one-out needs three, 'paper' eleven).
  if attack.startswith('fedmia'):
    assert m['filter_removed_fraction'] == 0.0
  else:
    assert math.isnan(m['filter_removed_fraction'])


def test_best_rounds_are_the_ones_chosen_by_hand():
  # blackbox_loss: round 0's largest non-member is -0.35 (target 1, query 0), above the member
  # -0.40 of target 2: TPR 2/3; round 1's is -0.55, below all members: TPR 1 -> round 5.
  assert evaluate.evaluate(_recording(), OWNER, 'blackbox_loss_best_round')['round'] == 5
  # grad_cosine: both rounds separate all three members (TPR 1): the first one, round 1.
  assert evaluate.evaluate(_recording(), OWNER, 'grad_cosine_best_round')['round'] == 1
  # grad_norm is not target-specific: every member's value is also a non-member's, TPR 0 in
  # both rounds -> round 1.
  assert evaluate.evaluate(_recording(), OWNER, 'grad_norm_best_round')['round'] == 1


def test_rounds_curve_matches_the_running_mean():
  for attack in ('loss_series', 'fedmia_ii', 'grad_diff'):
    curve = evaluate.rounds_curve(_recording(), OWNER, attack)
    per_round = _per_round(attack)
    assert curve['round'] == [1, 5]
    first = per_round[0]
    last = (per_round[0] + per_round[1]) / 2 if attack != 'grad_diff' else per_round[1]
    assert curve['auc'] == pytest.approx([_auc(first), _auc(last)], abs=1e-12)


# A second recording with K = 5 clients (4 shadows), one round, where the leave-one-out
# filter removes the owner of a non-member query: client q holds query q and measures cos 0.5
# on it; the other four clients measure 0.0, 0.1, -0.1, 0.2 (in client order).
FILTER_COS = np.empty((1, 5, 5))
for _q in range(5):
  FILTER_COS[0, :, _q] = np.insert([0.0, 0.1, -0.1, 0.2], _q, 0.5)
FILTER_OWNER = np.arange(5)


def _filter_recording():
  # FedMIA-I reads -loss = FILTER_COS - 1 (a loss from the margin must be positive): a shift
  # that moves neither the filter's decisions nor Phi's z-scores.
  return dict(loss=1.0 - FILTER_COS, margin=_margin(1.0 - FILTER_COS), cos=FILTER_COS.copy(),
              diff=FILTER_COS.copy(), grad_sq=np.ones((1, 5)), rounds=np.array([9]))


def _gauss_phi(v, kept):
  mu = sum(kept) / len(kept)
  var = sum((x - mu) ** 2 for x in kept) / len(kept) + 1e-8
  return float(special.ndtr((v - mu) / math.sqrt(var)))


@pytest.mark.parametrize('filt', ['leave_one_out', 'paper', 'none'])
def test_fedmia_filters_pinned(filt):
  # Target k, non-member query q != k: the shadows are the owner's 0.5 and three of the small
  # values. Leave-one-out: the owner's others are {0.1, -0.1, 0.2} (mean 0.067, sd 0.125,
  # z = 3.47), {0, -0.1, 0.2} (z = 3.74), {0, 0.1, 0.2} (z = 4.90) or {0, 0.1, -0.1}
  # (z = 6.12): above 3, so the owner goes; a small value's others include 0.5 (mean >= 0.13,
  # sd >= 0.2), so it stays. 'paper' cannot fire with four shadows (max z = sqrt(3)).
  # Target k on its own query: four small values; none is 3 sd above the other three.
  want = []
  for k in range(5):
    for q in [k] + [c for c in range(5) if c != k]:
      col = list(FILTER_COS[0, :, q])
      shadows = [col[j] for j in range(5) if j != k]
      if filt == 'leave_one_out' and q != k:
        shadows = [col[j] for j in range(5) if j not in (k, q)]
      want.append(_gauss_phi(col[k], shadows))
  for attack in (f'fedmia_ii@{filt}', f'fedmia_i@{filt}'):
    pooled = scores.pooled_round_scores(_filter_recording(), FILTER_OWNER, attack)
    np.testing.assert_allclose(pooled['scores'][0], want, rtol=1e-9, atol=1e-15)
    m = evaluate.evaluate(_filter_recording(), FILTER_OWNER, attack)
    # 5 targets x 5 columns x 4 shadows examined; leave-one-out removes the 4 owners of each
    # target's non-member queries, every time.
    assert m['filter_removed_fraction'] == (20 / 100 if filt == 'leave_one_out' else 0.0)
    assert m['filter_owner_removed_fraction'] == (1.0 if filt == 'leave_one_out' else 0.0)


# ----------------------------------------------------------------------------------------------
# The filter's counts over rounds and targets, two-client recordings, display names (from a
# mutation run of scores.py).


def _outlier_recording():
  # K = 4, Q = 5 (one query per client, one test query), R = 2. Every cos is 0 except client 1
  # on its own query and client 2 on the test query, 100 in both rounds: the leave-one-out
  # filter removes exactly those shadows (the other two shadows are equal, so any value above
  # them is out): client 1's for targets 0, 2, 3, client 2's for targets 0, 1, 3.
  cos = np.zeros((2, 4, 5))
  cos[:, 1, 1] = 100.0
  cos[:, 2, 4] = 100.0
  zeros = np.zeros_like(cos)
  rec = dict(cos=cos, loss=zeros + 1.0, diff=zeros, grad_sq=np.zeros((2, 5)),
             rounds=np.arange(2))
  return rec, np.array([0, 1, 2, 3, -1])


def test_filter_counts_add_up_over_rounds_and_targets():
  rec, owner = _outlier_recording()
  # The paper's filter (the default) cannot fire with three shadows (max z = sqrt(2)).
  assert evaluate.evaluate(rec, owner, 'fedmia_ii')['filter_removed_fraction'] == 0.0
  m = evaluate.evaluate(rec, owner, 'fedmia_ii@leave_one_out', scoring='aligned')
  # removed: 2 x 3 targets x 2 rounds; examined: 4 targets x 2 rounds x 3 shadows x 5 queries.
  assert m['filter_removed_fraction'] == pytest.approx(12 / 120)
  # owner removed: client 1's 6 only (the test query has no owner); owner examined: 4 targets
  # x 2 rounds x 3 owned non-members (client 0's query counts: it is owned too).
  assert m['filter_owner_removed_fraction'] == pytest.approx(6 / 24)
  public = evaluate.evaluate(rec, owner, 'fedmia_ii@leave_one_out', scoring='public_code',
                             rng=np.random.default_rng(0))
  assert math.isnan(public['filter_owner_removed_fraction'])  # positions are not queries there
  assert 0 < public['filter_removed_fraction'] <= 2 * 12 / 120


def test_two_clients_score_each_target_from_its_own_row():
  loss = np.array([[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]])  # R = 1, K = 2, Q = 3
  rec = dict(loss=loss, margin=_margin(loss), cos=np.zeros_like(loss),
             diff=np.zeros_like(loss), grad_sq=np.zeros((1, 3)), rounds=np.arange(1))
  owner = np.array([0, 1, -1])
  out = scores.pooled_round_scores(rec, owner, 'blackbox_loss')
  # target 0: member q0, non-members q1, q2 from row 0; target 1: member q1, then q0, q2, row 1.
  np.testing.assert_allclose(out['scores'][0], [-1.0, -2.0, -3.0, -5.0, -4.0, -6.0],
                             rtol=1e-12)


def test_display_names():
  assert scores.label('blackbox_loss') == 'Blackbox-Loss'
  assert scores.label('fedmia_ii') == 'FedMIA-II (paper filter)'
  assert scores.label('fedmia_ii@leave_one_out') == 'FedMIA-II (leave-one-out filter)'
  assert scores.label('fedmia_i@paper') == 'FedMIA-I (paper filter)'
  assert scores.label('fedmia_i', 'none') == 'FedMIA-I (none filter)'
  assert scores.label('grad_norm_best_round') == 'Grad-Norm (best round, optimistic)'
  assert scores.label('lira_offline') == 'LiRA (offline)'


def test_recording_metrics_report_the_generalisation_gap_with_counts():
  rec = dict(_recording(), owner=OWNER, test_correct=np.array([5, 7]), num_test=np.array(10),
             train_seconds=np.array(1.5))
  common = dict(scoring='aligned', single_round=5, default_filter='leave_one_out',
                rng=np.random.default_rng(0), num_resamples=5)
  bare = evaluate.recording_metrics(rec, 'loss_series', **common)
  assert bare['test_accuracy'] == pytest.approx(0.7) and bare['n_test'] == 10
  assert math.isnan(bare['train_accuracy']) and math.isnan(bare['generalisation_gap'])
  rec.update(member_correct=np.array(9), num_member=np.array(12))
  m = evaluate.recording_metrics(rec, 'loss_series', **common)
  assert m['train_accuracy'] == pytest.approx(0.75)
  assert m['generalisation_gap'] == pytest.approx(0.75 - 0.7)
  assert m['train_accuracy_ci_low'] < 0.75 < m['train_accuracy_ci_high']
  assert m['train_seconds'] == 1.5 and m['auc'] == bare['auc']
  # Last round: client k's test-row loss LOSS[1, k, 3] minus its own row's LOSS[1, k, k] (one
  # row each, so the medians are those values).
  expected = np.mean([1.20 - 0.10, 0.90 - 0.20, 1.10 - 0.25])
  assert m['upload_loss_gap'] == pytest.approx(expected)
  assert math.isnan(evaluate.upload_loss_gap(dict(rec, owner=np.array([0, 1, 2, 2]))))
