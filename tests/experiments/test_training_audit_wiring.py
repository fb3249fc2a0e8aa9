"""Wiring bugs between a claim and the training that runs are flagged by the training audit at
claims 2 and 8 (training_audit_plants.py): one composition counted for many rounds,
amplification by participation claimed but not run, Poisson noise with every row in every
step, and the side channels: a Poisson schedule that follows the shard's private row count,
and real row counts reported as FedAvg's weights."""

from __future__ import annotations

import pytest

from tests.experiments import training_audit_plants as plants

CLAIMS = (2.0, 8.0)


def _pair(plant, defense, sampling, claim, canary, threat, **fields):
  return (plants.audit(plants.config(plant, **fields), defense, sampling, claim, canary, threat),
          plants.audit(plants.config('none', **fields), defense, sampling, claim, canary,
                       threat))


@pytest.mark.parametrize('claim', CLAIMS)
def test_one_composition_counted_for_many_rounds_is_flagged(claim):
  plants.flagged(*_pair('one_composition', 'central_dp', 'none', claim, 'client',
                        'all_iterates'))


@pytest.mark.parametrize('claim', CLAIMS)
def test_participation_amplification_claimed_but_not_run_is_flagged(claim):
  # 5% of the clients claimed a round, every client taking part: the canaries, read every
  # round, are independent trials (no sample couples them).
  planted, baseline = _pair('participation_not_run', 'central_dp', 'without_replacement',
                            claim, 'client', 'all_iterates', **{'client.participation': 0.05})
  plants.flagged(planted, baseline)
  assert planted['participation_run'] == 1.0 and baseline['participation_run'] == 0.05
  assert planted['canaries_independent'] == 1.0


@pytest.mark.parametrize('claim', CLAIMS)
def test_poisson_noise_with_every_row_in_every_step_is_flagged(claim):
  plants.flagged(*_pair('poisson_full_batch', 'dp_sgd', 'poisson', claim, 'gradient',
                        'all_steps', **{'record.canaries': 600}))


@pytest.mark.parametrize('claim', CLAIMS)
def test_a_schedule_that_follows_the_private_row_count_is_flagged_by_the_side_channel(claim):
  planted, baseline = _pair('data_dependent_schedule', 'dp_sgd', 'poisson', claim,
                            'side_channel', 'side_channel')
  plants.flagged(planted, baseline)
  # One record more where n is a multiple of B: one noisy step more, which the count shows.
  assert planted['side_noisy_steps_in_mean'] > planted['side_noisy_steps_out_mean']
  assert baseline['side_noisy_steps_in_mean'] == baseline['side_noisy_steps_out_mean']


@pytest.mark.parametrize('claim', CLAIMS)
@pytest.mark.parametrize('defense', ['dp_sgd', 'update_dp'])
def test_real_row_counts_reported_as_weights_are_flagged_by_the_side_channel(defense, claim):
  sampling = 'poisson' if defense == 'dp_sgd' else 'none'
  planted, baseline = _pair('reported_rows', defense, sampling, claim, 'side_channel',
                            'side_channel')
  plants.flagged(planted, baseline)
  assert planted['side_reported_examples_in_mean'] == (
      planted['side_reported_examples_out_mean'] + 1)
