"""Flower's DP over every round of a deployment with canary clients (`flower.canaries`)."""

from __future__ import annotations

import dataclasses
import logging as py_logging
import math
import random

import jax
import numpy as np
import pytest

from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import LocalDpMod, adaptiveclipping_mod, fixedclipping_mod
from flwr.serverapp import strategy as flwr_strategy

from fl_privacy.eval import auditing
from fl_privacy.flower.audits import canaries
from fl_privacy.flower.audits import canary_deploy
from fl_privacy.flower.audits import canary_design
from fl_privacy.flower.audits import canary_stats
from fl_privacy.flower.audits import dp_games
from fl_privacy.flower.audits import dp_setting
from fl_privacy.flower.engines import inprocess

KEY = jax.random.key(7)
SMALL = canary_design.Design(num_canaries=48, num_real=16, num_rounds=3, dimension=256,
                             num_null=64)


def _setting(wrapper, **kw):
  base = dict(clipping_norm=0.1 if wrapper in dp_setting.ADAPTIVE else 1.0)
  base.update(kw)
  return dp_setting.Setting(wrapper, wrapper, **base)


def test_server_and_client_side_fixed_clipping_release_the_same_models_and_flower_states_rdp():
  """Same key: the same coins, directions and noise; clipping at the server (the wrapper) or
  at each node (fixedclipping_mod) gives the same global models. Flower's own accountant,
  passed to the wrapper, states T releases at z."""
  server = canary_deploy.deploy(_setting('server_fixed', noise_multiplier=1.0), SMALL, KEY)
  client = canary_deploy.deploy(_setting('client_fixed', noise_multiplier=1.0), SMALL, KEY)
  np.testing.assert_array_equal(server['included'], client['included'])
  np.testing.assert_allclose(server['models'], client['models'], rtol=0, atol=1e-5)
  assert server['models'].shape == (SMALL.num_rounds + 1, SMALL.dimension)
  assert server['stated_flower'] == pytest.approx(dp_setting.flower_rdp_epsilon(
      1.0, SMALL.num_nodes, 1e-5, rounds=SMALL.num_rounds), rel=1e-9)
  # Flower's noise is there: the model moves on the null coordinates (no node writes them).
  null = server['models'][-1, SMALL.num_canaries:SMALL.num_canaries + SMALL.num_null]
  assert np.std(null) == pytest.approx(math.sqrt(SMALL.num_rounds) / SMALL.num_nodes, rel=0.3)


def test_a_run_depends_on_its_key_only_and_restores_the_global_generators():
  setting = _setting('server_fixed', noise_multiplier=1.0)
  np.random.seed(5)
  random.seed(5)
  np_before, py_before = np.random.get_state()[1].copy(), random.getstate()
  a = canary_deploy.deploy(setting, SMALL, KEY)
  np.testing.assert_array_equal(np.random.get_state()[1], np_before)
  assert random.getstate() == py_before
  b = canary_deploy.deploy(setting, SMALL, KEY)
  np.testing.assert_array_equal(a['models'], b['models'])
  c = canary_deploy.deploy(setting, SMALL, jax.random.fold_in(KEY, 1))
  assert not np.array_equal(a['included'], c['included'])


def test_canaries_are_fair_coins_and_dirac_canaries_are_orthogonal_to_everything_else():
  design = dataclasses.replace(SMALL, num_canaries=400, dimension=1024)
  included, dirs = canary_design.canary_draws(KEY, design)
  assert 150 < included.sum() < 250
  np.testing.assert_array_equal(dirs, np.eye(400, 1024))
  real = canary_design.real_updates(KEY, design)
  assert not np.any(real[:, :, :design.num_canaries + design.num_null])
  norms = np.linalg.norm(real, axis=-1)
  np.testing.assert_allclose(norms[0], np.linspace(0.5, 2.0, design.num_real), rtol=1e-9)
  with pytest.raises(ValueError, match='dimension > num_canaries'):
    canary_design.Design(num_canaries=100, num_null=100, dimension=200)


def test_fixed_clipping_audit_recovers_the_mechanism_and_keeps_the_claim():
  """z = 1 over T = 3 rounds: each canary is sqrt(3)-GDP (zero-out, C / n against z C / n);
  the Gaussian fit's mu finds it, the one-run bounds stay below Flower's claim."""
  design = dataclasses.replace(SMALL, num_canaries=300, dimension=1024, num_null=300)
  m = canaries.audit(_setting('server_fixed', noise_multiplier=1.0), design, KEY)
  assert m['exact_epsilon_all_iterates'] == pytest.approx(
      auditing.gdp_epsilon(math.sqrt(3), 1e-5), rel=1e-9)
  assert m['stated_epsilon'] > m['exact_epsilon_all_iterates']
  assert m['all_iterates/fit_mu'] == pytest.approx(math.sqrt(3), abs=0.35)
  assert m['all_iterates/n_in'] + m['all_iterates/n_out'] == 300
  assert 0 < m['all_iterates/epsilon_one_run'] <= m['stated_epsilon']
  assert m['privacy_violation'] == 0 and m['accountant_violation'] == 0
  assert m['game_relation'] == 'zero_out'
  # The verdict is family-wise at 95%: four counted bounds (two threats), each at 98.75%.
  assert m['counted_bounds'].split(',') == [f'{t}/{b}' for t in canary_design.THREATS
                                            for b in canary_design.BOUNDS]
  assert (m['verdict_confidence'], m['bound_confidence']) == (0.95, pytest.approx(0.9875))
  assert m['best_bound'] == max(m[name] for name in m['counted_bounds'].split(','))


