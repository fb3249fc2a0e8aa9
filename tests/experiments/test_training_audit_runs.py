"""`pipelines.training_audit_runs` without training: the claim, the federation it is configured
for, and what each planted bug makes the training run instead (the `defense` sections handed to
the registry are captured, so a wrong noise, clip, round count or sampling is seen directly)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from configs import digits
from fl_privacy.defenses import configured as configured_lib
from fl_privacy.pipelines import training_audit_runs as runs

STATE = {'train': types.SimpleNamespace(num_classes=10)}


def _config(plant='none', **fields):
  config = digits.get_config('smoke')
  config.training_audit.plant = plant
  for name, value in fields.items():
    config.training_audit[name] = value
  return config


def _tr(defense='update_dp', sampling='none', canary='client', eps=4.0):
  return dict(defense=defense, sampling=sampling, canary=canary, claimed_epsilon=eps)


@pytest.fixture
def captured(monkeypatch):
  seen = []
  real = configured_lib.configure

  def spy(section, setting, **kw):
    seen.append((section.to_dict(), setting))
    return real(section, setting, **kw)

  monkeypatch.setattr(configured_lib, 'configure', spy)
  return seen


def test_setting_is_the_federation_that_runs():
  config = _config(epochs=2)  # neither it nor the class count at the Setting's defaults
  s = config.training_audit
  sizes = np.asarray([5, 9, 7])
  st = runs.setting(config, {'train': types.SimpleNamespace(num_classes=7)},
                    _tr(canary='client'), sizes)
  assert st.num_clients == int(s.num_clients) + int(s.num_canary_clients)
  assert (st.num_examples, st.max_examples) == (5, 9)
  assert st.steps_per_epoch == -(-9 // int(s.batch_size))
  assert st.rounds == int(s.num_rounds) and st.num_classes == 7 and st.image_shape is None
  assert st.batch_size == int(s.batch_size) and st.epochs == 2
  example = runs.setting(config, STATE, _tr(canary='gradient'), sizes, rounds_=1)
  assert example.num_clients == int(s.num_clients) and example.rounds == 1


def test_sections_as_a_user_writes_them():
  config = _config(participation=0.25)
  s = config.training_audit
  dp = runs._section(config, _tr('dp_sgd', 'poisson'), 2.0)  # pylint: disable=protected-access
  assert dp.name == 'dp_sgd' and dp.dp_sgd_sampling == 'poisson' and dp.target_epsilon == 2.0
  assert dp.clip_norm == float(s.clip_norm) and dp.delta == float(s.delta)
  shuffled = runs._section(config, _tr('dp_sgd', 'shuffle'), 2.0)  # pylint: disable=protected-access
  assert shuffled.dp_sgd_sampling == 'shuffle'  # not the field's default, Poisson
  sampled = runs._section(config, _tr('update_dp', 'without_replacement'), None, noise=1.5,  # pylint: disable=protected-access
                          clip=3.0)
  assert sampled.participation == 0.25 and sampled.target_epsilon is None
  assert sampled.noise_multiplier == 1.5 and sampled.clip_norm == 3.0
  full = runs._section(config, _tr('update_dp'), 2.0)  # pylint: disable=protected-access
  assert full.participation != 0.25
  ldp = runs._section(config, _tr('ldp_sgd'), 0.5)  # pylint: disable=protected-access
  assert ldp.epsilon == 0.5


def test_claim_spends_the_epsilon_over_the_rounds_that_run(captured):
  config = _config()
  rounds_ = int(config.training_audit.num_rounds)
  sizes = np.full(int(config.training_audit.num_clients), int(config.training_audit.per_client))
  runs.claim(config, STATE, _tr('ldp_sgd', eps=6.0), sizes)
  section, setting = captured[-1]
  assert section['epsilon'] == pytest.approx(6.0 / rounds_) and setting.rounds == rounds_
  runs.claim(config, STATE, _tr('update_dp', eps=4.0), sizes)
  section, setting = captured[-1]
  assert section['target_epsilon'] == 4.0 and setting.rounds == rounds_
  # The planted bug: accounted as one composition though every round runs.
  runs.claim(_config('one_composition'), STATE, _tr('update_dp', eps=4.0), sizes)
  assert captured[-1][1].rounds == 1


def test_what_runs_under_each_plant(captured):
  sizes = np.full(20, 16)
  config = _config()
  claimed = runs.claim(config, STATE, _tr('update_dp', eps=4.0), sizes)
  z = float(claimed.metrics['noise_multiplier'])
  hooks, part = runs.ran(config, STATE, _tr('update_dp'), claimed, sizes)
  assert hooks is claimed.hooks and part == 1.0
  sampled = _config(participation=0.3)
  claimed_s = runs.claim(sampled, STATE, _tr('update_dp', 'without_replacement'), sizes)
  assert runs.ran(sampled, STATE, _tr('update_dp', 'without_replacement'), claimed_s,
                  sizes)[1] == pytest.approx(0.3)
  not_run = _config('participation_not_run', participation=0.3)
  assert runs.ran(not_run, STATE, _tr('update_dp', 'without_replacement'), claimed_s,
                  sizes) == (claimed_s.hooks, 1.0)
  # Accounted as one composition: the claimed hooks still run, every round.
  assert runs.ran(_config('one_composition'), STATE, _tr('update_dp'), claimed, sizes) == (
      claimed.hooks, 1.0)
  n = len(captured)
  runs.ran(_config('half_noise'), STATE, _tr('update_dp'), claimed, sizes)
  section = captured[n][0]
  assert section['noise_multiplier'] == pytest.approx(0.5 * z)
  assert section['clip_norm'] == float(config.training_audit.clip_norm)
  assert section['target_epsilon'] is None
  # A clip of 0.5: twice the clip is 1.0, where 2 / C would be 4.
  mismatch = _config('clip_mismatch', clip_norm=0.5)
  claimed_m = runs.claim(mismatch, STATE, _tr('update_dp', eps=4.0), sizes)
  n = len(captured)
  runs.ran(mismatch, STATE, _tr('update_dp'), claimed_m, sizes)
  section = captured[n][0]
  assert section['noise_multiplier'] == pytest.approx(
      0.5 * float(claimed_m.metrics['noise_multiplier']))
  assert section['clip_norm'] == pytest.approx(1.0)


def test_poisson_full_batch_replaces_the_sampler_of_dp_sgd_only(captured):
  del captured
  sizes = np.full(20, 16)
  config = _config('poisson_full_batch')
  claimed = runs.claim(config, STATE, _tr('dp_sgd', 'poisson', canary='gradient'), sizes)
  hooks, _ = runs.ran(config, STATE, _tr('dp_sgd', 'poisson', canary='gradient'), claimed,
                      sizes)
  assert hooks.batches is runs._full_batches  # pylint: disable=protected-access
  other = runs.claim(config, STATE, _tr('update_dp'), sizes)
  assert runs.ran(config, STATE, _tr('update_dp'), other, sizes)[0] is other.hooks
  idx, rows, weights = runs._full_batches(None, np.asarray([1.0, 1.0, 0.0]), epochs=2,  # pylint: disable=protected-access
                                          batch_size=2)
  assert idx.shape == rows.shape == (2, 2, 3) and weights.shape == (2, 2)
  np.testing.assert_array_equal(np.asarray(rows)[1, 1], [1.0, 1.0, 0.0])
  np.testing.assert_array_equal(np.asarray(idx)[0, 1], [0, 1, 2])


@pytest.mark.parametrize('plant,factor', [('half_noise', 2.0), ('clip_mismatch', 1.0)])
def test_ldp_sgd_only_half_noise_doubles_the_per_report_epsilon(captured, plant, factor):
  sizes = np.full(20, 16)
  config = _config(plant)
  claimed = runs.claim(config, STATE, _tr('ldp_sgd', eps=6.0), sizes)
  n = len(captured)
  runs.ran(config, STATE, _tr('ldp_sgd', eps=6.0), claimed, sizes)
  per_report = 6.0 / int(config.training_audit.num_rounds)
  assert captured[n][0]['epsilon'] == pytest.approx(factor * per_report)
  # The claimed hooks configured the per-report epsilon itself.
  assert captured[n - 1][0]['epsilon'] == pytest.approx(per_report)
