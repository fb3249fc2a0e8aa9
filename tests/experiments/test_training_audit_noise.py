"""Halved noise in the training that runs is flagged, and noise computed from another clip
than the one applied (see training_audit_plants.py)."""

from __future__ import annotations

import pytest

from tests.experiments import training_audit_plants as plants

DEFENSES = ('update_dp', 'central_dp', 'weak_dp')
LDP = ('--config.training_audit.direction=random',
       '--config.training_audit.num_canary_clients=6000')


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  return {
      'half': plants.run(tmp_path_factory, 'half', DEFENSES, ('none',), 'half_noise'),
      'none': plants.run(tmp_path_factory, 'none', DEFENSES, ('none',)),
      'clip': plants.run(tmp_path_factory, 'clip', ('update_dp',), ('none',), 'clip_mismatch'),
      'ldp_half': plants.run(tmp_path_factory, 'ldp_half', ('ldp_sgd',), ('none',),
                             'half_noise', *LDP),
      'ldp_none': plants.run(tmp_path_factory, 'ldp_none', ('ldp_sgd',), ('none',), 'none',
                             *LDP),
  }


@pytest.mark.parametrize('defense', DEFENSES)
def test_half_noise_is_flagged(runs, defense):
  key = (defense, 'none', 'client')
  plants.flagged(runs['half'], runs['none'], key)
  assert float(runs['half'][key]['gdp_mu_estimate']) > 1.6 * float(
      runs['none'][key]['gdp_mu_estimate'])


def test_ldp_sgd_at_twice_its_epsilon_is_flagged(runs):
  plants.flagged(runs['ldp_half'], runs['ldp_none'], ('ldp_sgd', 'none', 'client'))


def test_noise_from_another_clip_than_the_one_applied_is_flagged(runs):
  plants.flagged(runs['clip'], runs['none'], ('update_dp', 'none', 'client'))
