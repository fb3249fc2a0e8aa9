"""The `pastel` config section: PASTEL and the DP baselines, judged by membership attacks.

Used by `python -m experiments.pastel` (Elhattab and Bouchenak, "Mitigating Membership Inference
Attacks in Federated Learning"; SEED-NOTES section 5). The dataset configs call
`section(dataset, smoke)`; every field is documented in `section`'s docstring.
"""

from __future__ import annotations

import ml_collections


def section(dataset: str, smoke: bool, setting: str = 'leaky') -> ml_collections.ConfigDict:
  """The `pastel` section for `dataset` (digits and npz: the digits defaults; cifar10).

  Settings (`--config=configs/digits.py:setting=...`; configs/_base.SETTINGS), digits and npz:
    leaky (default): K = 10 clients of 24 train rows (16 members + 8 held-out, one batch),
      B = 8; the other 1,198 train rows join the 359 test rows as non-members. Little data
      per client, so the undefended attacks are clearly above chance (test accuracy 0.92,
      generalisation gap 8 points, loss-threshold AUC 0.69 on client models and 0.62 on the
      global model, FedMIA-II 0.71). Chosen from a probe of training settings only (K, T, E;
      docs/experiments/pastel.md). 10 replicates (160 members each) of 80 + 80 scored rows
      per target each; intervals are Student's t over the 10 replicates.
    well_generalising: K = 5 clients sharing the whole train split (230 members + 57
      held-out each), B = 32: test accuracy 0.97, attacks near chance (FedMIA 0.56). The test
      split (359 rows) is the only non-member source, so each replicate scores 180 + 180
      rows; 4 replicates pool 720 + 720 (the 359 test rows repeat across replicates).
  Both: MLP(128, 64), T = 40, E = 2, AdaGrad lr 0.1. cifar10 runs its own setting whatever
  `setting` is (it refuses the argument).

  Fields:
    model: 'mlp' (digits, npz) or any name of `fl_privacy.models.MODELS` ('resnet18_gn' for
      cifar10).
    mlp_hidden: hidden widths of the MLP (digits: (128, 64)).
    num_clients: K, IID shards of the train split (digits: leaky 10, well_generalising 5;
      cifar10 10).
    per_client: train rows per client (members + held-out); None shares the whole train
      split. The train rows no client holds join the test split as non-members (rows no
      training reads; `attacks.passive.pastel.client_split`).
    replicates: R independent replicates (key fold_in(run_key, r)): each redraws shards,
      held-out rows, attack rows, w_0 and client keys, and trains every defense; each point
      reports its attack AUC / TPRs and its paired change against `none` over them
      (`eval.replicated`: the t-interval for every R >= 2, `interval_method` says which),
      the rows pooled over replicates beside them as `pooled_*` (the white-box attack: one
      model trained on every replicate's training half, so its own training randomness is
      not in any interval).
    bootstrap_resamples: resamples of `eval.replicated`'s bootstrap, run only where it is the
      reported interval (R = 1: the two-way bootstrap of that training; R > 30).
    num_rounds: T (digits 40).
    record_every: rounds between recorded snapshots (must divide T; digits 10).
    local_epochs: E (digits 2).
    batch_size: B (digits: leaky 8, well_generalising 32); also |V|, the held-out batch of the
      regulariser, a fresh random batch of the client's held-out rows every local step; each
      client must hold out >= B rows (else ConfigError on validation_fraction).
    optimizer: the clients' optimizer (paper: 'adagrad'), fresh each round.
    learning_rate: its step size (digits: AdaGrad 0.1, 0.97 test accuracy undefended).
    ablation_optimizer: a second optimizer for `none` and `pastel` (at
      `ablation_pastel_weight`), separating the regulariser from AdaGrad; 'none' to skip.
    ablation_learning_rate: its step size (momentum SGD 0.01, momentum 0.9).
    ablation_pastel_weight: lambda of the ablation's `pastel` training (1, the paper's Eq. 5).
    defenses: subset of ('none', 'pastel', 'wdp', 'ldp', 'cdp').
    pastel_weights: lambdas >= 0 of `pastel` (digits (1, 10, 100)).
    pastel_layers: layer names the JS divergence is taken at; () = every Dense layer. A name
      the model lacks is rejected with the list of available names.
    pastel_representations: readings of PASTEL trained, each at every lambda (a result param
      `representation`): 'activation' (softmax of layer outputs) and 'gradient' (normalised
      |dCE/dW_l|, Sect. 2.1); see fl_privacy/defenses/pastel.py. The ablation uses the first.
    pastel_temperature: tau of the 'activation' softmax.
    validation_fraction: share of each client's shard held out for V, in (0, 0.5] (leaky 1/3,
      well_generalising 0.2); those rows are neither members nor non-members in the attacks,
      and every defense trains on the same members.
    epsilons: target epsilons > 0 of each DP baseline (per round for 'wdp').
    dp_delta: delta of every DP baseline.
    clip_norm: per-example clip of 'ldp' (DP-SGD).
    ldp_sampling: 'poisson' (default: each record joins each step with probability B / n, n
      the smallest client's members, declared public for every client, accounted exactly) or
      'shuffle' (fixed-size shuffled batches, accounted without amplification: one
      replace-one release per epoch).
    update_clip_norm: update clip of 'cdp' and 'wdp' (server side). Digits: 0.3, the median
      L2 norm of the undefended run's uploads at the recorded rounds (0.30; clipping at the
      median update norm as in adaptive clipping, Andrew et al. 2021), fixed before any DP run.
    attacks: subset of ('nasr_whitebox', 'loss_threshold', 'fedmia_i', 'fedmia_ii'); the
      FedMIA attacks need >= 3 clients and run on the `local` target only.
    targets: subset of ('local', 'global').
    attack_snapshots: recorded rounds the white-box attack reads (the last ones), at most
      num_rounds / record_every.
    attack_last_layer_grad: give the white-box attack the full last-layer gradient.
    attack_per_replicate: False (default): ONE white-box attack model trained on every
      replicate's training half (as many known pairs as scored pairs), whose own training
      randomness no interval over replicates covers; True: one model per replicate on its
      own training half (independent across replicates, a tenth of the pairs at R = 10).
    attack_steps: Adam steps of the attack model.
    attack_learning_rate: Adam's step size.
    attack_hidden: width of the attack's group MLPs and encoder.
    feature_chunk_size: examples per per-example-gradient chunk (memory only).
  A field the run's trainings and attacks do not read (`pipelines.pastel.unused_fields`: the
  DP baselines' fields without them, `pastel_weights` without 'pastel', the white-box attack
  model's training without 'nasr_whitebox', ...) is refused if set on the command line (exit
  2).
  """
  s = ml_collections.ConfigDict()
  s.model = 'mlp'
  s.mlp_hidden = (128, 64)
  s.num_clients = 5
  s.num_rounds = 40
  s.record_every = 10
  s.local_epochs = 2
  s.batch_size = 32
  s.optimizer = 'adagrad'
  s.learning_rate = 0.1
  s.ablation_optimizer = 'momentum'
  s.ablation_learning_rate = 0.01
  s.ablation_pastel_weight = 1.0
  s.defenses = ('none', 'pastel', 'wdp', 'ldp', 'cdp')
  s.pastel_weights = (1.0, 10.0, 100.0)
  s.pastel_layers = ()
  s.pastel_representations = ('activation', 'gradient')
  s.pastel_temperature = 1.0
  s.validation_fraction = 0.2
  s.epsilons = (1.0, 4.0, 16.0)
  s.dp_delta = 1e-5
  s.clip_norm = 1.0
  s.ldp_sampling = 'poisson'
  s.update_clip_norm = 0.3
  s.attacks = ('nasr_whitebox', 'loss_threshold', 'fedmia_i', 'fedmia_ii')
  s.targets = ('local', 'global')
  s.attack_snapshots = 2
  s.attack_last_layer_grad = True
  s.attack_per_replicate = False
  s.attack_steps = 300
  s.attack_learning_rate = 1e-3
  s.attack_hidden = 64
  s.feature_chunk_size = 256
  s.per_client = None
  s.replicates = 1
  s.bootstrap_resamples = 1000
  if dataset != 'cifar10' and setting == 'leaky':
    # Little data per client (probed by training settings only, docs/experiments/pastel.md):
    # 10 clients x (16 members + 8 held-out); the rest of the train split joins the
    # non-members. 160 members per replicate: 10 replicates give 800 + 800 scored rows.
    s.num_clients = 10
    s.per_client = 24
    s.validation_fraction = 1 / 3
    s.batch_size = 8
    s.replicates = 10
  elif dataset != 'cifar10':
    # The whole train split is members or held-out: the 359 test rows are the only
    # non-members, 180 + 180 scored rows per replicate; 4 replicates give 720 + 720 (each test
    # row scored under about two trainings: n_neg_distinct says how many are distinct).
    s.replicates = 4
  if dataset == 'cifar10':
    # GPU advised; not run on the 2-core default machine (docs/experiments/pastel.md).
    s.model = 'resnet18_gn'
    s.num_clients = 10
    s.num_rounds = 100
    s.record_every = 10
    s.local_epochs = 1
    s.batch_size = 64
    s.learning_rate = 0.01
    s.pastel_layers = ('block8', 'fc1')
    s.feature_chunk_size = 64
  if smoke:
    s.num_rounds = 4
    s.record_every = 2
    s.local_epochs = 1
    s.defenses = ('none', 'pastel', 'cdp')
    s.pastel_weights = (1.0,)
    s.replicates = 1
    s.epsilons = (4.0,)
    s.ablation_optimizer = 'none'
    s.attacks = ('nasr_whitebox', 'loss_threshold')
    s.attack_steps = 50
  return s
