"""Flower's own DP audited with canary games (`fl_privacy.flower.audits.dp_games`)."""

from __future__ import annotations

import math
import random

import jax
import numpy as np
import pytest

from fl_privacy.flower.audits import dp_games
from fl_privacy.flower.audits import dp_setting


KEY = jax.random.key(3)


def _local(epsilon, clip=1.0, sensitivity=None, delta=1e-5):
  return dp_setting.Setting(f'local_{epsilon}', 'local_dp', clipping_norm=clip,
                            sensitivity=clip if sensitivity is None else sensitivity,
                            epsilon=epsilon, delta=delta)


def test_noise_std_is_what_flowers_objects_add():
  """The out-world scores' spread is Flower's noise: LocalDpMod's classic-Gaussian std, and
  the central wrappers' z C / n on the mean."""
  for setting in (_local(2.0), dp_setting.Setting('srv', 'server_fixed', noise_multiplier=1.0,
                                                  num_sampled_clients=5, clipping_norm=2.0)):
    out = dp_games.play(dp_games.make_game(setting), KEY, 600)
    outs = out['score'][~out['present']]
    std = dp_setting.noise_std(setting)
    assert np.std(outs) == pytest.approx(std, rel=0.12)
    assert abs(np.mean(outs)) < 4 * std / math.sqrt(len(outs))
    ins = out['score'][out['present']]  # the canary, clipped to C, shifted by 1 (local) or 1/n
    shift = setting.clipping_norm / (setting.num_sampled_clients if setting.central else 1)
    assert np.mean(ins) == pytest.approx(shift, abs=4 * std / math.sqrt(len(ins)))
  assert dp_setting.local_dp_std(1.0, 10.0, 1e-5) == pytest.approx(0.4845, abs=1e-4)
  assert dp_setting.effective_noise_multiplier(_local(10.0, sensitivity=1e-4)) == pytest.approx(
      4.845e-5, rel=1e-3)


def test_central_claims_flower_and_our_accountant_agree_and_clipping_sides_agree():
  server = dp_setting.Setting('s', 'server_fixed', noise_multiplier=1.0, num_sampled_clients=10)
  client = dataclass_replace(server, wrapper='client_fixed')
  m = dp_games.claim_metrics(server)
  assert m['stated_epsilon_source'] == 'flwr RdpAccountant'
  assert m['stated_epsilon'] == pytest.approx(m['dp_epsilon'], rel=1e-9)
  assert m['dp_epsilon_exact'] < m['dp_epsilon'] and m['accountant_violation'] == 0
  assert (m['dp_unit'], m['dp_relation'], m['dp_adversary'], m['dp_sampling']) == (
      'client', 'add_remove', 'aggregate', 'none')
  # Clipping at the server (the wrapper) and at the client (fixedclipping_mod) release the
  # same aggregate under the same seeds.
  a = dp_games.play(dp_games.make_game(server), KEY, 60)
  b = dp_games.play(dp_games.make_game(client), KEY, 60)
  np.testing.assert_array_equal(a['present'], b['present'])
  np.testing.assert_allclose(a['score'], b['score'], rtol=0, atol=1e-6)


def dataclass_replace(setting, **kw):
  import dataclasses  # pylint: disable=import-outside-toplevel
  return dataclasses.replace(setting, **kw)


