"""Imagenette through TFDS (see BUILD.md, "Datasets").

  python -m experiments.ami --config=configs/imagenette.py      # |D| = 64, GPU advised
  add `:smoke` for a short run; `:data_dir=DIR` to read TFDS data from DIR.

AMI roles follow the paper: target = one train image, adversary negatives = the
validation split, game pool = train minus target. Images resized to `data.image_size`.
"""

from configs import _base


def get_config(arg=None):
  return _base.build('imagenette', arg, data=_base.data_section('imagenette', image_size=64),
                     experiments=('ami',))
