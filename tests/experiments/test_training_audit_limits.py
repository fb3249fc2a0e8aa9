"""Plants that no feasible number of canaries flags, not waved through: simulations of the
mechanism's own trade-off curve (`canary_statistics.simulated_needed`) show the number of
canaries that would flag them, for the default cross-device federation's claims
(docs/experiments/training_audit.md, Limits, states these numbers).

- Half the noise of central_dp and weak_dp under participation sampling (a tenth of the
  clients a round, T = 10): the subsampled curve at half noise stays within what the audit's
  tests can tell from the claim's, even with independent canaries: none up to 2^12 here (and
  none up to 2^20 in a longer run, 137 s per claim; the docs give it).
- LDP-SGD at twice a claim of 8 (randomized response at 1.6 a report over 10 reports, the
  tightest curve an epsilon-DP report allows): 2^17 canaries, 256 times the default's 512.
  At twice a claim of 2 it is flagged in the training itself (test_training_audit_noise.py).
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

from configs import digits
from fl_privacy import accounting
from fl_privacy.attacks.audit import canary_statistics as cs
from fl_privacy.pipelines import training_audit as ta
from fl_privacy.pipelines import training_audit_runs as runs

DELTA = 1e-5


@functools.lru_cache(maxsize=1)
def _default():
  c = digits.get_config('')
  return c, ta.prepare(c)


@pytest.mark.parametrize('claim', [2.0, 8.0])
@pytest.mark.parametrize('defense', ['central_dp', 'weak_dp'])
def test_half_noise_of_the_sampled_aggregate_is_beyond_any_feasible_canaries(defense, claim):
  c, state = _default()
  tr = dict(defense=defense, sampling='without_replacement', claimed_epsilon=claim,
            canary='client')
  claimed = runs.claim(c, state, tr)
  decl, z = claimed.declaration, claimed.metrics['noise_multiplier']
  rounds = int(c.training_audit.client.num_rounds)
  composed = decl if defense == 'central_dp' else dataclasses.replace(decl,
                                                                      compositions=rounds)
  profile = lambda g: accounting.delta_curve(composed, z, g)
  q = decl.sample_size / decl.population
  assert 0.09 < q < 0.11
  half = cs.Curve(steps=rounds, noise=z / 2, rate=q, relation='replace_one')
  mech = ta.mechanism(tr, runs.participation(c, tr))
  # From 1,024 (the default row holds 555 canaries) to 4,096, as the pipeline counts them
  # (dependent) and as independent trials.
  for independent in (False, True):
    assert cs.simulated_needed(half, mech, float(claimed.metrics['dp_epsilon']), delta=DELTA,
                               confidence=0.95, independent=independent,
                               claimed_delta=profile, start=1024, cap=1 << 12) is None
  # Where a perfect attack with that many canaries could refute the claim, the same search
  # flags a plant it can see (a fortieth of the noise, every client every round); weak_dp's
  # composed claim of 8 a round (18.6) is beyond 2^12 canaries even for a perfect attack.
  audited = float(claimed.metrics['dp_epsilon'])
  needed = cs.canaries_needed(mech, audited, delta=DELTA, confidence=0.95, independent=True,
                              claimed_delta=profile)
  assert needed is not None
  if needed <= 1 << 12:
    loud = dataclasses.replace(half, noise=z / 40, rate=1.0)
    assert cs.simulated_needed(loud, mech, audited, delta=DELTA, confidence=0.95,
                               independent=True, claimed_delta=profile, start=1024,
                               cap=1 << 12) is not None
  else:
    assert defense == 'weak_dp' and claim == 8.0


def test_ldp_sgd_at_twice_a_claim_of_8_needs_a_hundred_thousand_canaries():
  c, _ = _default()
  rounds = int(c.training_audit.client.num_rounds)
  decl = accounting.ldp_sgd(epsilon_per_report=8.0 / rounds, rounds=rounds)
  profile = lambda g: accounting.delta_curve(decl, None, g)
  twice = cs.Curve(steps=rounds, rr_epsilon=2 * 8.0 / rounds, relation='replace_one')
  n = cs.simulated_needed(twice, 'ldp_sgd', 8.0, delta=DELTA, confidence=0.95,
                          independent=True, claimed_delta=profile, cap=1 << 18)
  assert n is not None and n >= 64 * int(c.training_audit.client.canaries)
  # At the claim itself the same search finds nothing: the flag comes from the plant.
  at_claim = dataclasses.replace(twice, rr_epsilon=8.0 / rounds)
  assert cs.simulated_needed(at_claim, 'ldp_sgd', 8.0, delta=DELTA, confidence=0.95,
                             independent=True, claimed_delta=profile, start=n,
                             cap=n) is None
