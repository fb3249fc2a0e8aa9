"""The `ldp_audit` config section: empirical lower bounds of LDP (the LDP-audit paper).

Used by `python -m experiments.ldp_audit` (Matsumoto et al., "Measuring Lower Bounds of Local
Differential Privacy via Adversary Instantiations in Federated Learning", arXiv:2206.09122).
The dataset configs call `section(dataset, smoke)`; every field is documented in `section`'s
docstring. Expected results are in docs/experiments/ldp_audit.md.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

# The allowed names live with the code that implements them; the defaults sweep all of them.
from fl_privacy.attacks.audit import CRAFTERS
from fl_privacy.attacks.audit import DISTINGUISHERS

# Datasets the experiment runs on, and the global model's pre-training per dataset: a few
# hundred SGD steps put theta_t where the paper's audit starts (a model in training, not at
# initialisation); the tiny digits set needs fewer.
_PRETRAIN_STEPS = {'digits': 150, 'npz': 150}


def section(dataset: str, smoke: bool) -> ml_collections.ConfigDict:
  """The `ldp_audit` section for `dataset`.

  Fields (audit of `mechanism`; the sweep is crafters x distinguishers x epsilons for
  'ldp_sgd', and epsilons alone for the input mechanisms):
    mechanism: 'ldp_sgd' (the paper: LDP-SGD, Algorithms 1-2), or an input mechanism audited
      beyond the paper: 'bitrand', 'ome' (bitwise randomizers of the AMI paper, on the fixed-point
      encoding) or 'gaussian' (the Gaussian mechanism, (eps, delta)-DP).
    crafters: subset of ('benign', 'input_perturbation', 'parameter_retrogression',
      'gradient_flip', 'collusion', 'dummy_gradient') (Table 1). ldp_sgd only.
    distinguishers: subset of ('black_box', 'white_box'): black-box sees only theta_{t+1} (Eq. 4,
      6 or 7 per crafter as in Table 1), white-box the report (cosine, Eq. 5). ldp_sgd only.
    epsilons: claimed epsilons to audit, each > 0 (paper: 0.5, 1, 2, 4).
    num_trials: trials per point (paper: 10,000 per measurement). 10^6 runs in bounded memory
      (one runner chunk at a time: `game.chunk_size`, or sized by bytes when None).
    clip_norm: L, LDP-SGD's clipping norm, > 0 (paper: 1).
    pretrain_steps, pretrain_lr, batch_size: plain SGD that brings the AuditCNN (Table 2 CNN,
      'SAME' padding so 8x8 digits fit) from initialisation to the audited global model theta_t.
    split: the split the crafter's examples (and the training data) come from.
    candidates: how many random examples of `split` the crafter screens for x1 and x2, at
      most the split's size.
    target_selection: 'max_grad_norm' (x1 = the candidate with the largest gradient norm at
      theta_t, x2 = the largest among the other labels: the crafter picks what LDP-SGD's norm
      projection flips least; the paper does not say how its images were picked) or 'random'
      (the first candidates, x2 of another label).
    fgsm_alpha: FGSM step of `input_perturbation` (paper: 1, on [0, 1] images, unclipped).
    retrogression_alpha: step of theta' = theta_t + alpha grad f(x1; theta_t) (the paper gives
      no value; 1).
    collusion_label, collusion_steps, collusion_lr: the colluding server's model is theta_t
      trained with SGD on images of the single class `collusion_label`; x1 is then chosen among
      the candidates of other classes.
    white_box_path: 'projected' (default: the exact shortcut
      `mechanisms.ldp_sgd.randomize_in_subspace`: the cosine test needs only the report's
      coordinates in span(g1, g2), drawn in O(1) per trial with the same law; 10^6 trials take
      well under a second) or 'literal' (every trial runs Algorithm 1 on the full d-dim
      gradient; about 10^4 trials/s on 2 CPU cores at d = 13,722). Tests check that both paths'
      outcome rates agree within their intervals. Black-box trials always run the literal path.
    server_lr: the server's step size eta_t; None = derived by `server_lr_rule`.
    server_lr_rule: 'relative' (default): eta_t = server_step_fraction * ||C|| / debias, so one
      client's server step has norm server_step_fraction * ||C|| exactly (the estimate's norm is
      the debiasing constant; derivation in `mechanisms.ldp_sgd.relative_learning_rate`);
      'paper': Algorithm 2's eta_t = ||C|| sqrt(n) / (L sqrt(d)) * (e^eps - 1)/(e^eps + 1),
      n = 1, which with the unbiased constant makes every step ~1.25 ||C|| (larger than the
      model, so loss-based black-box tests give nearly the same answer on every trial).
    server_step_fraction: the step's norm as a fraction of ||C|| under 'relative', in (0, 1]
      (1e-3: the update-to-weight ratio of ordinary training).
    radius: radius of the parameter set C (the server projects onto this L2 ball); None = the
      norm of the model the server updates (so theta_t lies on C's boundary).
    violation_confidence: one-sided level of the bound behind the `privacy_violation` flag,
      in [0.95, 1) (a violation is not claimed at less); None = family-wise 95% over the
      sweep's points (1 - 0.05 / number of points).
    num_features, int_bits, frac_bits, sign_bit: input mechanisms' vector: r features in the
      fixed-point format (AMI paper: 512 features, 1 + 5 + 4 bits). The audited pair is the
      all-zero vector and the all-maximum vector (every magnitude bit differs), both inside
      the non-negative embedding range. The distinguisher is the exact likelihood-ratio test
      (bits are independent given the input) on the probabilities the draw realises.
    input_pair: the audited pair of BitRand/OME: 'extreme_pair' (all features differ, 0 vs
      maximum: the whole-vector guarantee) or 'one_feature_pair' (only feature 0 differs: the
      per-feature guarantee, which 10,000 trials can measure without saturating).
    rng_bits: BitRand's random-word resolution (32 exact, 16 the fast draw).
    ome_alpha: OME's alpha (AMI paper: 100).
    delta, sensitivity: the Gaussian mechanism's delta and L2 sensitivity (sigma from
      `mechanisms.gaussian.sigma_for`); its pair ('sensitivity_pair') is 0 and sensitivity * e_1.
  """
  s = ml_collections.ConfigDict()
  s.mechanism = 'ldp_sgd'
  s.crafters = CRAFTERS
  s.distinguishers = DISTINGUISHERS
  s.epsilons = (0.5, 1.0, 2.0, 4.0)
  s.num_trials = 10_000
  s.clip_norm = 1.0
  s.pretrain_steps = _PRETRAIN_STEPS.get(dataset, 500)
  s.pretrain_lr = 0.05
  s.batch_size = 64
  s.split = 'train'
  s.candidates = 256
  s.target_selection = 'max_grad_norm'
  s.white_box_path = 'projected'
  s.fgsm_alpha = 1.0
  s.retrogression_alpha = 1.0
  s.collusion_label = 0
  s.collusion_steps = 100
  s.collusion_lr = 0.05
  s.server_lr = config_dict.placeholder(float)
  s.server_lr_rule = 'relative'
  s.server_step_fraction = 1e-3
  s.radius = config_dict.placeholder(float)
  s.violation_confidence = config_dict.placeholder(float)
  s.num_features = 512
  s.int_bits = 5
  s.frac_bits = 4
  s.sign_bit = True
  s.rng_bits = 32
  s.input_pair = 'extreme_pair'
  s.ome_alpha = 100.0
  s.delta = 1e-5
  s.sensitivity = 1.0
  if smoke:
    s.crafters = ('benign', 'gradient_flip', 'dummy_gradient')
    s.epsilons = (1.0, 4.0)
    s.num_trials = 1000
    s.pretrain_steps = 20
    s.candidates = 32
    s.collusion_steps = 20
    s.num_features = 64
  return s