def test_trials_depend_on_key_and_index_only_and_global_generators_are_restored():
  setting = _local(1.0)
  game = dp_games.make_game(setting)
  np.random.seed(11)
  random.seed(11)
  np_before, py_before = np.random.get_state()[1].copy(), random.getstate()
  full = dp_games.play(game, KEY, 40)
  np.testing.assert_array_equal(np.random.get_state()[1], np_before)
  assert random.getstate() == py_before
  tail = dp_games.play(game, KEY, 40, start=25)
  np.testing.assert_array_equal(tail['score'], full['score'][25:])
  np.testing.assert_array_equal(tail['present'], full['present'][25:])
  other = dp_games.play(game, jax.random.key(4), 40)
  assert not np.array_equal(other['score'], full['score'])


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_correct_local_dp_is_never_above_its_claim_and_tight_ish(seed):
  for epsilon, clip in ((1.0, 1.0), (4.0, 0.5), (8.0, 1.0)):
    setting = _local(epsilon, clip)
    m = dp_games.audit(setting, jax.random.fold_in(KEY, seed), 1500)
    assert m['privacy_violation'] == 0, (epsilon, clip, m['best_bound'])
    assert m['best_bound'] <= m['stated_epsilon']
    assert m['dp_epsilon_exact'] <= epsilon  # the classic formula holds for these claims
    if epsilon >= 4:
      # Tight-ish: the verdict's bound is the family-wise 95% one (each counted bound at
      # 98.75%, `dp_canary.claim_metrics`), 1.40 of 4 at 1,500 games for seed 2.
      assert m['best_bound'] >= 0.3 * epsilon, m['best_bound']


def test_local_dp_at_epsilon_10_breaks_its_claim_analytically_not_detectably():
  """sqrt(2 ln(1.25 / delta)) / eps is an (eps, delta) calibration for eps < 1 only: at eps 10
  the noise Flower adds is worth eps 10.39 at delta 1e-5, beyond what 1500 games certify."""
  m = dp_games.audit(_local(10.0), KEY, 1500)
  assert m['dp_epsilon_exact'] == pytest.approx(10.39, abs=0.01)
  assert m['accountant_violation'] == 1
  assert m['privacy_violation'] == 0


def test_misconfigured_local_dp_is_flagged():
  """The issue's LocalDpMod(clipping_norm=1, sensitivity=1e-4, epsilon=10, delta=1e-5): noise
  for sensitivity 1e-4, updates of norm 1."""
  setting = _local(10.0, clip=1.0, sensitivity=1e-4)
  m = dp_games.audit(setting, KEY, 800)
  assert m['privacy_violation'] == 1
  assert m['best_bound'] > 10.0
  assert m['accountant_violation'] == 1 and m['dp_epsilon'] > 1e6
  assert m['stated_epsilon'] == 10.0
  assert m['stated_epsilon_source'] == 'LocalDpMod epsilon argument'
  decl = dp_setting.declaration(setting)
  assert (decl.unit, decl.relation, decl.adversary) == ('client', 'add_remove', 'server')


def test_setting_refuses_an_unknown_wrapper():
  with pytest.raises(ValueError, match="wrapper must be one of"):
    dp_setting.Setting('x', 'adaptive')


def test_adaptive_wrappers_at_flowers_defaults_keep_the_claim_on_the_aggregate():
  """First round's aggregate of the adaptive wrappers (initial clip 0.1, quantile 0.5, lr 0.2,
  count std n / 20): server- and client-side clipping release the same aggregate, below the
  claim (the clip-norm release is not scored)."""
  server = dp_setting.Setting('a', 'server_adaptive', noise_multiplier=0.5,
                              num_sampled_clients=10, clipping_norm=0.1)
  client = dataclass_replace(server, wrapper='client_adaptive')
  assert dp_setting.adaptive_noise(server) == pytest.approx((0.5, 3 ** -0.5))
  m = dp_games.audit(server, KEY, 1000)
  assert m['privacy_violation'] == 0 and m['best_bound'] <= m['stated_epsilon']
  assert m['stated_epsilon'] == pytest.approx(dp_setting.flower_rdp_epsilon(0.5, 10, 1e-5))
  assert m['score_in_mean'] == pytest.approx(0.1 / 10, abs=0.002)  # the canary clipped to C_0
  a = dp_games.play(dp_games.make_game(server), KEY, 40)
  b = dp_games.play(dp_games.make_game(client), KEY, 40)
  np.testing.assert_allclose(a['score'], b['score'], rtol=0, atol=1e-7)
  with pytest.raises(ValueError, match='clipped_count_stddev'):
    dp_setting.adaptive_noise(dataclass_replace(server, noise_multiplier=1.0))


# ---------------------------------------------------- the release's exact epsilon (issue 28) ---


