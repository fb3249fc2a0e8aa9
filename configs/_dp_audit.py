"""The `dp_audit` config section: every DP mechanism audited against its own claim.

Used by `python -m experiments.dp_audit` (white-box canary games after Nasr et al., "Tight
Auditing of Differentially Private Machine Learning", USENIX Security 2023,
arXiv:2302.07956). The dataset configs call `section(dataset, smoke)`; every field is
documented in `section`'s docstring. The audit needs no data: its releases are small vectors.
Expected results: docs/experiments/dp_audit.md.
"""

from __future__ import annotations

import ml_collections

# The mechanisms the audit knows, in the order the tables list them. The pipeline
# (`fl_privacy.pipelines.dp_audit.MECHANISMS`) holds the same tuple; a test checks they agree.
MECHANISMS = ('dp_sgd_poisson', 'dp_sgd_shuffle', 'update_dp', 'central_dp', 'weak_dp',
              'gaussian', 'ldp_sgd')


def section(dataset: str, smoke: bool) -> ml_collections.ConfigDict:
  """The `dp_audit` section (the same for every dataset: the audit reads no data).

  Fields (the sweep is mechanisms x epsilons; each point calibrates the mechanism to the
  claimed epsilon with `fl_privacy.accounting` and plays `num_trials` in-world and
  `num_trials` out-world games):
    mechanisms: subset of ('dp_sgd_poisson', 'dp_sgd_shuffle', 'update_dp', 'central_dp',
      'weak_dp', 'gaussian', 'ldp_sgd').
    epsilons: claimed epsilons, each a finite number > 0 (default 1, 2, 4, 8).
    delta: the claims' delta, in (0, 1) (1e-5). ldp_sgd is pure epsilon-DP and ignores it in
      its claim (its bounds are still computed at this delta).
    confidence: confidence of every lower bound and interval, in (0.5, 1) (0.95; the
      Clopper-Pearson and GDP bounds of `fl_privacy.eval.auditing` need a significance
      below 1/2).
    num_trials: games per point, an integer >= 1: each game's world (canary in or out) is
      an independent fair coin, as the one-run bounds assume, so n_in + n_out = num_trials.
    dimension: length d >= 2 of every released vector (8): the canary lives on coordinate 0,
      the other contributions (known to the adversary) on coordinates 1..d-1.
    clip_norm: C > 0, the clip norm of every clipping mechanism (1). The Gaussian input
      mechanism's two inputs are 0 and C e_1 (L2 distance C, its sensitivity).
    canary_norm: the canary's L2 norm in units of C, >= 1 (2: above the clip, so the real
      clip has to act for the claim to hold).
    num_examples, batch_size, epochs: DP-SGD's dataset size n, batch size B and epochs
      (100, 10, 1: 10 steps of q = B / n = 0.1 for dp_sgd_poisson; dp_sgd_shuffle declares
      one release per epoch, so its adversary reads the canary's step of every epoch).
    rounds: rounds of update_dp and central_dp (5); weak_dp declares one round, so its
      adversary reads one round.
    num_clients: K clients of central_dp and weak_dp, all taking part each round (4).
    ldp_reports: LDP-SGD reports per game (1); the claim is split evenly over them.
    noise_scale_factor: TEST/DIAGNOSTIC KNOB, > 0 (1.0): the mechanisms run with their
      calibrated noise multiplied by this factor (LDP-SGD at epsilon / factor) while the
      claim stays the calibrated one. 0.5 plants a "halved noise" bug that the audit must
      flag; never set it for a real audit.
    profile_mechanism, profile_epsilon: the point whose empirical privacy profile delta(eps)
      is drawn against the accountant's (fig_dp_audit_profile.png); it must be one of the
      swept points to be drawn.
  A field no audited mechanism reads (DP-SGD's sizes without DP-SGD, `rounds` without a
  federated mechanism, `num_clients` without central_dp or weak_dp, `ldp_reports` without
  ldp_sgd) is refused if set on the command line (exit 2).
  """
  del dataset  # the audit reads no data
  s = ml_collections.ConfigDict()
  s.mechanisms = MECHANISMS
  s.epsilons = (1.0, 2.0, 4.0, 8.0)
  s.delta = 1e-5
  s.confidence = 0.95
  s.num_trials = 200_000
  s.dimension = 8
  s.clip_norm = 1.0
  s.canary_norm = 2.0
  s.num_examples = 100
  s.batch_size = 10
  s.epochs = 1
  s.rounds = 5
  s.num_clients = 4
  s.ldp_reports = 1
  s.noise_scale_factor = 1.0
  s.profile_mechanism = 'update_dp'
  s.profile_epsilon = 2.0
  if smoke:
    s.epsilons = (1.0, 4.0)
    s.num_trials = 4_000
    s.profile_epsilon = 1.0
  return s
