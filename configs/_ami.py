"""The `ami` config section: active membership inference under LDP (the main job).

Used by `python -m experiments.ami` (Nguyen et al., AISTATS 2023, arXiv:2302.12685). The
dataset configs call `section(dataset, smoke)`; every field is documented in `section`.

Dataset roles (where the adversary's crafting negatives and the game pool come from):

| config | targets | adversary negatives | game pool |
|---|---|---|---|
| digits | first `num_targets` train images | a disjoint `adversary_fraction` of the rest of train | the remaining train images |
| cifar10 | first test images (paper: the first one) | the train split | the other test images |
| celeba | first train images | the validation split | train minus the targets |
| imagenette | first train images | the validation split | train minus the targets |
| npz / others | first train images | a disjoint part of train (as digits) | the rest of train |

Expected result on digits (2 CPU cores, about 1-1.5 minutes, 10,000 trials per point, seed 0;
docs/experiments/ami.md, "Expected result on digits", has the full table), the paper's decision rule: Adv
0.996 without LDP; under BitRand Adv is at chance (0.50) for epsilon <= 2 and rises to 0.74 at 5
and 0.98 at 10, with test accuracy 0.10 -> 0.82 -> 0.95; under OME Adv stays at 0.92-0.95 and
accuracy at ~0.70 for every epsilon (its 0 -> 1 probability hardly depends on epsilon). The
calibrated variant beside it (`adv_calibrated`): 0.82 at BitRand epsilon 5. Smoke (`:smoke`): 3 points of 400 trials, under a
minute, Adv >= 0.8 without LDP.
"""

from __future__ import annotations

import ml_collections

# The paper's batch sizes |D| (Section 5) and its single target per dataset.
_PAPER = {
    'celeba': dict(batch_size=20, target_split='train', adversary_split='validation',
                   pool_split='train', utility_test_split='test'),
    'cifar10': dict(batch_size=100, target_split='test', adversary_split='train',
                    pool_split='test', utility_test_split='test'),
    'imagenette': dict(batch_size=64, target_split='train', adversary_split='validation',
                       pool_split='train', utility_test_split='validation'),
}


