"""MNIST through TFDS (prepare it first: see BUILD.md, "Datasets").

  python -m experiments.dishonest_mia --config=configs/mnist.py
  python -m experiments.ldp_audit --config=configs/mnist.py
  add `:smoke` for a seconds-long run; `:data_dir=DIR` to read TFDS data from DIR.

On a machine where MNIST is not prepared the run stops within seconds with a message
naming the dataset, the data_dir and how to prepare it (exit status 2).
Expected results: see configs/_dishonest.py and configs/_ldp_audit.py.
"""

from configs import _base


def get_config(arg=None):
  return _base.build('mnist', arg, data=_base.data_section('mnist'),
                     experiments=('dishonest', 'ldp_audit'))
