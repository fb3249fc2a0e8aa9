"""`pipelines.training_audit_runs` without training: the two federations, the canaries a
training holds and the replicates a row runs, the claim and the `registry.Setting` it is
configured for, and what each planted bug makes the trainings run instead (the `defense`
sections handed to the registry are captured, so a wrong noise, clip, round count or sampling
is seen directly)."""

from __future__ import annotations

# pylint: disable=protected-access

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import digits
from fl_privacy.defenses import configured as configured_lib
from fl_privacy.pipelines import training_audit as ta
from fl_privacy.pipelines import training_audit_runs as runs
from tests.experiments import training_audit_plants as plants

STATE = {'train': types.SimpleNamespace(num_classes=10)}
HOOK_FIELDS = ('data', 'batch', 'loss', 'grad', 'upload', 'aggregate', 'batches', 'report')


def _config(plant='none', **fields):
  """The smoke config; `fields` override `training_audit` (dotted names allowed)."""
  config = digits.get_config('smoke')
  s = config.training_audit
  s.plant = plant
  for name, value in fields.items():
    plants.override(config, name, value)
  return config


def _tr(defense='update_dp', sampling='none', canary=None, eps=4.0):
  if canary is None:
    canary = 'gradient' if defense == 'dp_sgd' else 'client'
  return dict(defense=defense, sampling=sampling, canary=canary, claimed_epsilon=eps)


@pytest.fixture
def captured(monkeypatch):
  """Every `configure` call: (the section as a dict, the setting, the returned Configured)."""
  seen = []
  real = configured_lib.configure

  def spy(section, setting, **kw):
    out = real(section, setting, **kw)
    seen.append((section.to_dict(), setting, out))
    return out

  monkeypatch.setattr(configured_lib, 'configure', spy)
  return seen


# ----------------------------------------------------------------- federations, canaries ---


def test_dp_sgd_runs_cross_silo_and_the_client_level_defenses_cross_device():
  config = _config(**{'client.participation': 0.3})
  s = config.training_audit
  for defense in ta.DEFENSES:
    tr = _tr(defense)
    record = defense == 'dp_sgd'
    assert runs.federation(config, tr) is (s.record if record else s.client)
    assert runs.participation(config, tr) == (1.0 if record else 0.3)
    # The server picks who takes part for the defenses whose adversary it is.
    assert runs.server_adversary(tr) == (defense in ('dp_sgd', 'update_dp', 'ldp_sgd'))


def test_record_canaries_a_training_are_the_canary_rows_of_every_shard():
  config = _config(**{'record.num_clients': 7, 'record.canaries_per_client': 3,
                      'record.input_per_client': 2, 'record.canaries': 100,
                      'record.input_canaries': 28})
  grad, inp = _tr('dp_sgd', 'poisson', 'gradient'), _tr('dp_sgd', 'shuffle', 'input')
  assert runs.canaries_per_training(config, grad) == 21
  assert runs.canaries_per_training(config, inp) == 14
  assert runs.canaries_of_row(config, grad) == 100 and runs.canaries_of_row(config, inp) == 28
  # ceil(100 / 21) trainings pool at least the 100 canaries asked; 28 = 2 x 14 exactly.
  assert runs.replicates(config, grad) == 5 and runs.replicates(config, inp) == 2
  config.training_audit.record.input_canaries = 29
  assert runs.replicates(config, inp) == 3
  config.training_audit.record.canaries = 21
  assert runs.replicates(config, grad) == 1