def test_adaptive_clip_moves_the_wrong_way_and_noise_after_the_update_costs_epsilon():
  """Flower's adaptive rule multiplies the clip by exp(-lr (clipped fraction - quantile)):
  with most updates above the clip it shrinks every round (Andrew et al.'s rule, on the
  UNclipped fraction, would grow it), and each round's noise is drawn at the shrunk clip:
  the aggregates are worth more than the z the user asked for."""
  for wrapper in dp_setting.ADAPTIVE:
    m = canaries.audit(_setting(wrapper, noise_multiplier=1.0), SMALL, KEY)
    clips = np.asarray(m['clips'])
    assert clips[0] == 0.1 and np.all(np.diff(clips) < 0), clips
    assert m['exact_epsilon_all_iterates'] > m['exact_epsilon_as_claimed']
    assert m['exact_epsilon_with_counts'] > m['exact_epsilon_all_iterates']


def test_misconfigured_local_dp_is_caught_by_the_fit_and_every_upload_is_scored():
  design = dataclasses.replace(SMALL, num_rounds=2)
  ok = canaries.audit(_setting('local_dp', epsilon=1.0), design, KEY)
  bad = canaries.audit(_setting('local_dp', sensitivity=1e-4, epsilon=10.0), design, KEY)
  assert bad['stated_epsilon'] == 20.0 and bad['stated_delta'] == pytest.approx(2e-5)
  assert bad['all_iterates/epsilon_fit'] > bad['stated_epsilon']
  assert bad['all_iterates/epsilon_one_run'] > ok['all_iterates/epsilon_one_run']
  assert ok['all_iterates/epsilon_fit'] < ok['stated_epsilon']
  assert bad['accountant_violation'] == 1 and ok['accountant_violation'] == 0
  # A deployment records LocalDpMod's uploads: both threats count, k = 4.
  assert ok['counted_bounds'] == bad['counted_bounds'] == ','.join(
      canary_stats.counted_bounds(_setting('local_dp'), uploads_recorded=True))
  assert ok['bound_confidence'] == pytest.approx(0.9875)


def _zero_update_app(mods):
  """Every node replies exactly the model it got: an update of zero."""
  app = ClientApp(mods=mods)

  @app.train()
  def train(msg, context):
    del context
    name, record = next(iter(msg.content.array_records.items()))
    same = ArrayRecord({k: Array(record[k].numpy()) for k in record.keys()})
    return Message(RecordDict({name: same, 'metrics': MetricRecord({'num-examples': 1})}),
                   reply_to=msg)
  return app


def _fedavg():
  return flwr_strategy.FedAvg(fraction_evaluate=0.0, min_train_nodes=3, min_available_nodes=3)


@pytest.mark.parametrize('mod, wrapper', [
    (fixedclipping_mod, lambda: flwr_strategy.DifferentialPrivacyClientSideFixedClipping(
        _fedavg(), 1.0, 1.0, 3)),
    (adaptiveclipping_mod, lambda: flwr_strategy.DifferentialPrivacyClientSideAdaptiveClipping(
        _fedavg(), 0.1, 3)),
    (LocalDpMod(1.0, 1.0, 1.0, 1e-5), _fedavg),
])
def test_a_zero_update_makes_flowers_client_side_clip_fail_the_round(mod, wrapper):
  """Why an excluded canary replies 1e-6 C and not 0: Flower 1.42's clip divides by the
  update's norm (supercore/differential_privacy.py 55-56, 90-91). Nodes replying exactly w_t:
  each mod raises (an error reply) and the round releases no aggregate."""
  initial = ArrayRecord({'w': Array(np.ones(4, np.float32))})
  with dp_games.quiet_flower(py_logging.CRITICAL):
    grid = inprocess.InProcessGrid([_zero_update_app([mod])] * 3)
    result = inprocess.run(wrapper(), grid, initial, num_rounds=1)
  assert 1 not in result.train_metrics_clientapp  # no aggregate in round 1
  grid = inprocess.InProcessGrid([_zero_update_app([mod])] * 3, raise_client_errors=True)
  with pytest.raises(ZeroDivisionError), dp_games.quiet_flower(py_logging.CRITICAL):
    inprocess.run(wrapper(), grid, initial, num_rounds=1)


@pytest.mark.parametrize('wrapper', [
    lambda: flwr_strategy.DifferentialPrivacyServerSideFixedClipping(_fedavg(), 1.0, 1.0, 3),
    lambda: flwr_strategy.DifferentialPrivacyServerSideAdaptiveClipping(_fedavg(), 0.1, 3),
])
def test_a_zero_update_crashes_flowers_server_side_clip(wrapper):
  initial = ArrayRecord({'w': Array(np.ones(4, np.float32))})
  with dp_games.quiet_flower(), pytest.raises(ZeroDivisionError):
    inprocess.run(wrapper(), inprocess.InProcessGrid([_zero_update_app([])] * 3), initial,
                  num_rounds=1)
  # The excluded canary's 1e-6 C update goes through.
  fine = canary_deploy.deploy(dp_setting.Setting('s', 'server_fixed'), SMALL, KEY)
  assert np.isfinite(fine['models']).all()

