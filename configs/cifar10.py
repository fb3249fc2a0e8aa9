"""CIFAR-10 through TFDS (prepare it first: see BUILD.md, "Datasets").

  python -m experiments.ami --config=configs/cifar10.py            # |D| = 100, GPU advised
  python -m experiments.dishonest_mia --config=configs/cifar10.py
  python -m experiments.ldp_audit --config=configs/cifar10.py
  python -m experiments.fedmia --config=configs/cifar10.py         # AlexNet, 300 rounds: GPU
  python -m experiments.pastel --config=configs/cifar10.py         # ResNet-18-GN: GPU
  python -m experiments.reconstruction --config=configs/cifar10.py # colour images: GPU advised
  add `:smoke` for a seconds-long run; `:data_dir=DIR` to read TFDS data from DIR.

AMI roles follow the paper: target = first test image, adversary negatives = train
split, game pool = the other test images. Expected results: configs/_ami.py,
configs/_dishonest.py, configs/_ldp_audit.py.
"""

from configs import _base


def get_config(arg=None):
  return _base.build('cifar10', arg, data=_base.data_section('cifar10'),
                     experiments=('ami', 'dishonest', 'ldp_audit', 'fedmia', 'pastel', 'reconstruction'))
