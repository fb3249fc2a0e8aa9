"""The analysis of a recorded user-app audit (`audits.user_rounds`, `audits.user_app`) on
made-up recordings: every field by hand against the libraries it calls (no Flower run)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from flwr.serverapp import RdpAccountant
from flwr.supercore.privacy_accounting import GaussianPrivacyEvent, NeighboringRelation
from flwr.supercore.privacy_accounting import PrivacyConfig, SamplingMethod

from fl_privacy.eval import auditing
from fl_privacy.flower.audits import canary_stats
from fl_privacy.flower.audits import user_app
from fl_privacy.flower.audits import user_rounds
from fl_privacy.flower.inapp import fl_privacy_canaries as inapp
from fl_privacy.flower.inapp import fl_privacy_canary_strategy as recorder

SEED, K, NULL, DELTA = 11, 32, 12, 1e-5
COINS = np.asarray([inapp.canary_coin(SEED, i) for i in range(K)])
N_IN = int(COINS.sum())


def _rounds(t=2, *, part=None, signal=3.0, uploads=True, num_messages=None, replied=None):
  """T rounds: before 0, after = the included canaries' signal plus noise on every direction
  (null too), uploads the same signal plus other noise."""
  rng = np.random.default_rng(5)
  part = np.ones((t, K), bool) if part is None else part
  out = []
  for r in range(t):
    after = rng.normal(size=K + NULL)
    after[:K] += signal * COINS * part[r]
    out.append(recorder.CanaryRound(
        server_round=r + 1, sampled=part[r].copy(),
        replied=part[r].copy() if replied is None else replied[r],
        num_messages=(num_messages or [20] * t)[r], before=np.zeros(K + NULL), after=after,
        uploads=np.where(part[r], signal * COINS + rng.normal(size=K), np.nan)
        if uploads else None))
  return out


def _meta(**change):
  meta = dict(format=recorder.FORMAT, format_version=1, seed=SEED, num_canaries=K,
              num_null=NULL, canary_norm=2.0, clip_norm=1.0, idle=1e-6, dimension=100,
              canary_nodes={str(100 + i): i for i in range(K)},
              threats=['all_iterates', 'last_iterate', 'uploads'], gaussian=True,
              delta=DELTA, confidence=0.95, stated_epsilon=None, flower=None)
  meta.update(change)
  return meta


def _accountant(sampling=SamplingMethod.NO_AMPLIFICATION,
                relation=NeighboringRelation.ADD_OR_REMOVE_ONE, n=40):
  # Three RDP orders: dp-accounting's sampled events are slow over its default 60-odd.
  acc = RdpAccountant(PrivacyConfig(target_delta=DELTA, population_size=n,
                                    neighboring_relation=relation, sampling_method=sampling),
                      orders=(2.0, 8.0, 32.0))
  acc.compose(GaussianPrivacyEvent(1.1, 10, n), 3)
  acc.compose(GaussianPrivacyEvent(0.9, 10, n), 1)
  return acc


def _flower(acc, delta=DELTA):
  spent = acc.get_privacy_spent(delta)
  return dict(stated_epsilon=spent.epsilon, stated_delta=delta,
              stated_epsilon_source='flwr privacy_spent() of X (rdp, 4 releases)',
              stated_relation='add-or-remove-one', stated_sampling='no-amplification',
              wrapper='X', wrapper_settings={}, accountant_state=acc.state_dict())


def test_every_field_of_the_audit_by_hand():
  """Each threat's bounds are jax-privacy's on the statistic by hand at 1 - 0.05 / 6, the fit
  is `gaussian_fit` drawing from SeedSequence([seed, 2**32 - 1, 2]), the verdict the largest
  counted bound against the claim."""
  assert 10 < N_IN < 22
  rounds = _rounds()
  stated = dict(stated_epsilon=0.2, stated_delta=DELTA, stated_epsilon_source='given')
  m = user_rounds.audit_rounds(rounds, seed=SEED, num_canaries=K, delta=DELTA,
                               confidence=0.95, threats=user_rounds.THREATS, stated=stated)
  each = 1 - 0.05 / 6
  after = np.stack([r.after for r in rounds])
  ups = np.stack([r.uploads for r in rounds])
  stats = {'all_iterates': (after[:, :K].sum(0), after[:, K:].sum(0)),
           'last_iterate': (after[-1, :K], after[-1, K:]),
           'uploads': (ups.sum(0), None)}
  rng = np.random.default_rng(np.random.SeedSequence([SEED, 2**32 - 1, 2]))
  for threat, (s, null) in stats.items():
    a = auditing.audit_scores(s[COINS], s[~COINS], delta=DELTA, confidence=each)
    for key in ('epsilon_one_run', 'epsilon_one_run_fdp', 'n_in', 'n_out'):
      assert m[f'{threat}/{key}'] == a[key], (threat, key)
    null = s[~COINS] if null is None else null
    fit = canary_stats.gaussian_fit(s[COINS], null, DELTA, confidence=0.95, rng=rng)
    for key, value in fit.items():
      assert m[f'{threat}/{key}'] == value, (threat, key)
    assert m[f'{threat}/n_null'] == len(null) and m[f'{threat}/fit_n_in'] == N_IN
    assert m[f'{threat}/adversary'] == user_rounds.READERS[threat]
  counted = [f'{t}/{b}' for t in stats for b in ('epsilon_one_run', 'epsilon_one_run_fdp')]
  assert m['counted_bounds'] == ','.join(counted)
  assert m['best_bound'] == max(m[c] for c in counted) > 0.2
  assert m['privacy_violation'] == 1.0 and m['stated_epsilon'] == 0.2
  assert m['max_certifiable'] == user_rounds.max_certifiable(N_IN, K - N_IN, delta=DELTA,
                                                             confidence=0.95, num_counted=6)
  assert m['bound_confidence'] == each and m['verdict_confidence'] == m['confidence'] == 0.95
  assert {k: m[k] for k in ('unit', 'relation', 'adversary', 'sampling', 'num_canaries',
                            'num_rounds', 'num_null', 'seed', 'delta', 'n_in', 'n_out',
                            'threshold_strategy', 'rounds_per_canary_min',
                            'rounds_per_canary_median', 'rounds_per_canary_max',
                            'canaries_never_sampled', 'lost_canary_replies')} == dict(
      unit='client', relation='zero_out', adversary='server_knows_the_sample',
      sampling='none', num_canaries=K, num_rounds=2, num_null=NULL, seed=SEED, delta=DELTA,
      n_in=N_IN, n_out=K - N_IN, threshold_strategy='split', rounds_per_canary_min=2,
      rounds_per_canary_median=2.0, rounds_per_canary_max=2, canaries_never_sampled=0,
      lost_canary_replies=0)
  # The claim above the best bound: no violation; no claim: NaN, named 'none'.
  m = user_rounds.audit_rounds(rounds, seed=SEED, num_canaries=K, delta=DELTA,
                               confidence=0.95, threats=('last_iterate',), gaussian=False,
                               stated={**stated, 'stated_epsilon': 100.0})
  assert m['counted_bounds'] == 'last_iterate/epsilon_one_run'
  assert m['best_bound'] == m['last_iterate/epsilon_one_run'] and m['privacy_violation'] == 0
  assert 'all_iterates/epsilon_one_run' not in m
  m = user_rounds.audit_rounds(rounds, seed=SEED, num_canaries=K, delta=DELTA,
                               confidence=0.9, threats=('last_iterate', 'all_iterates'))
  assert math.isnan(m['privacy_violation']) and m['stated_epsilon_source'] == 'none'
  assert m['bound_confidence'] == pytest.approx(1 - 0.1 / 4)
  assert m['counted_bounds'].startswith('all_iterates/')


def test_client_sampling_is_scored_over_each_canarys_own_rounds_and_labelled():
  part = np.ones((3, K), bool)
  part[0, :5] = False
  part[:, 15] = False  # never sampled: abstains
  replied = part.copy()
  replied[2, 6] = False
  rounds = _rounds(3, part=part, replied=replied)
  m = user_rounds.audit_rounds(rounds, seed=SEED, num_canaries=K, delta=DELTA,
                               confidence=0.95, threats=user_rounds.THREATS)
  assert m['sampling'] == 'fixed_size_without_replacement'
  assert (m['rounds_per_canary_median'], m['n_in']) == (3.0, N_IN)
  assert (m['rounds_per_canary_min'], m['rounds_per_canary_max']) == (0, 3)
  assert m['canaries_never_sampled'] == 1 and m['lost_canary_replies'] == 1
  scores, null, _ = user_rounds.statistics(rounds, K, ('all_iterates',))
  assert scores['all_iterates'][15] == 0.0 and null['all_iterates'].shape == (NULL,)
  assert m['all_iterates/fit_n_in'] == N_IN - int(COINS[15])
  rounds = _rounds(3, part=part, num_messages=[20, 21, 20])
  m = user_rounds.audit_rounds(rounds, seed=SEED, num_canaries=K, delta=DELTA,
                               confidence=0.95, threats=('all_iterates',))
  assert m['sampling'] == 'server_chosen_varying_size'


def test_what_the_audit_refuses():
  with pytest.raises(ValueError, match='no recorded round'):
    user_rounds.audit_rounds([], seed=SEED, num_canaries=K, delta=DELTA, confidence=0.95)
  with pytest.raises(ValueError, match="'uploads' threat needs the canaries' uploads"):
    user_rounds.audit_rounds(_rounds(uploads=False), seed=SEED, num_canaries=K, delta=DELTA,
                             confidence=0.95, threats=('uploads',))
  lopsided = next(s for s in range(100) if sum(inapp.canary_coin(s, i) for i in range(4)) == 1)
  with pytest.raises(ValueError, match='1 of 4 canaries included: the one-run bounds need'):
    user_rounds.audit_rounds(_rounds()[:1], seed=lopsided, num_canaries=4, delta=DELTA,
                             confidence=0.95)
  assert user_rounds.max_certifiable(1, 8, delta=DELTA, confidence=0.95, num_counted=4) == 0
  direct = auditing.audit_scores(np.ones(32), np.zeros(32), delta=DELTA, confidence=1 - 0.05 / 2,
                                 fdp=False)
  assert user_rounds.max_certifiable(32, 32, delta=DELTA, confidence=0.95, num_counted=2,
                                     gaussian=False) == direct['epsilon_one_run']
  assert user_rounds.counted_bounds(('uploads',), gaussian=False) == (
      'uploads/epsilon_one_run',)


@pytest.mark.parametrize('sampling', list(SamplingMethod))
def test_flowers_claim_is_recomputed_from_its_ledger_with_dp_accounting(sampling):
  for relation in NeighboringRelation:
    try:
      acc = _accountant(sampling, relation)
    except ValueError:  # Flower refuses some (sampling, relation) pairs
      continue
    got = user_app.dp_accounting_epsilon(acc.state_dict(), 1e-6)
    assert got == pytest.approx(acc.get_epsilon(1e-6), rel=1e-12), (sampling, relation)
  state = _accountant().state_dict()
  state['config']['sampling_method'] = 'shuffled'
  with pytest.raises(ValueError, match="sampling_method: 'shuffled' is none of"):
    user_app.dp_accounting_epsilon(state, DELTA)


def test_the_claim_and_the_delta_tested():
  acc = _accountant()
  flower = _flower(acc)
  out = user_app.stated(_meta(flower=flower), DELTA)
  assert {k: out[k] for k in user_app._STATED} == {k: flower[k] for k in user_app._STATED}
  assert out['flower_privacy_spent_epsilon'] == flower['stated_epsilon']
  assert out['dp_accounting_epsilon'] == pytest.approx(flower['stated_epsilon'], rel=1e-12)
  assert 'wrapper' not in out and 'accountant_state' not in out
  given = user_app.stated(_meta(flower=flower, stated_epsilon=2.0), DELTA)
  assert (given['stated_epsilon'], given['stated_delta'], given['stated_epsilon_source']) == (
      2.0, DELTA, 'given')
  assert given['flower_privacy_spent_epsilon'] == flower['stated_epsilon']
  later = user_app.stated(_meta(stated_epsilon=2.0), DELTA, stated_epsilon=0.0)
  assert later == dict(stated_epsilon=0.0, stated_delta=DELTA, stated_epsilon_source='given')
  none = user_app.stated(_meta(), DELTA)
  assert math.isnan(none['stated_epsilon']) and none['stated_epsilon_source'] == 'none'
  assert set(none) == {'stated_epsilon', 'stated_delta', 'stated_epsilon_source'}
  with pytest.raises(ValueError, match=r'delta: Flower states its epsilon at delta 1e-05, '
                     r'the audit runs at 0.001: give --delta=1e-05'):
    user_app.stated(_meta(flower=flower), 1e-3)
  no_ledger = user_app.stated(_meta(flower={**flower, 'accountant_state': None}), DELTA)
  assert 'dp_accounting_epsilon' not in no_ledger
  # The delta: given, else recorded, else Flower's; a given one that differs is refused.
  assert user_app._delta(_meta(), None) == DELTA
  assert user_app._delta(_meta(), DELTA) == DELTA
  assert user_app._delta(_meta(delta=None, flower=_flower(acc, 1e-6)), None) == 1e-6
  assert user_app._delta(_meta(delta=None), 1e-7) == 1e-7
  with pytest.raises(ValueError, match='delta: the recording fixed delta=1e-05 before the '
                     'run; --delta=0.001 differs'):
    user_app._delta(_meta(), 1e-3)
  with pytest.raises(ValueError, match='delta: neither the recording nor Flower states one'):
    user_app._delta(_meta(delta=None), None)
  with pytest.raises(ValueError, match=r'delta: must be in \(0, 1\) \(got 1.5\)'):
    user_app._delta(_meta(delta=None), 1.5)


def test_a_recording_the_audit_cannot_take_names_the_field():
  rounds = _rounds()
  bad = [(dict(seed=-1), 'seed: an integer >= 0'), (dict(seed=True), 'seed: '),
         (dict(seed='1'), 'seed: '),
         (dict(canary_nodes={'1': 0, '2': 1, '3': 2}), '3 canary nodes'),
         (dict(num_canaries=17), '32 canary nodes, 17 expected'),
         (dict(threats=[]), 'threats: distinct names'),
         (dict(threats=['all_iterates', 'other']), 'threats: '),
         (dict(confidence=0.5), r'confidence: must be in \(0.5, 1\)'),
         (dict(confidence=None), 'confidence: '), (dict(gaussian=1), 'gaussian: true or false')]
  for change, message in bad:
    with pytest.raises(ValueError, match=message):
      user_app.audit_recording(_meta(**change), rounds)
  with pytest.raises(ValueError, match='server_round: the recording holds no training round'):
    user_app.audit_recording(_meta(), [])
  with pytest.raises(ValueError, match='stated_epsilon: must be >= 0'):
    user_app.audit_recording(_meta(), rounds, stated_epsilon=-1.0)


def test_the_command_writes_the_audit_and_its_table(tmp_path, capsys):
  flower = _flower(_accountant())
  folder = tmp_path / 'rec'
  folder.mkdir()
  meta = _meta(flower=flower, delta=None, gaussian=False,
               threats=['all_iterates', 'uploads'])
  rounds = _rounds()
  recorder.save_rounds(folder / recorder.ROUNDS_FILE, rounds, meta)
  m = user_app.audit_recording(meta, rounds)
  assert m['delta'] == DELTA and m['counted_bounds'].count('/') == 2
  assert (m['canary_norm'], m['clip_norm'], m['dimension']) == (2.0, 1.0, 100)
  assert user_app.main([str(folder)]) == 0
  printed = capsys.readouterr().out
  saved = json.loads((folder / user_app.RESULTS).read_text())
  assert set(saved) == set(m)
  for key, value in m.items():
    if isinstance(value, float) and math.isnan(value):
      assert saved[key] is None, key
    else:
      assert saved[key] == value, key
  table = (folder / user_app.TABLE).read_text()
  assert printed.startswith(table) and printed.endswith(str(folder / user_app.RESULTS) + '\n')
  rows = table.splitlines()
  assert rows[0].startswith('| threat | reader |') and len(
      [r for r in rows if r.startswith('| all_iterates |')]) == 1
  assert f'{m["best_bound"]:.3g}' in table and 'dp-accounting from its ledger' in table
  assert f'stated epsilon {m["stated_epsilon"]:.3g} at delta 1e-05' in table
  assert user_app.main([str(folder / recorder.ROUNDS_FILE), '--stated_epsilon=0.25',
                        f'--workdir={tmp_path / "w"}']) == 0
  assert json.loads((tmp_path / 'w' / user_app.RESULTS).read_text())['stated_epsilon'] == 0.25
  capsys.readouterr()
  (tmp_path / 'file').write_text('x')
  for argv, field in (([str(folder), f'--workdir={tmp_path / "file"}'], 'workdir: '),
                      ([str(folder), '--nope=1'], 'unrecognized arguments'),
                      ([], 'the following arguments are required'),
                      ([str(tmp_path / 'file')], 'file: not a readable .npz')):
    assert user_app.main(argv) == 2, argv
    err = capsys.readouterr().err
    assert err.startswith('user_app: ') and field in err and err.count('\n') == 1, err