def test_canary_clients_stay_within_their_share_of_each_round():
  config = _config(**{'client.num_clients': 100, 'client.participation': 0.35,
                      'client.canary_share': 0.25, 'client.canaries': 100})
  server, aggregate = _tr('update_dp'), _tr('central_dp')
  # The server's canaries take part every round beside round(0.35 x 100) = 35 real clients:
  # J <= 0.25 / 0.75 x 35 = 11.7; drawn like the others, J <= 0.25 / 0.75 x 100 = 33.3.
  assert runs.canaries_per_training(config, server) == 11
  assert runs.canaries_per_training(config, _tr('ldp_sgd')) == 11
  assert runs.canaries_per_training(config, aggregate) == 33
  assert runs.canaries_per_training(config, _tr('weak_dp')) == 33
  assert 11 / (11 + 35) <= 0.25 < 12 / (12 + 35)
  assert 33 / (33 + 100) <= 0.25 < 34 / (34 + 100)
  assert runs.replicates(config, server) == 10 and runs.replicates(config, aggregate) == 4
  assert runs.canaries_of_row(config, server) == 100
  # At least two canaries a training, and at least one real participant a round.
  config.training_audit.client.canary_share = 0.01
  assert runs.canaries_per_training(config, aggregate) == 2
  config.training_audit.client.update(canary_share=0.5, participation=0.001)
  assert runs.canaries_per_training(config, server) == 2   # max(1, round(0.1)) real clients
  assert runs.canaries_per_training(config, aggregate) == 100


def test_setting_is_the_federation_that_runs_with_its_public_record_count():
  config = _config(**{'record.num_clients': 7, 'record.per_client': 30, 'record.batch_size': 8,
                      'record.canaries_per_client': 2, 'record.input_per_client': 1,
                      'record.epochs': 2, 'record.num_rounds': 3,
                      'client.num_clients': 100, 'client.per_client': 3,
                      'client.participation': 0.5, 'client.canary_share': 0.3,
                      'client.batch_size': 2, 'client.num_rounds': 4})
  state = {'train': types.SimpleNamespace(num_classes=7)}
  st = runs.setting(config, state, _tr('dp_sgd', 'poisson'))
  # DP-SGD's schedule reads the public count N = per_client, never a shard's rows; the padded
  # batch holds the largest shard: N + its canary rows, or the side channel's 8 x ceil(30 / 8)
  # = 32 target rows plus one.
  assert (st.num_examples, st.max_examples) == (30, 33)
  assert (st.batch_size, st.epochs, st.rounds, st.num_clients) == (8, 2, 3, 7)
  assert st.num_classes == 7 and st.image_shape is None and st.steps_per_epoch is None
  config.training_audit.record.canaries_per_client = 5
  assert runs.setting(config, state, _tr('dp_sgd', 'shuffle')).max_examples == 35
  config.training_audit.record.update(canaries_per_client=1, input_per_client=6)
  assert runs.setting(config, state, _tr('dp_sgd', 'shuffle', 'input')).max_examples == 36
  # Client level: the real clients and a training's canary clients.
  client = runs.setting(config, state, _tr('central_dp'))
  # 0.3 / 0.7 x 100 = 42.9 canaries drawn like the others; 0.3 / 0.7 x 50 = 21.4 beside the
  # 50 real participants the server's canaries join every round.
  assert client.num_clients == 100 + runs.canaries_per_training(config, _tr('central_dp')) == 142
  server = runs.setting(config, state, _tr('update_dp'))
  assert server.num_clients == 100 + 21
  assert (client.num_examples, client.max_examples) == (3, 4)
  assert (client.batch_size, client.epochs, client.rounds) == (2, 1, 4)
  assert runs.setting(config, state, _tr('central_dp'), rounds_=1).rounds == 1


def test_side_rows_fill_whole_public_batches_for_dp_sgd():
  config = _config(**{'record.per_client': 30, 'record.batch_size': 8,
                      'client.per_client': 3})
  assert runs.side_rows(config, _tr('dp_sgd', 'poisson')) == 32
  config.training_audit.record.per_client = 32
  assert runs.side_rows(config, _tr('dp_sgd', 'shuffle')) == 32
  config.training_audit.record.per_client = 33
  assert runs.side_rows(config, _tr('dp_sgd', 'poisson')) == 40
  for defense in ('update_dp', 'central_dp', 'weak_dp', 'ldp_sgd'):
    assert runs.side_rows(config, _tr(defense)) == 3


