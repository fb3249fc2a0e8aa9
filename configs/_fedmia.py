"""The `fedmia` config section: passive server-side MI under defenses and non-IID data.

Used by `python -m experiments.fedmia` (FedMIA, Zhu et al., CVPR 2025, arXiv:2402.06289;
SEED-NOTES section 3). The dataset configs call `section(dataset, smoke)`; every field is
documented in `section`'s docstring. Expected results: docs/experiments/fedmia.md.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

# Every attack of Table 1, the optimistic best-round variants, FedMIA with each filter (without
# a suffix the paper's, Eqs. 8-9; ours, leave-one-out, beside it; none), and beside them the
# state of the art: offline and online LiRA (per-query and fixed variance) and RMIA.
ATTACKS = ('blackbox_loss', 'grad_cosine', 'grad_diff', 'grad_norm',
           'blackbox_loss_best_round', 'grad_cosine_best_round', 'grad_diff_best_round',
           'grad_norm_best_round', 'loss_series', 'avg_cosine', 'fedmia_i', 'fedmia_ii',
           'fedmia_i@leave_one_out', 'fedmia_ii@leave_one_out', 'fedmia_i@none',
           'fedmia_ii@none', 'lira_offline', 'lira_offline_fixed', 'lira_online',
           'lira_online_fixed', 'rmia')
# RMIA's offline parameter a per dataset: the RMIA authors' configs (ml_privacy_meter,
# research/2023_rmia/attack_configs/<dataset>/rmia_offline_*_ref_models.yaml: offline_a 0.33
# on CIFAR-10, 0.6 on CIFAR-100); elsewhere a = 1 (Pr(x) = Pr_OUT(x)), their "unknown" value.
RMIA_A = {'cifar10': 0.33, 'cifar100': 0.6}
# The six attacks of the paper's Figs. 4 and 6 (FedMIA with the paper's filter), and FedMIA
# with our leave-one-out filter beside them, scored in the sweeps.
SWEEP_ATTACKS = ('blackbox_loss', 'grad_cosine', 'loss_series', 'avg_cosine', 'fedmia_i',
                 'fedmia_ii', 'fedmia_i@leave_one_out', 'fedmia_ii@leave_one_out')


def _defenses(smoke: bool) -> ml_collections.ConfigDict:
  """Three strengths per defense (weakest first), the public code's parameterisations."""
  d = ml_collections.ConfigDict()
  if smoke:
    d.update_noise = (0.1,)
    return d
  d.update_noise = (0.01, 0.1, 0.5)      # sigma of N(0, sigma^2) per parameter (code: 0.01-0.5)
  d.update_dp = (0.1, 0.5, 2.0)          # noise multiplier z (clip `dp_clip`; paper: std 0.01-0.5)
  d.sparsify = (0.5, 0.9, 0.99)          # fraction p of |Delta| entries zeroed per large tensor
  d.quantize = (8, 4, 2)                 # bits b: 2^b bins per tensor
  d.mixup = (0.2, 0.5, 1.0)              # alpha of Beta(alpha, alpha)
  d.augment = (1, 2, 4)                  # cumulative level (crop; + h-flip; + v-flip/rot.; + jitter)
  d.sampling = (0.8, 0.5, 0.2)           # fraction p of minibatches trained
  d.augment_sampling = (0.8, 0.5, 0.2)   # sampling p with augmentation `augment_sampling_level`
  return d


