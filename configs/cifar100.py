"""CIFAR-100 through TFDS (prepare it first: see BUILD.md, "Datasets").

  python -m experiments.dishonest_mia --config=configs/cifar100.py
  python -m experiments.duplicates --config=configs/cifar100.py
  python -m experiments.fedmia --config=configs/cifar100.py   # FedMIA's setting (Table 1): GPU, hours
  add `:smoke` for a seconds-long run; `:data_dir=DIR` to read TFDS data from DIR.

The dishonest-server paper traced its rare failures on CIFAR-100 to 14 groups of exact
duplicates in the train split; experiments.duplicates lists them.
"""

from configs import _base


def get_config(arg=None):
  return _base.build('cifar100', arg, data=_base.data_section('cifar100'),
                     experiments=('dishonest', 'fedmia'))