def test_the_model_is_the_federations_by_its_widths():
  config = _config(**{'record.hidden': (4,), 'client.hidden': (6, 3)})
  state = {'models': {(4,): 'record model', (6, 3): 'client model'}}
  assert runs.model(config, state, _tr('dp_sgd')) == 'record model'
  assert runs.model(config, state, _tr('weak_dp')) == 'client model'
  assert runs.optimizer('sgd', 0.5) is runs.optimizer('sgd', 0.5)
  assert runs.optimizer('sgd', 0.5) is not runs.optimizer('sgd', 0.25)


# --------------------------------------------------------------------------------- claim ---


def test_sections_as_a_user_writes_them():
  config = _config(clip_norm=0.5, delta=2e-5, accountant='pld',
                   **{'client.participation': 0.25})
  dp = runs._section(config, _tr('dp_sgd', 'poisson'), 2.0)
  assert dp.name == 'dp_sgd' and dp.dp_sgd_sampling == 'poisson' and dp.target_epsilon == 2.0
  assert (dp.clip_norm, dp.delta, dp.accountant) == (0.5, 2e-5, 'pld')
  shuffled = runs._section(config, _tr('dp_sgd', 'shuffle'), 2.0)
  assert shuffled.dp_sgd_sampling == 'shuffle'  # not the field's default, Poisson
  sampled = runs._section(config, _tr('central_dp', 'without_replacement'), None, noise=1.5,
                          clip=3.0)
  assert sampled.participation == 0.25 and sampled.target_epsilon is None
  assert sampled.noise_multiplier == 1.5 and sampled.clip_norm == 3.0
  full = runs._section(config, _tr('central_dp'), 2.0)
  assert full.participation == 1.0   # the field's default: no amplification claimed
  ldp = runs._section(config, _tr('ldp_sgd'), 0.5)
  assert ldp.name == 'ldp_sgd' and ldp.epsilon == 0.5 and ldp.target_epsilon is None


def test_claim_is_configured_for_the_federation_that_runs(captured):
  config = _config(**{'client.num_rounds': 3})
  for tr in (_tr('dp_sgd', 'poisson'), _tr('update_dp', eps=4.0),
             _tr('central_dp', 'without_replacement')):
    claimed = runs.claim(config, STATE, tr)
    section, setting, out = captured[-1]
    assert out is claimed and section['name'] == tr['defense']
    assert section['target_epsilon'] == tr['claimed_epsilon']
    assert setting == runs.setting(config, STATE, tr)
  # LDP-SGD: the claim spread over the rounds, one report each.
  runs.claim(config, STATE, _tr('ldp_sgd', eps=6.0))
  section, setting, _ = captured[-1]
  assert section['epsilon'] == pytest.approx(2.0) and setting.rounds == 3
  # The planted bug: accounted as one composition though every round runs.
  runs.claim(_config('one_composition'), STATE, _tr('update_dp', eps=4.0))
  assert captured[-1][1].rounds == 1
  assert captured[-1][1] == runs.setting(_config(), STATE, _tr('update_dp'), rounds_=1)


def test_relation_and_step_reading_follow_the_claim():
  config = _config(clip_norm=0.5)
  s = config.training_audit
  poisson = runs.claim(config, STATE, _tr('dp_sgd', 'poisson', eps=2.0))
  shuffle = runs.claim(config, STATE, _tr('dp_sgd', 'shuffle', eps=2.0))
  ldp = runs.claim(config, STATE, _tr('ldp_sgd', eps=2.0))
  assert runs.relation_of(poisson, _tr('dp_sgd', 'poisson')) == 'add_remove'
  assert runs.relation_of(shuffle, _tr('dp_sgd', 'shuffle')) == 'replace_one'
  assert ldp.declaration is None and runs.relation_of(ldp, _tr('ldp_sgd')) == 'replace_one'
  z = float(poisson.metrics['noise_multiplier'])
  reading = runs.step_reading(config, _tr('dp_sgd', 'poisson'), poisson)
  assert reading.poisson and reading.rate == poisson.declaration.sampling_rate < 1
  assert reading.clip_norm == 0.5 and reading.noise_std == pytest.approx(0.5 * z)
  assert (reading.batch_size, reading.base_rows) == (int(s.record.batch_size),
                                                     int(s.record.per_client))
  plain = runs.step_reading(config, _tr('dp_sgd', 'shuffle'), shuffle)
  assert not plain.poisson and plain.rate == 1.0
  assert plain.noise_std == pytest.approx(0.5 * float(shuffle.metrics['noise_multiplier']))
  assert runs.step_reading(config, _tr('dp_sgd', 'poisson', 'input'), poisson) is None
  assert runs.step_reading(config, _tr('update_dp'), poisson) is None
  s.threats = ('all_iterates', 'last_iterate')
  assert runs.step_reading(config, _tr('dp_sgd', 'poisson'), poisson) is None