def section(dataset: str, smoke: bool, setting: str = 'leaky') -> ml_collections.ConfigDict:
  """The `fedmia` section for `dataset` and, on digits and npz, `setting`.

  Settings (`--config=configs/digits.py:setting=...`; configs/_base.SETTINGS):
    leaky (default): K = 20 clients of 16 examples each, B = 8. Too little data per client to
      generalise (test accuracy about 0.89), so the attacks have signal, as in the paper's
      setting (its CIFAR clients overfit: AUC 0.84-0.90). Measured: docs/experiments/fedmia.md.
    well_generalising: K = 10 clients sharing the whole train split (about 143 each), B = 32:
      test accuracy about 0.96 and every attack near chance (AUC about 0.56).
  Both train the same MLP with the paper's optimiser for 60 rounds; the settings differ only
  in data per client, K and B (and the clients sweep's K values). CIFAR configs run the paper's
  setting whatever `setting` is (they refuse the argument).

  Fields:
    models: model names (`fl_privacy.models.MODELS`); a result param. Paper: AlexNet
      ('alexnet_cifar') and ResNet-18-GN ('resnet18_gn'); digits: an MLP.
    hidden: hidden widths of 'mlp'.
    num_clients: K of the main setting (>= 3: FedMIA needs two non-target clients).
    per_client: examples per client (None: the whole train split, split evenly or by
      Dirichlet). Paper: 5,000 (CIFAR-100: all 50,000 training images).
    num_rounds: T. Paper: 300.
    record_every: rounds between recordings (must divide num_rounds); the record_every-th,
      2 record_every-th, ... rounds are measured. Paper: 10.
    local_epochs: E of the main setting. Paper: 1.
    batch_size: B. Paper: 100; digits: 32. At most per_client (equal shards draw full
      minibatches) and the training split's size.
    optimizer: client optimizer (`fl.optimizers.OPTIMIZERS`); 'momentum' is SGD with
      `momentum`, 'sgd' plain SGD. Paper: SGD, lr 0.1, momentum 0.9, weight decay 5e-4.
    learning_rate, momentum, weight_decay: as above; `momentum` is read by 'momentum' only.
    A field the run does not read (`momentum` of another optimizer, `lr_decay` off the
    exponential schedule, `lira_in_models` without online LiRA, `rmia_gamma` / `rmia_a` without
    RMIA, `hidden` without the MLP, the sweeps' attacks and scorings without a sweep) is
    refused if set on the command line (exit 2), not recorded as if it ran.
    lr_schedule: 'cosine' (cosine annealing over rounds, the paper), 'exponential' (lr
      lr_decay^t, the paper's Table 3), or 'constant'.
    lr_decay: the exponential schedule's factor (0.99).
    attacks: attacks scored on the main setting (`fl_privacy.attacks.passive.ATTACKS`, FedMIA
      optionally `@paper|leave_one_out|none`): the paper's (FedMIA with the paper's filter), ours
      ('fedmia_i@leave_one_out', 'fedmia_ii@leave_one_out'), and beside them 'lira_offline',
      'lira_offline_fixed' (offline LiRA, per-query / fixed variance, the other clients as OUT
      models), 'lira_online', 'lira_online_fixed' (online LiRA: the same OUT models, and IN
      models the server trains by re-running the protocol's round from w_t on shadow sets
      with the query inserted, `lira_in_models`) and 'rmia' (offline RMIA, the other clients as
      reference models, the test rows as population). CIFAR leaves the online attacks out: their
      IN models cost Q x lira_in_models local rounds per recorded round (about 24,000 times a
      round's client work with AlexNet); add them with `--config.fedmia.attacks=...` on a GPU.
    lira_in_models: IN models per query and recorded round of online LiRA (an integer >= 2:
      both online attacks fit an IN variance, per query or global): each a shadow set of the
      clients' size from the test split with the query replacing one row, trained from w_t
      with the clients' optimizer, E, B and hooks (`fl.shadow`). Recorded only by trainings
      that score an online attack; costs Q x lira_in_models local rounds per recorded round.
    rmia_gamma: RMIA's threshold gamma > 0 on the pairwise likelihood ratio. Default 2.0, the
      value of the RMIA authors' attack configs (ml_privacy_meter research/2023_rmia, CIFAR-10
      and CIFAR-100); the paper's text not checked for it.
    rmia_a: RMIA's offline parameter a in [0, 1] (Pr(x) = ((1 + a) Pr_OUT(x) + 1 - a) / 2):
      0.33 on cifar10, 0.6 on cifar100 (the authors' configs), 1.0 elsewhere.
    bootstrap_resamples: resamples of the bootstraps: with one replicate the query-cluster
      bootstrap of every TPR at low FPR (`_boot_low` / `_boot_high`); with R >= 2 replicates
      the reported interval is Student's t over them at every R (`eval.replicated`: the
      hierarchical bootstrap over-covers, benchmarks/README.md, "Coverage of the intervals")
      and the `_boot_` fields are NaN. 1,000.
    outlier_filter: FedMIA's filter when the name gives none: 'paper' (default: the paper's
      Eqs. 8-9, which cannot fire with <= 10 shadows), 'leave_one_out' (ours), 'none'. Tables
      label each FedMIA row with its filter. It applies to FedMIA-I and FedMIA-II in every
      setting, as the paper states Eqs. 8-9 for any measurement with no condition on the data.
      The authors' public code (`mia_attack_auto.py`, `lira_attack_ldh_cosine` and `main`)
      filters the cosine (FedMIA-II) only, and only in non-IID runs (run folders without
      'iid$1'); it keeps a shadow when it is strictly below mean + 3 sd, and a column that
      would lose every shadow keeps only its smallest value. Its scope is reachable with the
      named variants: 'fedmia_i@none' always, 'fedmia_ii@none' on IID data and
      'fedmia_ii@paper' on non-IID data (with K <= 11, the code's K = 10, 'paper' never
      fires, so the scopes differ only with more clients: the leaky K = 20).
    nonmember_scoring: scorings of the main setting: 'aligned' (each query keeps its identity),
      'public_code' (non-members redrawn per client and round, as the authors' code) and/or
      'public_code_2024' (the authors' Feb 2024 code: the non-members of a target are only the
      other clients' training rows, aligned; not in the default sweep).
    single_round: 1-based round of the single-round attacks; must be recorded.
    sweep_attacks, sweep_scoring: attacks and scorings of the sweeps (non-IID, K, E, defenses).
    betas: Dirichlet beta of the label skew; inf = IID (the main setting). Paper: inf, 10, 1,
      0.1.
    client_counts: K values of the clients sweep (besides num_clients). Paper: 2-20.
    epoch_counts: E values of the local-epochs sweep (besides local_epochs). Paper: 1-9.
    defenses: name -> strengths (`fl_privacy.defenses`), trained at the main setting:
      update_noise sigma >= 0, update_dp z >= 0, sparsify p in (0, 1), quantize bits >= 1,
      mixup alpha > 0, augment level 1-4, sampling p in (0, 1), augment_sampling p in (0, 1).
    dp_clip, dp_delta: update_dp's clipping norm C and the delta of its epsilon.
    augment_sampling_level: augmentation level combined with sampling.
    mixup_public_code: True trains on unmixed inputs with mixed labels, as the authors' code.
    replicates: R independent trainings of every setting (replicate r's key fold_in(run key,
      r) redraws the partition, w_0 and the clients' keys; a defense and the undefended run of
      the same replicate share them): every rate, AUC and paired claim is reported over the R
      trainings (`eval.replicated`: Student's t over the replicates for R >= 2, one training's
      conditional bootstrap for R = 1, as the result's `interval_method` says), each replicate
      stored and resumed on its own. Default 3 (smoke: 2).
    chunk_size: queries per measurement chunk (memory ~ chunk x parameters, refused before
      the run when 2 x chunk x parameters floats cannot fit; results do not
      depend on it). Digits: 32 (measured on the 2-core machine, one leaky main training
      with online LiRA's IN models: 10 s at chunk 32 vs 36 s at 512, the small MLP's
      per-example gradients staying in cache; benchmarks.fedmia_measure); CIFAR: 256.
  """
  cifar = dataset in ('cifar10', 'cifar100')
  s = ml_collections.ConfigDict()
  s.models = ('alexnet_cifar', 'resnet18_gn') if dataset == 'cifar100' else (
      ('alexnet_cifar',) if cifar else ('mlp',))
  s.hidden = (128,)
  s.num_clients = 10
  s.per_client = 5000 if cifar else config_dict.placeholder(int)
  s.num_rounds = 300 if cifar else 60
  s.record_every = 10 if cifar else 5
  s.local_epochs = 1
  s.batch_size = 100 if cifar else 32
  s.optimizer = 'momentum'
  s.learning_rate = 0.1
  s.momentum = 0.9
  s.weight_decay = 5e-4
  s.lr_schedule = 'cosine'
  s.lr_decay = 0.99
  s.attacks = tuple(a for a in ATTACKS if not a.startswith('lira_online')) if cifar else ATTACKS
  s.lira_in_models = 4
  s.outlier_filter = 'paper'
  s.rmia_gamma = 2.0
  s.rmia_a = RMIA_A.get(dataset, 1.0)
  s.bootstrap_resamples = 1000
  s.nonmember_scoring = ('aligned', 'public_code')
  s.single_round = s.num_rounds
  s.sweep_attacks = SWEEP_ATTACKS
  s.sweep_scoring = ('aligned',)
  s.betas = (float('inf'), 10.0, 1.0, 0.1)
  s.client_counts = (5, 20)
  s.epoch_counts = (2, 4)
  s.defenses = _defenses(smoke)
  s.dp_clip = 1.0
  s.dp_delta = 1e-5
  s.augment_sampling_level = 2
  s.mixup_public_code = False
  s.chunk_size = 256 if cifar else 32
  s.replicates = 3
  if not cifar and setting == 'leaky':
    s.num_clients = 20
    s.per_client = 16
    s.batch_size = 8
    s.client_counts = (5, 10)
  if smoke:
    s.models = ('mlp',)
    s.hidden = (32,)
    s.num_clients = 4
    s.per_client = config_dict.placeholder(int)
    s.num_rounds = 3
    s.record_every = 1
    s.batch_size = 32
    s.single_round = 3
    s.betas = (float('inf'), 1.0)
    s.client_counts = ()
    s.epoch_counts = ()
    s.chunk_size = 32
    s.replicates = 2
  return s
