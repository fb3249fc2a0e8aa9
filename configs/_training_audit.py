"""The `training_audit` config section: canaries inside the FL trainings that run.

Used by `python -m experiments.training_audit` (one-run audits after Steinke, Nasr, Jagielski,
"Privacy Auditing with One (1) Training Run", NeurIPS 2023, arXiv:2305.08846; DP-SGD's own
per-step adversary after Nasr et al., "Tight Auditing of Differentially Private Machine
Learning", USENIX Security 2023, arXiv:2302.07956; canary clients after Andrew et al.,
"One-shot Empirical Privacy Estimation for Federated Learning", ICLR 2024, arXiv:2302.03098).
Every DP defense of the `defense` section is configured by the calls the experiments use
(`defenses.configured.configure`) and run by the experiments' round loop (`fl.rounds.run`:
client protocol, participation sampling, upload hook, aggregate hook) with canary clients or
canary examples added, in a federation that learns: record-level DP-SGD cross-silo, the
client-level defenses cross-device, canaries at most a tenth of each shard or of each round's
participants. Expected results: docs/experiments/training_audit.md.

  python -m experiments.training_audit                                  # ~5.5 min cold (2 cores)
  python -m experiments.training_audit --config=configs/digits.py:smoke  # ~2 min

Expect no privacy violation; DP-SGD read at every step (`all_steps`) certifies at least half
of a shuffled claim and, Poisson-sampled, about what an optimal attack with as many canaries
certifies; rows whose canaries cannot refute their claim say so and give the number that
would (docs/experiments/training_audit.md).
"""

from __future__ import annotations

import ml_collections

# The DP defenses the audit knows, each with the samplings it offers, in table order
# (`fl_privacy.pipelines.training_audit.SAMPLINGS` holds the same; a test checks they agree).
DEFENSES = ('dp_sgd', 'update_dp', 'central_dp', 'weak_dp', 'ldp_sgd')
PLANTS = ('none', 'half_noise', 'poisson_full_batch', 'participation_not_run',
          'clip_mismatch', 'one_composition', 'data_dependent_schedule', 'reported_rows')
THREATS = ('all_steps', 'all_iterates', 'last_iterate', 'side_channel')