# ------------------------------------------------------------------------------- plants ---


def _same_but(hooks, claimed, *changed):
  """Every hook of `hooks` is the claimed one except the fields `changed`."""
  for f in HOOK_FIELDS:
    if f not in changed:
      assert getattr(hooks, f) is getattr(claimed, f), f


@pytest.mark.parametrize('plant', ['none', 'one_composition'])
def test_without_a_wiring_plant_the_claimed_hooks_run(plant):
  config = _config(plant, **{'client.participation': 0.3})
  for tr in (_tr('dp_sgd', 'poisson'), _tr('update_dp'), _tr('central_dp',
                                                             'without_replacement')):
    claimed = runs.claim(config, STATE, tr)
    hooks, part = runs.ran(config, STATE, tr, claimed)
    assert hooks is claimed.hooks
    assert part == runs.participation(config, tr)


def test_participation_not_run_takes_every_client_each_round():
  config = _config('participation_not_run', **{'client.participation': 0.3})
  tr = _tr('central_dp', 'without_replacement')
  claimed = runs.claim(config, STATE, tr)
  assert claimed.declaration.sampling == 'without_replacement'
  assert runs.ran(config, STATE, tr, claimed) == (claimed.hooks, 1.0)
  assert runs.ran(_config(**{'client.participation': 0.3}), STATE, tr, claimed) == (
      claimed.hooks, 0.3)


def test_poisson_full_batch_swaps_only_dp_sgds_sampler():
  config = _config('poisson_full_batch')
  tr = _tr('dp_sgd', 'poisson')
  claimed = runs.claim(config, STATE, tr)
  hooks, part = runs.ran(config, STATE, tr, claimed)
  assert hooks.batches is runs._full_batches and part == 1.0
  _same_but(hooks, claimed.hooks, 'batches')
  other = runs.claim(config, STATE, _tr('update_dp'))
  assert runs.ran(config, STATE, _tr('update_dp'), other)[0] is other.hooks
  idx, rows, live = runs._full_batches(None, jnp.asarray([1.0, 1.0, 0.0]), epochs=2,
                                       batch_size=2)
  # ceil(3 / 2) = 2 steps an epoch, each holding every real row of the shard.
  assert idx.shape == rows.shape == (2, 2, 3) and live.shape == (2, 2)
  np.testing.assert_array_equal(np.asarray(rows), np.broadcast_to([1.0, 1.0, 0.0], (2, 2, 3)))
  np.testing.assert_array_equal(np.asarray(idx), np.broadcast_to([0, 1, 2], (2, 2, 3)))
  np.testing.assert_array_equal(np.asarray(live), np.ones((2, 2)))


