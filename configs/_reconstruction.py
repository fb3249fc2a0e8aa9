"""The `reconstruction` config section: what a server recovers of a client's inputs.

Used by `python -m experiments.reconstruction` (fl_privacy/pipelines/reconstruction.py). The
dataset configs call `section(dataset, smoke)`; every field is documented in `section`'s
docstring. Expected results on digits: docs/experiments/reconstruction.md.
"""

from __future__ import annotations

import ml_collections

ATTACKS = ('imprint', 'analytic', 'inversion')
# Colour images (32x32x3 = 3,072 inputs): a wider MLP and a longer inversion (fewer inversion
# trials: each is 1,000 steps on 3,072 inputs), for an accelerator (python -m
# experiments.reconstruction --config=configs/cifar10.py). Not run on this machine (no CIFAR-10
# offline); the digits numbers are docs/experiments/reconstruction.md.
_COLOUR = dict(hidden=(256,), trials=1000, inversion_trials=128, inversion_steps=1000)


def _defenses(smoke: bool) -> ml_collections.ConfigDict:
  """Three strengths per defense (weakest first) that act on what the server reads."""
  d = ml_collections.ConfigDict()
  if smoke:
    d.update_dp = (1e-5,)
    return d
  # The fixed server's imprint signal in an upload is small (about 1e-4 per entry at restore
  # scale 32), so noise far from any meaningful epsilon erases it; the adaptive server raises
  # it and still recovers there. Each noise sweep spans that transition and ends at a noise with
  # a usable epsilon, which stops both (docs/experiments/reconstruction.md).
  d.dp_sgd = (1e-3, 1e-2, 1.0)             # noise multiplier z (clip `dp_clip` per example)
  d.update_dp = (1e-6, 1e-5, 0.1)          # noise multiplier z (the update clipped to `dp_clip`)
  d.update_noise = (1e-7, 1e-6, 1e-5)      # sigma of N(0, sigma^2) per parameter
  d.sparsify = (0.1, 0.5, 0.9)             # fraction p of each tensor's entries zeroed
  d.quantize = (16, 8, 4)                  # bits b: 2^b levels per tensor
  d.mixup = (0.2, 0.5, 1.0)                # alpha of Beta(alpha, alpha)
  d.augment = (1, 2, 4)                    # cumulative level (crop; + h-flip; + v-flip/rot.; + jitter)
  # Input LDP (epsilon per release of one example, replace-one, against the server), swept
  # from where utility recovers (BitRand 0.9 at 30, OME 0.7 at 1e4 in a probe of 3 trainings)
  # down to 1, where it is at chance:
  d.bitrand = (100.0, 30.0, 8.0, 4.0, 1.0)   # BitRand on the pixels' fixed-point bits
  d.ome = (1e4, 1000.0, 100.0, 8.0, 1.0)     # OME on the same bits
  d.gaussian = (1000.0, 100.0, 30.0, 8.0, 1.0)   # nominal epsilon of N(0, sigma^2) on the pixels
  # LDP-SGD on the client's whole upload (clipped to `dp_clip`): epsilon per report. One
  # client's LDP-SGD report trains nothing at any epsilon probed (up to 1e5): chance.
  d.ldp_sgd = (1000.0, 8.0, 1.0)
  return d


