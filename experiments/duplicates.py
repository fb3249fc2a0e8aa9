"""Exact and near-duplicate images: within each split, and test images found in train.

The dishonest-server paper traced every failure of its detector to duplicate images (14 exact
groups in CIFAR-100 train, 82 in CelebA, test images repeated in train, often with another
label). This lists them with `fl_privacy.data.duplicates`, so a false positive of
`experiments.dishonest_mia` can be looked up.

  python -m experiments.duplicates                                   # digits, seconds
  python -m experiments.duplicates --config=configs/cifar100.py:data_dir=DIR
  python -m experiments.duplicates --config.dishonest.near_threshold=0   # exact only

Writes `duplicates.json` (every group: indices and labels) and `duplicates.txt` (readable)
beside results.json, whose points are (scope, kind) with the number of groups, of examples in
them, and of groups whose labels disagree. Near duplicates are connected components of
"L2 distance of [0, 1] pixels <= dishonest.near_threshold" and include the exact ones.
Code: fl_privacy/pipelines/duplicates.py (`prepare`, `plan`, `figures`).
Fields: configs/_dishonest.py (`duplicate_splits`, `near_threshold`).
"""

from __future__ import annotations

from experiments import common

if __name__ == '__main__':
  common.run('duplicates')
