"""Halved noise in the training that runs is flagged, and noise computed from another clip
than the one applied (see training_audit_plants.py)."""

from __future__ import annotations

import pytest

from tests.experiments import training_audit_plants as plants

# weak_dp runs central_dp's mechanism (calibrated per round): flagged the same way.
DEFENSES = ('update_dp', 'central_dp')


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  return {
      'half': plants.run(tmp_path_factory, 'half', DEFENSES, ('none',), 'half_noise'),
      'none': plants.run(tmp_path_factory, 'none', DEFENSES, ('none',)),
      'clip': plants.run(tmp_path_factory, 'clip', ('update_dp',), ('none',), 'clip_mismatch'),
  }


@pytest.mark.parametrize('defense', DEFENSES)
def test_half_noise_is_flagged(runs, defense):
  key = (defense, 'none', 'client')
  plants.flagged(runs['half'], runs['none'], key)
  assert float(runs['half'][key]['gdp_mu_estimate']) > 1.6 * float(
      runs['none'][key]['gdp_mu_estimate'])


# LDP-SGD at twice its epsilon is flagged by the mechanism audit (test_dp_audit.py); in one
# training it takes 6,000 random-direction canary clients (a 70 s run kept out of the suite):
#   python -m experiments.training_audit --config=configs/digits.py:smoke \
#     --config.training_audit.defenses="('ldp_sgd',)" --config.training_audit.plant=half_noise \
#     --config.training_audit.direction=random --config.training_audit.num_canary_clients=6000


def test_noise_from_another_clip_than_the_one_applied_is_flagged(runs):
  plants.flagged(runs['clip'], runs['none'], ('update_dp', 'none', 'client'))