def test_release_means_are_what_flowers_wrappers_release_without_noise():
  """`release_means` (clip, FedAvg's mean over the replies present) against Flower's own
  objects at a negligible noise multiplier: the whole vector moves in the out-world."""
  for wrapper in ('server_fixed', 'client_fixed'):
    setting = dp_setting.Setting('s', wrapper, noise_multiplier=1e-9, num_sampled_clients=10)
    game = dp_games.make_game(setting)
    mean_in, mean_out = dp_games.release_means(game)
    np.testing.assert_allclose(game.release(True) - game.w_t, mean_in, atol=2e-6)
    np.testing.assert_allclose(game.release(False) - game.w_t, mean_out, atol=2e-6)
    assert np.linalg.norm((mean_in - mean_out)[1:]) > 0.02 / 10  # not the canary alone


@pytest.mark.parametrize('z, release, projection', [(1.0, 4.594, 4.377), (0.5, 10.527, 9.997)])
def test_central_exact_epsilon_is_of_the_release_not_the_projection(z, release, projection):
  m = dp_games.claim_metrics(dp_setting.Setting('s', 'server_fixed', noise_multiplier=z))
  assert m['dp_epsilon_exact'] == pytest.approx(release, abs=2e-3)
  assert m['dp_epsilon_exact_projection'] == pytest.approx(projection, abs=2e-3)
  assert m['game_relation'] == 'add_remove'
  # FedAvg's renormalisation: up to 2C/n, the Gaussian at z / 2.
  assert m['dp_epsilon_exact_worst'] == pytest.approx(
      dp_games.auditing.gdp_epsilon(2.0 / z, 1e-5), rel=1e-9)
  assert m['accountant_violation'] == 0  # 4.59 < 4.73, 10.53 < 10.73


@pytest.mark.parametrize('epsilon, replace_one', [(1.0, 1.610), (4.0, 7.914), (10.0, 25.443)])
def test_local_dp_replace_one_column(epsilon, replace_one):
  m = dp_games.claim_metrics(_local(epsilon))
  assert m['game_relation'] == 'zero_out'
  assert m['dp_epsilon_exact_replace_one'] == pytest.approx(replace_one, abs=2e-3)
  assert m['replace_one_violation'] == 1  # every stated epsilon is broken under replace-one
  assert m['dp_epsilon_exact'] == pytest.approx(m['dp_epsilon_exact_projection'])


def test_adaptive_noise_is_drawn_at_the_clip_after_its_update(monkeypatch):
  """Flower adds z' C_1 / n after updating the clip (dp_adaptive_clipping.py 213-223): the
  std Flower's own noise call receives, per world, is `world_noise_stds`'s (the clip after
  the update, at the count's median), not the nominal std at C_0."""
  from flwr.serverapp.strategy import dp_adaptive_clipping  # pylint: disable=g-import-not-at-top
  stds = []
  real = dp_adaptive_clipping.add_gaussian_noise_inplace

  def spy(arrays, std_dev):
    stds.append(std_dev)
    real(arrays, std_dev)
  monkeypatch.setattr(dp_adaptive_clipping, 'add_gaussian_noise_inplace', spy)
  setting = dp_setting.Setting('a', 'server_adaptive', noise_multiplier=0.5,
                               num_sampled_clients=10, clipping_norm=0.1, clip_norm_lr=2.0)
  game = dp_games.make_game(setting)
  std_in, std_out = dp_games.world_noise_stds(game)
  nominal = dp_setting.noise_std(setting)
  assert std_in == pytest.approx(nominal * math.exp(-2.0 * (0.7 - 0.5)), rel=1e-9)
  assert std_out == pytest.approx(nominal * math.exp(-2.0 * (6 / 9 - 0.5)), rel=1e-9)
  out = dp_games.play(game, KEY, 300)
  stds = np.asarray(stds)
  assert len(stds) == 300
  for world, expected in ((out['present'], std_in), (~out['present'], std_out)):
    # The count's noise (std 0.5 on 9-10 replies) spreads the clip; its median is ours.
    assert np.median(stds[world]) == pytest.approx(expected, rel=0.04)
    assert np.median(stds[world]) < 0.8 * nominal  # nowhere near the std at C_0


