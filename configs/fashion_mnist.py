"""Fashion-MNIST through TFDS (prepare it first: see BUILD.md, "Datasets").

  python -m experiments.ldp_audit --config=configs/fashion_mnist.py
  add `:smoke` for a seconds-long run; `:data_dir=DIR` to read TFDS data from DIR.

Expected results: see configs/_ldp_audit.py.
"""

from configs import _base


def get_config(arg=None):
  return _base.build('fashion_mnist', arg, data=_base.data_section('fashion_mnist'),
                     experiments=('ldp_audit',))
