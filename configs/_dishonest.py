"""The `dishonest` config section: perfectly accurate MI by a dishonest server.

Used by `python -m experiments.dishonest_mia` (the 2M+1-neuron detector of Pichler et al.,
SEED-NOTES section 2) and `python -m experiments.duplicates` (the duplicate listing that explains
the detector's false positives). The dataset configs call `section(dataset, smoke)`; every field
is documented in `section`'s docstring.
"""

from __future__ import annotations

import ml_collections

# The paper's grid (Table 1 and Section 3.2).
PAPER_M = (1, 2, 4, 8, 16)
PAPER_NUM_BATCHES = (1, 4, 16, 64, 128, 256)
PAPER_EPOCHS = (1, 2, 4)

# J * B must stay below the number of training examples (one example is kept out as the
# target of the "outside" runs); these lists keep the paper's values that fit.
_NUM_BATCHES = {
    # sklearn digits: 1,797 images of 8x8; J = 32 (N = 1,024) is the largest power of two that
    # fits in the training split, so it stands in for the paper's J = 128 centre.
    'digits': ((1, 4, 16, 32), 32),
    # A user's own images: sizes are unknown, so stay small; override for larger files.
    'npz': ((1, 4, 16), 16),
}


def section(dataset: str, smoke: bool) -> ml_collections.ConfigDict:
  """The `dishonest` section for `dataset`.

  Fields:
    runs: runs (trials) per grid point; even: half with the target inside the client's data
      (run index even), half outside. Paper: 400.
    M: numbers of detected feature values (the detector has 2M+1 ReLU neurons). Each must be
      <= the feature dimension of the model's trunk and 2M <= the width of `fc1`.
    optimizers: client optimizers, from `fl.optimizers.OPTIMIZERS`. 'momentum' is the paper's
      SGD (lr `learning_rate`, heavy-ball momentum `momentum`), 'sgd' plain SGD (no momentum),
      'adam' Adam with defaults (lr
      `learning_rate`).
    num_batches: J, minibatches per epoch (client data N = J * batch_size). J * batch_size must
      be < the training split's size.
    epochs: E, local epochs.
    grid: 'one_at_a_time' (the paper: vary M, J, E one at a time around the centre, for every
      optimizer) or 'product' (every combination).
    center: the point the one-at-a-time sweep varies around: `M`, `num_batches`, `epochs`.
      Paper: (4, 128, 1); datasets too small for J = 128 use their largest J.
    batch_size: B, the client's minibatch size (paper: 32).
    epsilon: the detector's bias eps (paper: 1e-3).
    threshold: xi, member iff Delta >= xi (paper: 0.1).
    learning_rate: client learning rate (paper: 1e-3 for SGD; Adam's default 1e-3).
    momentum: momentum of 'momentum' (paper: 0.9); read by no other optimizer.
    padding: FlowerCNN convolution padding: 'SAME' for 8x8 digits (VALID would leave nothing
      after two 5x5 convolutions), 'VALID' otherwise (the Flower tutorial's CNN).
    split: the split runs draw client data and targets from (paper: 'train').
    duplicate_splits: splits `experiments.duplicates` searches (within each, and the second
      against the first).
    near_threshold: near-duplicate threshold passed to `fl_privacy.data.duplicates` (L2
      distance of [0, 1] pixels; on digits 0.5 links 2 pairs of train images, 1.0 chains whole
      classes); 0 disables near duplicates.
  The section serves two experiments: `experiments.duplicates` reads `duplicate_splits` and
  `near_threshold` only, `experiments.dishonest_mia` everything else (the centre only under
  'one_at_a_time', the momentum only with 'momentum'); a command-line override of a
  field the experiment run does not read is refused (exit 2).
  """
  num_batches, center_j = _NUM_BATCHES.get(dataset, (PAPER_NUM_BATCHES, 128))
  s = ml_collections.ConfigDict()
  s.runs = 400
  s.M = PAPER_M
  s.optimizers = ('momentum', 'adam')
  s.num_batches = num_batches
  s.epochs = PAPER_EPOCHS
  s.grid = 'one_at_a_time'
  s.center = ml_collections.ConfigDict(dict(M=4, num_batches=center_j, epochs=1))
  s.batch_size = 32
  s.epsilon = 1e-3
  s.threshold = 0.1
  s.learning_rate = 1e-3
  s.momentum = 0.9
  s.padding = 'SAME' if dataset == 'digits' else 'VALID'
  s.split = 'train'
  s.duplicate_splits = ('train', 'test')
  s.near_threshold = 0.5
  if smoke:
    s.runs = 16
    s.M = (1, 4)
    s.optimizers = ('momentum', 'adam')
    s.num_batches = (2,)
    s.epochs = (1,)
    s.grid = 'product'
    s.center = ml_collections.ConfigDict(dict(M=4, num_batches=2, epochs=1))
  return s
