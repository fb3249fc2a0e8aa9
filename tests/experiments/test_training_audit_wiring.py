"""Wiring bugs between a claim and the training that runs are flagged (training_audit_plants.py)."""

from __future__ import annotations

import pytest

from tests.experiments import training_audit_plants as plants

ROUNDS = '--config.training_audit.num_rounds=6'
PARTICIPATION = '--config.training_audit.participation=0.05'


@pytest.fixture(scope='module')
def baseline(tmp_path_factory):
  return plants.run(tmp_path_factory, 'baseline', ('dp_sgd', 'central_dp'),
                    ('poisson', 'none', 'without_replacement'), 'none', ROUNDS, PARTICIPATION)


def _planted(tmp_path_factory, plant, defenses, samplings):
  return plants.run(tmp_path_factory, plant, defenses, samplings, plant, ROUNDS, PARTICIPATION)


def test_one_composition_counted_for_many_rounds_is_flagged(tmp_path_factory, baseline):
  planted = _planted(tmp_path_factory, 'one_composition', ('central_dp',), ('none',))
  plants.flagged(planted, baseline, ('central_dp', 'none', 'client'))


def test_participation_amplification_claimed_but_not_run_is_flagged(tmp_path_factory,
                                                                   baseline):
  planted = _planted(tmp_path_factory, 'participation_not_run', ('central_dp',),
                     ('without_replacement',))
  plants.flagged(planted, baseline, ('central_dp', 'without_replacement', 'client'))


def test_poisson_noise_with_every_row_in_every_step_is_flagged(tmp_path_factory, baseline):
  planted = _planted(tmp_path_factory, 'poisson_full_batch', ('dp_sgd',), ('poisson',))
  plants.flagged(planted, baseline, ('dp_sgd', 'poisson', 'gradient'))