def section(dataset: str, smoke: bool) -> ml_collections.ConfigDict:
  """The `training_audit` section.

  Fields (the sweep is defenses x their samplings x claimed epsilons x canary kinds; each
  combination is R replicate trainings, scored under every threat that reads its canaries, and
  one side-channel game):
    defenses: subset of ('dp_sgd', 'update_dp', 'central_dp', 'weak_dp', 'ldp_sgd').
    samplings: per defense, the samplings to run (a tuple from the ones it offers):
      dp_sgd ('poisson', 'shuffle'): Poisson or shuffled batches; update_dp ('none',) and
      ldp_sgd ('none',): no amplification (the server picks who takes part, so the canaries
      take part every round); central_dp and weak_dp ('without_replacement',), or 'none':
      what the claim assumes of participation, amplification by the round's sample of
      `client.participation` of the clients, or none. The cross-device federation draws that
      fraction every round whatever the claim, so a 'none' claim of an aggregate's reader is
      audited loosely there (its canaries are not independent trials); set
      `client.participation=1` for every client every round.
    epsilons: claimed epsilons, each a finite number > 0 (2, 8). Each defense's noise is
      calibrated to the claim by the registry (`defense.target_epsilon`); weak_dp's claim is
      per round, and it is audited against its epsilon composed over the rounds that run (the
      per-round one beside it).
    delta: the claims' delta (1e-5); confidence: family-wise confidence of each verdict (0.95);
      accountant: 'rdp' or 'pld', the claims' accountant (the defense's default, 'rdp').
    clip_norm: C of every clipping defense (1.0).
    record_kinds: canary kinds of the record-level dp_sgd: subset of ('gradient', 'input').
    threats: subset of ('all_steps', 'all_iterates', 'last_iterate', 'side_channel'):
      `all_steps` is DP-SGD's own adversary (every noisy step; gradient canaries only),
      `side_channel` the adversary of what a projection cannot see (norms, noisy steps,
      reported counts).
    side_channel_trials: the side-channel game's independent trials per row (1000);
      side_channel_others: clients beside the target when the adversary reads the aggregate.
    canary_norm: the canary update's / gradient's norm in units of C, >= 1 (2.0).
    direction: the canary clients' directions, 'random' (a uniformly random orthonormal frame:
      uniform unit vectors, exactly orthogonal; the default) or 'dirac'.
    model: 'mlp' (each federation's `hidden` widths).
    optimizer: the clients' local optimizer ('sgd').
    record: the cross-silo federation of dp_sgd: num_clients (10), per_client (114 rows, the
      public record count N its Poisson schedule declares: q = B / N, ceil(N / B) steps an
      epoch), canaries_per_client (12 gradient canaries: a tenth of a shard's rows),
      input_per_client (6 input canaries, mislabelled images, fewer: they train the model on
      wrong labels; 114 + 6 rows keep a shuffled epoch's 10 steps), batch_size (12), epochs
      (1), num_rounds (5), learning_rate (0.5), twins (replicate trainings rerun without
      canaries, for the accuracy comparison: 32), hidden
      ((32,): 64-32-10, 2,410 parameters), canaries (gradient canaries a row, pooled over
      replicate trainings: 16384; a row runs ceil(canaries / canaries a training) trainings),
      input_canaries (the same for input canaries, whose one-run bounds gain little from
      more: 512).
    client: the cross-device federation of the client-level defenses: num_clients (1000 real
      clients), per_client (1 row), participation (0.1 of them each round), canary_share (at
      most 0.1 of a round's participants), batch_size (1), epochs (1), num_rounds (10),
      learning_rate (0.5), twins (8), hidden ((134,): 64-134-10, 10,060 parameters), canaries
      (canary clients a row, pooled over replicate trainings: 512).
    chunk: replicate trainings per compiled call (8).
    power_draws: simulations per noise factor of each row's power (20): for a row whose scores
      are the claimed mechanism's own statistic, the smallest planted bug it detects at 95%
      (`attacks.audit.audit_power`: the row's canaries, statistic and tests on scores drawn
      with the noise scaled by a factor, not whole trainings); power_factors: the factors
      tried (0.1 ... 0.95, bisected); simulated_draws: simulations of the optimal attack on
      the claimed mechanism (20; its median and interval, and the false alarms there);
      0 skips either (the plant tests' setting).
    mle_test: whether Poisson DP-SGD rows fit their per-step readings by maximum likelihood
      and test the claim's (epsilon, delta) point through dp-accounting's PLD
      (`attacks.audit.poisson_mle`: `epsilon_mle_pld`, a bound that assumes the
      Poisson-subsampled-Gaussian family, one more test in the verdict's family; True).
    mle_power: whether each Poisson row's power simulation runs that test in every draw too
      (False: ~5-10 s a draw, ~100 draws a row, an estimated 20-40 more minutes on the
      default; the power is then that of the other tests, a family of 3, and the row's
      `power_model` says so; the MLE test's own power, false alarms and coverage at the
      default's size are measured in docs/experiments/training_audit.md, "MLE / PLD").
    plant: TEST KNOB ('none'): plants a bug the audit must flag: 'half_noise' (every
      defense runs half its calibrated noise; ldp_sgd twice its epsilon), 'poisson_full_batch'
      (dp_sgd's noise calibrated for Poisson batches while every row takes part in every step),
      'participation_not_run' (amplification by participation claimed, every client takes
      part), 'clip_mismatch' (the noise computed from C while the clip applied is 2C),
      'one_composition' (the noise calibrated for one round, T rounds run),
      'data_dependent_schedule' (Poisson DP-SGD's rate and steps from the shard's private row
      count), 'reported_rows' (clients report their real row counts as FedAvg's weights).
      Never set it for a real audit.
  """
  del dataset
  s = ml_collections.ConfigDict()
  s.defenses = DEFENSES
  s.samplings = ml_collections.ConfigDict(dict(
      dp_sgd=('poisson', 'shuffle'), update_dp=('none',), central_dp=('without_replacement',),
      weak_dp=('without_replacement',), ldp_sgd=('none',)))
  s.epsilons = (2.0, 8.0)
  s.delta = 1e-5
  s.confidence = 0.95
  s.accountant = 'rdp'
  s.clip_norm = 1.0
  s.record_kinds = ('gradient', 'input')
  s.threats = THREATS
  s.side_channel_trials = 1000
  s.side_channel_others = 9
  s.canary_norm = 2.0
  s.direction = 'random'
  s.model = 'mlp'
  s.optimizer = 'sgd'
  s.chunk = 8
  s.power_draws = 20
  s.power_factors = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
  s.simulated_draws = 20
  s.mle_test = True
  s.mle_power = False
  s.plant = 'none'
  s.record = ml_collections.ConfigDict(dict(
      num_clients=10, per_client=114, canaries_per_client=12, input_per_client=6,
      batch_size=12, epochs=1, num_rounds=5, learning_rate=0.5, twins=32, hidden=(32,),
      canaries=16384, input_canaries=512))
  s.client = ml_collections.ConfigDict(dict(
      num_clients=1000, per_client=1, participation=0.1, canary_share=0.1, batch_size=1,
      epochs=1, num_rounds=10, learning_rate=0.5, twins=8, hidden=(134,), canaries=512))
  if smoke:
    # The small canary-dominated federation: seconds a training, nothing tight.
    s.epsilons = (2.0,)
    s.side_channel_trials = 200
    s.samplings.central_dp = ('none', 'without_replacement')
    s.samplings.weak_dp = ('none', 'without_replacement')
    s.record.update(num_clients=10, per_client=32, canaries_per_client=4, input_per_client=4,
                    batch_size=8, num_rounds=2, canaries=200, input_canaries=200, twins=2)
    s.client.update(num_clients=100, participation=0.5, canary_share=0.5, num_rounds=2,
                    hidden=(32,), canaries=200, twins=2)
  return s
