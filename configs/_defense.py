"""The `defense` config section: the defense every client of an experiment runs.

Honoured by `experiments.dishonest_mia` (the client's FedAvg round trains with the defense's
hooks; the server observes the upload) and `experiments.ami` (the client applies the defense to
the batch it trains on). Built by `fl_privacy.defenses.configure`; every results point's params
carry `defense` and the parameters the defense used (`defense_<field>`). Fields are documented
in `section`'s docstring.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict


def section(dataset: str, smoke: bool) -> ml_collections.ConfigDict:
  """The `defense` section (the same for every dataset: defaults are each paper's values).

  Fields:
    name: one of `fl_privacy.defenses.NAMES`: 'none' (default: no defense), 'update_noise',
      'sparsify', 'quantize', 'mixup', 'augment', 'sampling', 'dp_sgd', 'update_dp',
      'central_dp', 'weak_dp', and the input mechanisms 'bitrand', 'ome', 'gaussian',
      'ldp_sgd'. Only the fields of the named defense are used.
    sigma: update_noise: std of N(0, sigma^2) added to every parameter of the update (FedMIA:
      0.01-0.5); gaussian: std of the noise on the inputs. >= 0.
    sparsity: sparsify: the fraction p of each tensor's entries zeroed, in (0, 1] (top-k keeps
      int((1 - p) n)). p = 0.99 keeps the largest 1%.
    sparsify_min_size: sparsify: tensors with at most this many entries are sent unsparsified
      (FedMIA's code: 1,000); 0 sparsifies every tensor (plain top-k).
    bits: quantize: levels 2^bits per tensor, min-max, stochastic rounding; >= 1.
    mixup_alpha: mixup: Beta(alpha, alpha) mixing weights; > 0.
    mixup_public_code: mixup: True trains on the unmixed inputs with mixed labels, as FedMIA's
      code does (the default mixes both, as mixup is defined).
    augment_level: augment: 1 crop, 2 + h-flip, 3 + v-flip and rotation <= 45 deg, 4 + colour
      jitter (cumulative).
    augment_pad: augment: crop padding in px; None: 4, or 1 for images of at most 8x8 (digits).
    sampling_fraction: sampling: the fraction of its rows a client trains on each round, in
      (0, 1].
    clip_norm: dp_sgd: per-example clip C; update_dp, central_dp, weak_dp: update clip C;
      ldp_sgd: the gradient clip L. > 0.
    noise_multiplier: the DP defenses' noise multiplier (noise std = multiplier x clip_norm);
      >= 0. Ignored when `target_epsilon` is set.
    target_epsilon: None, or the epsilon (at `delta`) the DP defenses should spend: the noise
      multiplier is then found by the accountant (dp-accounting). > 0.
    delta: delta of the DP accounting, in (0, 1).
    accountant: 'rdp' (default) or 'pld', both from dp-accounting.
    participation: the fraction of clients per round used in client-level accounting
      (central_dp's sampling rate), in (0, 1]; experiments with a round loop also use it there.
    epsilon: bitrand, ome, ldp_sgd: the LDP epsilon; gaussian: epsilon of its calibration
      (with `delta`) when `sigma` is None. > 0.
  """
  del dataset, smoke
  s = ml_collections.ConfigDict()
  s.name = 'none'
  s.sigma = 0.01
  s.sparsity = 0.9
  s.sparsify_min_size = 1000
  s.bits = 8
  s.mixup_alpha = 1.0
  s.mixup_public_code = False
  s.augment_level = 2
  s.augment_pad = config_dict.placeholder(int)
  s.sampling_fraction = 0.5
  s.clip_norm = 1.0
  s.noise_multiplier = 1.0
  s.target_epsilon = config_dict.placeholder(float)
  s.delta = 1e-5
  s.accountant = 'rdp'
  s.participation = 1.0
  s.epsilon = 5.0
  return s