def test_adaptive_defaults_reviewers_numbers():
  m = dp_games.claim_metrics(dp_setting.Setting('a', 'client_adaptive', noise_multiplier=0.5,
                                                num_sampled_clients=10, clipping_norm=0.1))
  assert m['flower_noise_std_nominal'] == pytest.approx(0.00577, abs=1e-5)
  assert (m['flower_noise_std'], m['flower_noise_std_out']) == (
      pytest.approx(0.00555, abs=1e-5), pytest.approx(0.00558, abs=1e-5))
  assert m['dp_epsilon_exact_projection'] == pytest.approx(8.80, abs=0.01)
  assert m['dp_epsilon_exact'] == pytest.approx(9.43, abs=0.01)
  assert m['clip_after_in'] < m['clip_after_out'] < 0.1


def test_gaussian_pair_epsilon():
  gdp = dp_games.auditing.gdp_epsilon
  assert dp_setting.gaussian_pair_epsilon(1.0, 1.0, 1.0, 8, 1e-5) == gdp(1.0, 1e-5)
  near = dp_setting.gaussian_pair_epsilon(1.0, 1.0, 1.0 + 1e-7, 8, 1e-5)
  assert near == pytest.approx(gdp(1.0, 1e-5), abs=1e-4)
  a = dp_setting.gaussian_pair_epsilon(1.0, 1.0, 1.1, 8, 1e-5)
  assert a == pytest.approx(dp_setting.gaussian_pair_epsilon(1.0, 1.1, 1.0, 8, 1e-5))
  # A variance gap leaks on its own, more with more coordinates.
  assert a > gdp(1.0, 1e-5)
  assert dp_setting.gaussian_pair_epsilon(0.0, 1.0, 1.1, 64, 1e-5) > (
      dp_setting.gaussian_pair_epsilon(0.0, 1.0, 1.1, 8, 1e-5)) > 0


def _hockey_monte_carlo(eps, distance, std_p, std_q, d, rng, n=400_000):
  """max over both orders of E_P[(1 - e^(eps - L))_+], L = log p / q, by sampling: an
  independent check of `gaussian_pair_epsilon`'s quadrature (P = N(distance e_1, std_p^2 I),
  Q = N(0, std_q^2 I))."""
  def one(mu_a, s_a, mu_b, s_b):
    x = rng.normal(size=(n, d)) * s_a
    x[:, 0] += mu_a
    shift_a, shift_b = x.copy(), x.copy()
    shift_a[:, 0] -= mu_a
    shift_b[:, 0] -= mu_b
    log_ratio = (-0.5 * np.sum(shift_a ** 2, 1) / s_a ** 2 - d * math.log(s_a)
                 + 0.5 * np.sum(shift_b ** 2, 1) / s_b ** 2 + d * math.log(s_b))
    return float(np.mean(np.maximum(0.0, 1.0 - np.exp(eps - log_ratio))))
  return max(one(distance, std_p, 0.0, std_q), one(0.0, std_q, distance, std_p))


@pytest.mark.parametrize('d,std_p,std_q,distance,delta', [
    (4, 1.0, 1.25, 1.0, 0.02), (1, 1.0, 1.3, 0.8, 0.05), (8, 0.6, 0.5, 1.0, 0.05), (8, 0.6, 0.5, 1.0, 0.2),
    (3, 0.5, 0.8, 0.3, 0.1)])
def test_gaussian_pair_epsilon_against_monte_carlo(d, std_p, std_q, distance, delta):
  eps = dp_setting.gaussian_pair_epsilon(distance, std_p, std_q, d, delta)
  assert eps > 0
  rng = np.random.default_rng(6)
  got = _hockey_monte_carlo(eps, distance, std_p, std_q, d, rng)
  # The integrand lies in [0, 1]: its sample mean's sd is at most sqrt(delta / n).
  assert got == pytest.approx(delta, abs=5 * math.sqrt(delta / 400_000))
  # And the epsilon is the smallest: a little less leaves more than delta.
  assert _hockey_monte_carlo(0.97 * eps, distance, std_p, std_q, d, rng) > delta + 5 * math.sqrt(
      delta / 400_000)
