"""The `training_audit` config section: canaries inside the FL training that runs.

Used by `python -m experiments.training_audit` (one-run audits after Steinke, Nasr, Jagielski,
"Privacy Auditing with One (1) Training Run", NeurIPS 2023, arXiv:2305.08846, and Andrew et
al., "One-shot Empirical Privacy Estimation for Federated Learning", ICLR 2024,
arXiv:2302.03098). Every DP defense of the `defense` section is configured by the calls the
experiments use (`defenses.configured.configure`) and run by the experiments' round loop
(`fl.rounds.run`: client protocol, participation sampling, upload hook, aggregate hook) with
canary clients or canary examples added. Expected results: docs/experiments/training_audit.md.

  python -m experiments.training_audit                                  # ~2 min cold (2 cores)
  python -m experiments.training_audit --config=configs/digits.py:smoke  # ~1-2 min (CI)

Expect no privacy violation; with independent canaries (canary clients, all iterates) update_dp
and central_dp certify about 0.65 of a claim of 8 and estimate about 0.86 of it; the server's
view of DP-SGD estimates about 3.3 at a claimed 8 (docs/experiments/training_audit.md).
"""

from __future__ import annotations

import ml_collections

# The DP defenses the audit knows, each with the samplings it offers, in table order
# (`fl_privacy.pipelines.training_audit.SAMPLINGS` holds the same; a test checks they agree).
DEFENSES = ('dp_sgd', 'update_dp', 'central_dp', 'weak_dp', 'ldp_sgd')
PLANTS = ('none', 'half_noise', 'poisson_full_batch', 'participation_not_run',
          'clip_mismatch', 'one_composition')


def section(dataset: str, smoke: bool) -> ml_collections.ConfigDict:
  """The `training_audit` section.

  Fields (the sweep is defenses x their samplings x claimed epsilons x canary kinds; each
  combination is ONE training, scored under both threats):
    defenses: subset of ('dp_sgd', 'update_dp', 'central_dp', 'weak_dp', 'ldp_sgd').
    samplings: the samplings to run, a subset of ('poisson', 'shuffle', 'none',
      'without_replacement') (all): dp_sgd offers Poisson and shuffled batches, central_dp
      and weak_dp every client each round ('none') or `participation` of them drawn without
      replacement, update_dp and ldp_sgd 'none'.
    epsilons: claimed epsilons, each a finite number > 0 (2, 8). Each defense's noise is
      calibrated to the claim by the registry (`defense.target_epsilon`); weak_dp's claim is
      per round, and it is audited against its composed epsilon over the rounds that run.
    delta: the claims' delta (1e-5); confidence: family-wise confidence of each verdict (0.95).
    clip_norm: C of every clipping defense (1.0).
    participation: the fraction of clients drawn per round in the 'without_replacement'
      sampling of central_dp and weak_dp (0.5); their 'none' sampling has every client take
      part.
    record_kinds: canary kinds of the record-level dp_sgd: subset of ('gradient', 'input').
    threats: subset of ('all_iterates', 'last_iterate').
    num_canary_clients: canary clients J of the client-level defenses (2000).
    num_canary_examples: canary rows m of dp_sgd, spread over the clients (1000; at most the
      model's parameter count for gradient canaries).
    canary_norm: the canary update's / gradient's norm in units of C, >= 1 (2.0).
    direction: the canary clients' directions, 'dirac' (distinct coordinates: at most the
      model's parameter count; the default, which makes the canaries of the aggregate's
      readers independent trials) or 'random' (unit vectors).
    model, hidden, num_clients, per_client, batch_size, epochs, num_rounds, optimizer,
      learning_rate: the training (an MLP on digits; 10 clients of 32 rows, B = 8, E = 1,
      T = 5, SGD lr 0.5).
    plant: TEST KNOB ('none'): plants a wiring bug the audit must flag: 'half_noise' (every
      defense runs half its calibrated noise; ldp_sgd twice its epsilon), 'poisson_full_batch'
      (dp_sgd's noise calibrated for Poisson batches while every row takes part in every step),
      'participation_not_run' (amplification by participation claimed, every client takes
      part), 'clip_mismatch' (the noise computed from C while the clip applied is 2C),
      'one_composition' (the noise calibrated for one round, T rounds run). Never set it for a
      real audit.
  """
  del dataset
  s = ml_collections.ConfigDict()
  s.defenses = DEFENSES
  s.samplings = ('poisson', 'shuffle', 'none', 'without_replacement')
  s.epsilons = (2.0, 8.0)
  s.delta = 1e-5
  s.confidence = 0.95
  s.clip_norm = 1.0
  s.participation = 0.5
  s.record_kinds = ('gradient', 'input')
  s.threats = ('all_iterates', 'last_iterate')
  s.num_canary_clients = 2000
  s.num_canary_examples = 1000
  s.canary_norm = 2.0
  s.direction = 'dirac'
  s.model = 'mlp'
  s.hidden = (32,)
  s.num_clients = 10
  s.per_client = 32
  s.batch_size = 8
  s.epochs = 1
  s.num_rounds = 5
  s.optimizer = 'sgd'
  s.learning_rate = 0.5
  s.plant = 'none'
  if smoke:
    s.epsilons = (2.0,)
    s.num_canary_clients = 200
    s.num_canary_examples = 200
    s.num_rounds = 2
  return s