def section(dataset: str, smoke: bool) -> ml_collections.ConfigDict:
  """The `ami` section for `dataset`.

  Fields:
    mechanisms: LDP mechanisms swept, a subset of ('none', 'bitrand', 'ome'); 'none' is the
      attack without LDP (Section 3), run once whatever `epsilons` holds.
    epsilons: privacy budgets eps (each > 0) swept for 'bitrand' and 'ome' (paper: 1..10).
    batch_size: |D|, the client's batch (paper: CelebA 20, CIFAR-10 100, Imagenette 64).
      Must not exceed the game pool.
    num_trials: security-game trials per point, alternating member (even index) and
      non-member (odd) and cycling over targets (paper: 10,000 = 5,000 + 5,000).
    num_targets: targets crafted per point (one neuron each, crafted together in one vmapped
      jit). The paper uses one target per dataset; the interval of a point is over trials
      given these crafted targets.
    num_neurons: r, first-layer neurons of the crafted block (paper: 1,000).
    hidden2: width of the MLP's second hidden layer, which holds the chosen neuron (unit 0);
      its other units and the classifier keep an honest initialisation.
    copies: l, LDP-randomized copies of the target used as positives when crafting (Fig. 4;
      the public code: 4,000). Without LDP the single target is the positive.
    max_negatives: cap on m, the adversary's negatives used for crafting (0 = all it has).
    randomize_negatives: under LDP, randomize each negative once before crafting (the public
      code does; the paper's Fig. 4 leaves X unrandomized).
    learning_rate: Adam step size of crafting (our loss is BCE on logits, so the public code's
      1e-4 / 1e-6 for a saturating sigmoid loss do not transfer).
    max_steps: step budget of crafting; crafting stops earlier at 100% separation of its
      training data when `stop_when_separated`.
    stop_when_separated: stop as soon as the training data is separated (the public code
      does without LDP; under LDP it always ran its budget).
    balanced_class_weights: weight both classes to half of the loss; otherwise use
      `class_weights` = (negative, positive) (the public code: CIFAR (0.1, 25000)).
    class_weights: see `balanced_class_weights`.
    calibrated_variant: also report our extension beside the paper's attack: the chosen
      neuron's bias shifted to maximise the predicted game Adv on held-out adversary data
      (fresh target copies and unused negatives; never the game pool), played on the same
      trials. Its metrics carry the suffix `_calibrated` (`adv_calibrated`,
      `adv_calibrated_ci_low`, ...). `adv`, `tpr`, `tnr`, ... are always the paper's rule
      (member iff the crafted v > 0). False skips the variant (half the game time).
    heldout_fraction: fraction of the adversary's negatives held out from crafting for
      the calibrated variant.
    adversary_fraction: when the adversary's split is also the pool's (digits, npz), the
      fraction of it (after the targets) given to the adversary; the rest is the pool.
    target_split, adversary_split, pool_split: dataset splits of the three roles (table in
      the module docstring).
    ldp_sign_bit: True honours the sign bit when decoding (correct); False reproduces the
      public code, whose decoder drops it (every value >= 0, sign flips ignored).
    int_bits, frac_bits: fixed-point format (1 + 5 + 4 = 10 bits per feature; range
      [-31.9375, 31.9375]). Features outside the range are clipped and counted
      (`num_clipped`).
    extractor: feature extractor ('identity' for digits: the 64 grey levels 0..16;
      'resnet18' elsewhere, as the paper's 512-d ImageNet ResNet-18 embeddings).
    extractor_weights: .npz of ResNet-18 weights (see fl_privacy/data/extractors.py); without
      it the features come from an untrained network (a loud warning says so).
    feature_scale: 'identity' only: features = pixels in [0, 1] times this (digits: 16, the
      original grey levels).
    decision_path: 'fast' (member iff some row activates the chosen neuron) or 'gradient'
      (the client's literal jax.grad of the crafted MLP on batches randomized by the exact
      per-bit mechanism; slower; rates agree with 'fast' in law and within their intervals,
      not trial by trial, since the draws differ: tested).
    certified_draws: p, randomized target draws for the Hoeffding bounds (paper: 4,000).
    certified_delta: broken probability of the reported bounds (paper: 1e-8).
    certified_samples: q, non-target samples of the certified guarantee, drawn without
      replacement from the game pool, which crafting and calibration never see (Hoeffding
      needs samples independent of the crafted neuron); 0 = the whole pool, the most the
      dataset allows (digits: 718).
    dp_epsilons: DP-SGD epsilons of the noise-averaging analysis (Appendix E, Fig. 13).
    dp_deltas: DP deltas (Fig. 13a); each sets sigma and the target error rate.
    dp_neurons: numbers K of chosen neurons averaged (Fig. 13b, at dp_deltas[0]).
    dp_signal: |g_t| of a member batch in units of the clip norm.
    dp_rule: 'known_signal' (threshold |g_t| / 2) or 'unknown_signal' (FPR fixed at delta).
    dp_trials: Monte Carlo trials per kind per DP point.
    utility_hidden: hidden widths of the utility classifier (() = logistic regression).
    utility_steps: its full-batch Adam steps.
    utility_learning_rate: its step size.
    utility_train_split, utility_test_split: splits it is trained and tested on.
  A field the run does not read (the LDP fields without an LDP mechanism, `class_weights`
  under balanced weights, `feature_scale` with another extractor;
  `pipelines.ami.unused_fields`) is refused if set on the command line (exit 2).
  """
  paper = _PAPER.get(dataset)
  s = ml_collections.ConfigDict()
  s.mechanisms = ('none', 'bitrand', 'ome')
  s.epsilons = tuple(float(e) for e in range(1, 11))
  s.batch_size = paper['batch_size'] if paper else 20
  s.num_trials = 10_000
  s.num_targets = 1 if paper else 4
  s.num_neurons = 1000 if paper else 256
  s.hidden2 = 64
  s.copies = 2000 if paper else 500
  s.max_negatives = 5000 if paper else 0
  s.randomize_negatives = True
  s.learning_rate = 1e-3 if paper else 1e-2
  s.max_steps = 5000 if paper else 1500
  s.stop_when_separated = True
  s.balanced_class_weights = True
  s.class_weights = (1.0, 1.0)
  s.calibrated_variant = True
  s.heldout_fraction = 0.25
  s.adversary_fraction = 0.5
  s.target_split = paper['target_split'] if paper else 'train'
  s.adversary_split = paper['adversary_split'] if paper else 'train'
  s.pool_split = paper['pool_split'] if paper else 'train'
  s.ldp_sign_bit = True
  s.int_bits = 5
  s.frac_bits = 4
  s.extractor = 'identity' if dataset == 'digits' else 'resnet18'
  s.extractor_weights = ''
  s.feature_scale = 16.0 if dataset == 'digits' else 1.0
  s.decision_path = 'fast'
  s.certified_draws = 4000
  s.certified_delta = 1e-8
  s.certified_samples = 0
  s.dp_epsilons = (1.0, 2.0, 4.0, 6.0, 7.5, 8.0, 9.0, 10.0)
  s.dp_deltas = (1e-2, 1e-3, 1e-4, 1e-5)
  s.dp_neurons = (1, 2, 4, 8)
  s.dp_signal = 1.0
  s.dp_rule = 'known_signal'
  s.dp_trials = 20_000
  s.utility_hidden = ()
  s.utility_steps = 500
  s.utility_learning_rate = 1e-2
  s.utility_train_split = 'train'
  s.utility_test_split = paper['utility_test_split'] if paper else 'test'
  if smoke:
    s.mechanisms = ('none', 'bitrand')
    s.epsilons = (2.0, 9.0)
    s.num_trials = 400
    s.num_targets = 2
    s.num_neurons = 32
    s.copies = 64
    s.max_negatives = 200
    s.max_steps = 150
    s.certified_draws = 200
    s.dp_epsilons = (4.0, 8.0)
    s.dp_deltas = (1e-2,)
    s.dp_neurons = (1, 4)
    s.dp_trials = 1000
    s.utility_steps = 100
  return s