def test_data_dependent_schedule_swaps_only_the_sampler_for_one_that_follows_the_rows():
  config = _config('data_dependent_schedule')
  tr = _tr('dp_sgd', 'poisson')
  claimed = runs.claim(config, STATE, tr)
  hooks, _ = runs.ran(config, STATE, tr, claimed)
  assert hooks.batches is not claimed.hooks.batches and hooks.batches is not None
  _same_but(hooks, claimed.hooks, 'batches')
  # Shuffled DP-SGD and the client-level defenses have no sampler to swap.
  for other in (_tr('dp_sgd', 'shuffle'), _tr('update_dp')):
    c = runs.claim(config, STATE, other)
    assert runs.ran(config, STATE, other, c)[0] is c.hooks
  # The claimed sampler runs the public schedule's steps whatever the shard holds; the planted
  # one runs ceil(n / B) live steps of the n real rows, so one row more past a multiple of B
  # adds a step.
  b = int(config.training_audit.record.batch_size)
  capacity = 3 * b
  key = jax.random.key(1)
  live_steps = {}
  for n in (b, b + 1, 2 * b):
    mask = jnp.asarray(np.arange(capacity) < n, jnp.float32)
    for name, sampler in (('claimed', claimed.hooks.batches), ('planted', hooks.batches)):
      idx, rows, live = sampler(key, mask, epochs=1, batch_size=b)
      assert idx.shape == rows.shape and idx.shape[-1] == int(claimed.metrics['dp_max_batch_size'])
      # Only real rows are ever selected.
      assert np.all(np.asarray(mask)[np.asarray(idx)][np.asarray(rows) > 0] == 1.0)
      live_steps[name, n] = int(np.asarray(live).sum())
  assert [live_steps['planted', n] for n in (b, b + 1, 2 * b)] == [1, 2, 2]
  public = -(-int(config.training_audit.record.per_client) // b)
  assert [live_steps['claimed', n] for n in (b, b + 1, 2 * b)] == [public] * 3


@pytest.mark.parametrize('defense', ['dp_sgd', 'update_dp', 'ldp_sgd'])
def test_reported_rows_drops_only_the_public_report(defense):
  config = _config('reported_rows')
  tr = _tr(defense, 'poisson' if defense == 'dp_sgd' else 'none')
  claimed = runs.claim(config, STATE, tr)
  assert claimed.hooks.report is not None
  hooks, _ = runs.ran(config, STATE, tr, claimed)
  assert hooks.report is None
  _same_but(hooks, claimed.hooks, 'report')


@pytest.mark.parametrize('defense,sampling', [('dp_sgd', 'poisson'), ('dp_sgd', 'shuffle'),
                                              ('update_dp', 'none'),
                                              ('central_dp', 'without_replacement'),
                                              ('weak_dp', 'none')])
@pytest.mark.parametrize('plant', ['half_noise', 'clip_mismatch'])
def test_noise_plants_configure_half_the_claimed_noise(captured, defense, sampling, plant):
  # A clip of 0.5: twice the clip is 1.0, where 2 / C would be 4.
  config = _config(plant, clip_norm=0.5, **{'client.participation': 0.3})
  tr = _tr(defense, sampling, eps=4.0)
  claimed = runs.claim(config, STATE, tr)
  z = float(claimed.metrics['noise_multiplier'])
  n = len(captured)
  hooks, part = runs.ran(config, STATE, tr, claimed)
  (section, setting, out), = captured[n:]
  assert hooks is out.hooks and part == runs.participation(config, tr)
  assert section['noise_multiplier'] == pytest.approx(0.5 * z)
  assert section['target_epsilon'] is None
  assert section['clip_norm'] == pytest.approx(0.5 if plant == 'half_noise' else 1.0)
  # Only the noise (and the clip) differ from the claim: the sampling, the setting, the rest.
  assert setting == runs.setting(config, STATE, tr)
  if defense == 'dp_sgd':
    assert section['dp_sgd_sampling'] == sampling
  if sampling == 'without_replacement':
    assert section['participation'] == 0.3
  assert float(out.metrics['noise_multiplier']) == pytest.approx(0.5 * z)


@pytest.mark.parametrize('plant,factor', [('half_noise', 2.0), ('clip_mismatch', 1.0)])
def test_ldp_sgd_only_half_noise_doubles_the_per_report_epsilon(captured, plant, factor):
  config = _config(plant)
  claimed = runs.claim(config, STATE, _tr('ldp_sgd', eps=6.0))
  n = len(captured)
  hooks, _ = runs.ran(config, STATE, _tr('ldp_sgd', eps=6.0), claimed)
  per_report = 6.0 / int(config.training_audit.client.num_rounds)
  assert captured[n][0]['epsilon'] == pytest.approx(factor * per_report)
  assert hooks is captured[n][2].hooks
  # The claimed hooks configured the per-report epsilon itself.
  assert captured[n - 1][0]['epsilon'] == pytest.approx(per_report)
