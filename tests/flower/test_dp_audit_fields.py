"""`flower.dp_audit`'s fields by hand, without Flower deployments (written from the survivors of
its mutation run): the declaration and stated epsilon the tables print, the params a point
records, the adaptive wrappers' noise and clip arguments, and what `audit` hands on and
records."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from flwr.supercore import differential_privacy as flwr_dp

from fl_privacy.flower.audits import dp_games
from fl_privacy.flower.audits import dp_setting

KEY = jax.random.key(5)


def _setting(wrapper, **kw):
  return dp_setting.Setting(f'{wrapper}_x', wrapper, **kw)


@pytest.mark.parametrize('wrapper', dp_setting.WRAPPERS)
def test_declaration_fields(wrapper):
  d = dp_setting.declaration(_setting(wrapper))
  assert (d.mechanism, d.unit, d.relation, d.adversary, d.sampling) == (
      f'flower_{wrapper}', 'client', 'add_remove', dp_setting.ADVERSARY[wrapper], 'none')
  assert (d.sensitivity, d.compositions, d.sampling_rate) == (1.0, 1, 1.0)
  assert d.note == ('Flower LocalDpMod, one upload' if wrapper == 'local_dp' else
                    'Flower central DP, one round, no sampling amplification')


def test_stated_epsilon_value_and_source_per_wrapper():
  for wrapper, source in (('server_fixed', 'flwr RdpAccountant'),
                          ('client_fixed', 'flwr RdpAccountant'),
                          ('server_adaptive', 'flwr RdpAccountant at z (Andrew et al.)'),
                          ('client_adaptive', 'flwr RdpAccountant at z (Andrew et al.)')):
    s = _setting(wrapper, noise_multiplier=1.3, num_sampled_clients=7, delta=1e-4)
    assert dp_setting.stated_epsilon(s) == (
        pytest.approx(dp_setting.flower_rdp_epsilon(1.3, 7, 1e-4)), source)
  assert dp_setting.stated_epsilon(_setting('local_dp', epsilon=2.5)) == (
      2.5, 'LocalDpMod epsilon argument')


def test_params_record_only_the_fields_the_wrapper_reads():
  common = dict(clipping_norm=0.5, noise_multiplier=1.5, num_sampled_clients=6, sensitivity=2.0,
                epsilon=3.0, delta=1e-4, target_clipped_quantile=0.3, clip_norm_lr=0.1)
  fixed = _setting('server_fixed', **common).params()
  assert fixed == {'setting': 'server_fixed_x', 'wrapper': 'server_fixed', 'clipping_norm': 0.5,
                   'delta': 1e-4, 'noise_multiplier': 1.5, 'num_sampled_clients': 6}
  adaptive = _setting('client_adaptive', clipped_count_stddev=2, **common).params()
  assert adaptive == {'setting': 'client_adaptive_x', 'wrapper': 'client_adaptive',
                      'clipping_norm': 0.5, 'delta': 1e-4, 'noise_multiplier': 1.5,
                      'num_sampled_clients': 6, 'target_clipped_quantile': 0.3,
                      'clip_norm_lr': 0.1, 'clipped_count_stddev': 2.0}
  assert type(adaptive['clipped_count_stddev']) is float
  assert _setting('server_adaptive', **common).params()['clipped_count_stddev'] is None
  local = _setting('local_dp', **common).params()
  assert local == {'setting': 'local_dp_x', 'wrapper': 'local_dp', 'clipping_norm': 0.5,
                   'delta': 1e-4, 'sensitivity': 2.0, 'epsilon': 3.0}
  assert [type(v) for v in local.values()] == [str, str, float, float, float, float]
  assert type(_setting('server_fixed', num_sampled_clients=6.0).params()[
      'num_sampled_clients']) is int


def test_adaptive_noise_passes_the_count_noise_it_is_given():
  s = _setting('server_adaptive', noise_multiplier=0.5, num_sampled_clients=10,
               clipped_count_stddev=3.0)
  want = flwr_dp.compute_adaptive_noise_params(0.5, 10, 3.0)
  assert dp_setting.adaptive_noise(s) == pytest.approx(want)
  assert dp_setting.adaptive_noise(s) != pytest.approx(
      dp_setting.adaptive_noise(_setting('server_adaptive', noise_multiplier=0.5,
                                         num_sampled_clients=10)))


def test_clip_after_starts_from_the_clip_given():
  s = _setting('server_adaptive', clipping_norm=1.0, clip_norm_lr=0.2,
               target_clipped_quantile=0.5)
  assert dp_setting.clip_after(s, 1, 4, clip_norm=3.0) == pytest.approx(
      3.0 * math.exp(-0.2 * (0.25 - 0.5)))
  assert dp_setting.clip_after(s, 1, 4) == pytest.approx(math.exp(-0.2 * (0.25 - 0.5)))


def test_game_counts_an_update_at_exactly_the_clip_as_not_clipped():
  # Flower 1.42's norm bit is `scaling_factor < 1` (supercore/differential_privacy.py 94):
  # an update of norm exactly C is not clipped.
  s = _setting('server_adaptive', clipping_norm=1.0, num_sampled_clients=3)
  game = dp_games.Game(s, np.zeros(4, np.float32), np.array([2.0, 0, 0, 0]),
                       np.array([[0, 1.0, 0, 0], [0, 0, 0.5, 0]]))
  assert game.clip_after(True) == pytest.approx(dp_setting.clip_after(s, 1, 3))
  assert game.clip_after(False) == pytest.approx(dp_setting.clip_after(s, 0, 2))


@pytest.mark.parametrize('kw', [{}, {'dimension': 5, 'canary_norm': 3.0}])
def test_audit_hands_its_settings_on_and_records_them(monkeypatch, kw):
  s = _setting('server_fixed', clipping_norm=0.5, noise_multiplier=2.0, num_sampled_clients=4)
  dimension, canary_norm = kw.get('dimension', 8), kw.get('canary_norm', 2.0)
  seen = {}
  real_claim, real_game = dp_games.claim_metrics, dp_games.make_game

  def claim(setting, **a):
    seen['claim'] = a
    return real_claim(setting, **a)

  def game(setting, **a):
    seen['game'] = a
    return real_game(setting, **a)

  def play(g, key, n):
    seen['play'] = (g.canary.shape, float(np.linalg.norm(g.canary)), n)
    present = np.arange(n) % 2 == 0
    return {'present': present, 'score': np.where(present, 1.0, 0.0) + np.linspace(0, 0.1, n)}

  def bounds(ins, outs, mechanism, claimed, **a):
    seen['bounds'] = (len(ins), len(outs), mechanism, claimed, a)
    return {'privacy_violation': 0.0}

  monkeypatch.setattr(dp_games, 'claim_metrics', claim)
  monkeypatch.setattr(dp_games, 'make_game', game)
  monkeypatch.setattr(dp_games, 'play', play)
  monkeypatch.setattr(dp_games.dp_canary, 'claim_metrics', bounds)
  m = dp_games.audit(s, KEY, 10, confidence=0.9, **kw)
  assert seen['claim'] == seen['game'] == {'dimension': dimension, 'canary_norm': canary_norm}
  assert seen['play'] == ((dimension,), pytest.approx(canary_norm * 0.5), 10)
  n_in, n_out, mechanism, claimed, a = seen['bounds']
  assert (n_in, n_out, mechanism) == (5, 5, 'gaussian')
  assert claimed == m['stated_epsilon']
  assert a == {'delta': 1e-5, 'confidence': 0.9, 'pld_epsilon': m['dp_epsilon_exact']}
  assert (m['canary_norm'], m['dimension'], m['num_trials']) == (
      pytest.approx(canary_norm * 0.5), dimension, 10)
  assert m['privacy_violation'] == 0.0


def test_audit_refuses_trials_with_an_empty_world(monkeypatch):
  monkeypatch.setattr(dp_games, 'play', lambda g, key, n: {
      'present': np.ones(n, bool), 'score': np.zeros(n)})
  with pytest.raises(ValueError, match=r'^3 trials gave no game in one of the worlds$'):
    dp_games.audit(_setting('server_fixed'), KEY, 3)


@pytest.mark.parametrize('wrapper', ['server_fixed', 'client_fixed', 'local_dp',
                                     'client_adaptive'])
def test_claim_metrics_fields_by_hand(wrapper):
  s = _setting(wrapper, clipping_norm=0.5, noise_multiplier=0.2, num_sampled_clients=5,
               epsilon=2.0, delta=1e-4)
  for kw in ({}, {'dimension': 5}):
    m = dp_games.claim_metrics(s, **kw)
    game = dp_games.make_game(s, dimension=kw.get('dimension', 8))
    mean_in, mean_out = dp_games.release_means(game)
    std_in, std_out = dp_games.world_noise_stds(game)
    decl = dp_setting.declaration(s)
    assert (m['dp_mechanism'], m['dp_level'], m['dp_delta']) == (decl.mechanism, decl.level,
                                                                 1e-4)
    assert m['effective_noise_multiplier'] == pytest.approx(
        dp_setting.effective_noise_multiplier(s))
    assert m['release_sensitivity'] == pytest.approx(np.linalg.norm(mean_in - mean_out))
    assert (m['flower_noise_std'], m['flower_noise_std_out']) == pytest.approx((std_in, std_out))
    projection = (mean_in - mean_out)[0]  # the canary lies on coordinate 0
    assert m['dp_epsilon_exact_projection'] == pytest.approx(
        dp_games.auditing.gdp_epsilon(projection / std_in, 1e-4))
    assert m['dp_epsilon_exact'] == pytest.approx(dp_setting.gaussian_pair_epsilon(
        m['release_sensitivity'], std_in, std_out, kw.get('dimension', 8), 1e-4))
    gdp = dp_games.auditing.gdp_epsilon
    if s.central:
      assert m['flower_rdp_epsilon'] == m['stated_epsilon']
      assert math.isnan(m['dp_epsilon_exact_replace_one'])
      assert math.isnan(m['replace_one_violation'])
    else:
      assert math.isnan(m['flower_rdp_epsilon']) and math.isnan(m['dp_epsilon_exact_worst'])
      # Replace-one: one client's upload against another's, 2C apart.
      assert m['dp_epsilon_exact_replace_one'] == pytest.approx(gdp(2 * 0.5 / std_in, 1e-4))
      assert m['replace_one_violation'] == float(m['dp_epsilon_exact_replace_one'] > 2.0)
    if wrapper in ('server_fixed', 'client_fixed'):  # FedAvg's renormalisation: up to 2C / n
      assert m['dp_epsilon_exact_worst'] == pytest.approx(
          gdp(2.0 / dp_setting.effective_noise_multiplier(s), 1e-4))
    else:
      assert math.isnan(m['dp_epsilon_exact_worst'])
  # The dimension reaches the game: the other clients' known updates differ with it.
  if s.central:
    assert dp_games.claim_metrics(s, dimension=5)['release_sensitivity'] != pytest.approx(
        dp_games.claim_metrics(s)['release_sensitivity'])