def section(dataset: str, smoke: bool) -> ml_collections.ConfigDict:
  """The `reconstruction` section for `dataset`.

  Fields:
    attacks: which of `imprint` (Fowl et al., the dishonest server's imprint block), `analytic`
      (Phong et al., a dense layer with a bias on the input of the honest model) and
      `inversion` (Geiping et al., optimisation from the honest model's upload) run.
    model: the honest model (`fl_privacy.models.MODELS`); the analytic attack needs 'mlp' (a
      dense layer on the input). hidden: the MLP's hidden widths; padding: FlowerCNN's.
    trials: trials (clients) per point, run vmapped (`eval.runner.run_trials`; 1,000, issue
      41's floor; the default's time: docs/experiments/reconstruction.md); inversion_trials:
      the same for the inversion (each trial is an optimisation: 1,000 take 20-30 s a point
      here).
    batch_sizes: B of the batch-size sweep (one local step: J = 1, E = 1).
    num_batches: J of the multi-step sweep (N = J x B examples, B = center.<attack>; J = 8 at
      B = 8 is breaching's FedAvg imprint example: 64 examples, 8 steps of 8).
    epochs: E of the multi-epoch sweep (J = 1).
    center: each attack's batch size B for the J and E sweeps and the defense sweep (imprint:
      8, the issue's client; analytic and inversion: 1, where they recover), and the J and E
      the B sweep and the defense sweep use.
    max_examples: attack -> the largest client (N) it runs at (the inversion's cost grows with
      N and it fails long before 64).
    optimizer, learning_rate: the client's (`fl.optimizers.OPTIMIZERS`).
    learning_rates: every point of more than one step (J > 1 or E > 1) again at each of these
      client rates: the rate drives how far the first steps move the imprint's units (and the
      model) before the later ones, hence the multi-step loss (1e-4: breaching's FedAvg
      imprint example; empty: only `learning_rate`). A traced operand: no compilation.
    psnr_threshold: an input counts as recovered above this PSNR (dB, images in [0, 1]).
    split: the split clients draw from; public_split: the split the server knows (the imprint
      thresholds), disjoint from the clients'.
    imprint: num_bins (n >= every N swept), statistic (`imprint.STATISTICS`), scale and
      restore_scale (`imprint.craft`: the defaults keep float32 uploads exact).
    inversion: steps, learning_rate, tv_weight, restarts (`inversion.Settings`).
    multi_step_attacks: the attacks that run the J and E sweeps (the inversion's cost is its
      compilations: add it with `--config.reconstruction.multi_step_attacks=...`).
    defenses: name -> strengths (each the defense's `strength` parameter, or for the input
      mechanisms their epsilon: BitRand, OME, the Gaussian input mechanism (nominal epsilon;
      labelled with dp-accounting's) and LDP-SGD; weakest first; an empty tuple skips the
      defense), swept at `center` for `defense_attacks` (default the imprint attack, B = 8:
      the strengths of a defense share one compilation, about 10 s here); only defenses that
      act against the server reading uploads are taken (`central_dp` and `weak_dp` are
      refused).
    adaptive: the adaptive server, beside the paper's fixed one at the centre imprint point
      without a defense and at every swept defense point: restore_scales (`imprint.craft`'s
      restore scale) x placements (`imprint.PLACEMENTS`: thresholds at the public quantiles or
      evenly over the public range) x widths (`imprint.num_bins` and the `num_bins` given
      here, each at least the client's N; every other width is a compilation per defense) x
      structures (`imprint.STRUCTURES`: the paper's cumulative layer, breaching's sparse
      one-hot one) is its first pass, then the best of it averaged over each of `rounds`
      rounds (the same model sent again, the defense's noise fresh each round). Each
      candidate is scored on `trials` simulated clients drawn from `pool` examples held out
      of `split` (never a client's; apart from the public split, which sets the thresholds,
      the value grid and the utility's test accuracy), keys of their own, under the same
      defense; the best (most examples above the PSNR threshold, then exact after rounding to
      the value grid; ties: the fixed setting, tried first, and fewer rounds) attacks the
      same private clients as the fixed server, and the paired difference adaptive - fixed
      per client is reported (`attacks.reconstruction.paired`). restore_scales = () turns it
      off (and holds nothing out). Restore scales, placements, structures and rounds are
      traced operands: no compilation. multi_step: the adaptive server also at every imprint
      point of more than one step (the J / E / learning-rate grid; off by default for time).
    dp_sgd_samplings: DP-SGD's batch samplings swept ('poisson', 'shuffle').
    dp_clip, dp_delta: the DP defenses' and LDP-SGD's clip norm, and the delta of the epsilon
      labels (the Gaussian input mechanism's too).
    utility: rounds, examples, trials of the utility training (test accuracy of the honest
      model trained by one client under each defense; the interval takes each training as a
      cluster, `metrics.clustered_rate`, so it needs several: 10 by default).
    bootstrap_resamples: of every mean's interval.
    grid_images: true vs recovered images per attack in the figure.

  A field the run does not read (the other model's `hidden` / `padding`, an attack's fields
  when it runs at no point, `num_batches` / `epochs` / `learning_rates` without a multi-step
  point, the adaptive server's fields when it is off, the defense sweep's fields without a
  swept defense; `pipelines.reconstruction.unused_fields`) is refused
  if set on the command line (exit 2), not recorded as if it ran.
  """
  s = ml_collections.ConfigDict()
  s.attacks = ATTACKS
  s.model = 'mlp'
  s.hidden = (64,)
  s.padding = 'SAME'
  s.trials = 1000
  s.inversion_trials = 1000
  s.batch_sizes = (1, 2, 4, 8, 16, 32, 64)
  s.num_batches = (1, 2, 4, 8)
  s.epochs = (1, 2, 4)
  s.center = ml_collections.ConfigDict(dict(imprint=8, analytic=1, inversion=1, num_batches=1,
                                             epochs=1))
  s.max_examples = ml_collections.ConfigDict(dict(imprint=64, analytic=64, inversion=4))
  s.multi_step_attacks = ('imprint', 'analytic')
  s.optimizer = 'sgd'
  s.learning_rate = 0.1
  # The multi-step points again at these rates (breaching's FedAvg example: 1e-4).
  s.learning_rates = (1e-2, 1e-3, 1e-4)
  s.psnr_threshold = 30.0
  s.split = 'train'
  s.public_split = 'test'
  s.imprint = ml_collections.ConfigDict(dict(num_bins=256, statistic='mean', scale=0.1,
                                             restore_scale=32.0))
  s.inversion = ml_collections.ConfigDict(dict(steps=200, learning_rate=0.1, tv_weight=0.01,
                                               restarts=2))
  s.defenses = _defenses(smoke)
  s.defense_attacks = ('imprint',)
  s.adaptive = ml_collections.ConfigDict(dict(restore_scales=(32.0, 3200.0, 32000.0),
                                              placements=('quantile', 'uniform'),
                                              num_bins=(1024,),
                                              structures=('cumulative', 'sparse'),
                                              rounds=(1, 4), trials=64, pool=300,
                                              multi_step=False))
  # Poisson only by default: with issue 41's adaptive server the shuffled sampling recovered the
  # same as Poisson (a run with both) and changed only the epsilon label; not rerun since.
  s.dp_sgd_samplings = ('poisson',)
  s.dp_clip = 1.0
  s.dp_delta = 1e-5
  s.utility = ml_collections.ConfigDict(dict(rounds=10, examples=256, trials=10))
  s.bootstrap_resamples = 1000
  s.grid_images = 8
  if dataset == 'cifar10':
    s.hidden = _COLOUR['hidden']
    s.trials, s.inversion_trials = _COLOUR['trials'], _COLOUR['inversion_trials']
    s.inversion.steps = _COLOUR['inversion_steps']
  if smoke:
    s.trials = 8
    s.inversion_trials = 2
    s.learning_rates = ()
    s.adaptive = ml_collections.ConfigDict(dict(restore_scales=(32.0, 3200.0),
                                                placements=('quantile',), num_bins=(),
                                                structures=('cumulative', 'sparse'),
                                                rounds=(1, 2), trials=8, pool=100,
                                                multi_step=False))
    s.batch_sizes = (1, 8)
    s.num_batches = (1,)
    s.epochs = (1,)
    s.max_examples = ml_collections.ConfigDict(dict(imprint=64, analytic=64, inversion=1))
    s.inversion = ml_collections.ConfigDict(dict(steps=20, learning_rate=0.1, tv_weight=0.01,
                                                 restarts=1))
    s.dp_sgd_samplings = ('poisson',)
    s.utility = ml_collections.ConfigDict(dict(rounds=2, examples=64, trials=2))
    s.bootstrap_resamples = 100
    s.grid_images = 4
  return s
