"""SVHN (cropped digits) through TFDS (prepare it first: see BUILD.md, "Datasets").

  python -m experiments.ldp_audit --config=configs/svhn_cropped.py
  add `:smoke` for a seconds-long run; `:data_dir=DIR` to read TFDS data from DIR.

Expected results: see configs/_ldp_audit.py.
"""

from configs import _base


def get_config(arg=None):
  return _base.build('svhn_cropped', arg, data=_base.data_section('svhn_cropped'),
                     experiments=('ldp_audit',))
