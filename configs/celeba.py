"""CelebA through TFDS (manual download; see BUILD.md, "Datasets"). The main job:

  python -m experiments.ami --config=configs/celeba.py          # |D| = 20, GPU advised
  python -m experiments.dishonest_mia --config=configs/celeba.py
  add `:smoke` for a short run; `:data_dir=DIR` to read TFDS data from DIR.

Label = the `data.attribute` column (default Smiling); images resized to
`data.image_size` (64). AMI roles follow the paper: target = first train image,
adversary negatives = the validation split, game pool = train minus target.
On a machine without prepared CelebA the run stops within seconds with a message
naming the dataset, the data_dir and how to prepare it (exit status 2).
"""

from configs import _base


def get_config(arg=None):
  return _base.build('celeba', arg, data=_base.data_section('celeb_a', image_size=64),
                     experiments=('ami', 'dishonest'))
