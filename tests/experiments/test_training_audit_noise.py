"""Half the calibrated noise, in the training that runs, is flagged by the training audit at
claims 2 and 8: DP-SGD read at every step (Poisson and shuffled batches), update_dp, and the
aggregate's reader of central_dp and weak_dp with every client each round
(training_audit_plants.py). Where no feasible number of canaries flags it (the sampled
aggregate, LDP-SGD at twice a claim of 8), test_training_audit_limits.py shows by
simulation how many would."""

from __future__ import annotations

import pytest

from tests.experiments import training_audit_plants as plants

CLAIMS = (2.0, 8.0)


def _pair(defense, sampling, claim, canary, threat, **fields):
  planted = plants.audit(plants.config('half_noise', **fields), defense, sampling, claim,
                         canary, threat)
  baseline = plants.audit(plants.config('none', **fields), defense, sampling, claim, canary,
                          threat)
  return planted, baseline


@pytest.mark.parametrize('claim', CLAIMS)
def test_half_noise_of_poisson_dp_sgd_is_flagged_at_every_step(claim):
  # The profile test against the subsampled curve: 8,192 canaries at a claim of 2 (the
  # curve's mass sits near 0), 2,048 at 8 (simulated in canary_statistics' terms first).
  planted, baseline = _pair('dp_sgd', 'poisson', claim, 'gradient', 'all_steps',
                            **{'record.canaries': 8192 if claim == 2.0 else 2048})
  plants.flagged(planted, baseline)
  assert planted['counted_bounds'] == baseline['counted_bounds'] == (
      'epsilon_one_run,epsilon_cp,profile')
  # Half the noise reads as a larger fitted epsilon than the claim; the claim's own as about it.
  assert planted['fit_epsilon'] > claim > 0.7 * baseline['fit_epsilon']


@pytest.mark.parametrize('claim', CLAIMS)
def test_half_noise_of_shuffled_dp_sgd_is_flagged_at_every_step(claim):
  planted, baseline = _pair('dp_sgd', 'shuffle', claim, 'gradient', 'all_steps')
  plants.flagged(planted, baseline)
  assert planted['gdp_mu_estimate'] > 1.6 * baseline['gdp_mu_estimate']


@pytest.mark.parametrize('claim', CLAIMS)
@pytest.mark.parametrize('defense', ['update_dp', 'central_dp', 'weak_dp'])
def test_half_noise_of_the_client_level_defenses_is_flagged(defense, claim):
  planted, baseline = _pair(defense, 'none', claim, 'client', 'all_iterates')
  plants.flagged(planted, baseline)
  assert planted['canaries_independent'] == baseline['canaries_independent'] == 1.0
  assert planted['gdp_mu_estimate'] > 1.6 * baseline['gdp_mu_estimate']


@pytest.mark.parametrize('claim', CLAIMS)
def test_noise_from_another_clip_than_the_one_applied_is_flagged(claim):
  planted = plants.audit(plants.config('clip_mismatch'), 'update_dp', 'none', claim, 'client',
                         'all_iterates')
  baseline = plants.audit(plants.config('none'), 'update_dp', 'none', claim, 'client',
                          'all_iterates')
  plants.flagged(planted, baseline)


def test_ldp_sgd_at_twice_a_claim_of_2_is_flagged():
  planted, baseline = _pair('ldp_sgd', 'none', 2.0, 'client', 'all_iterates',
                            **{'client.canaries': 4096})
  plants.flagged(planted, baseline)
