"""A user's own data from a `.npz` file.

  python -m experiments.ami --config=configs/npz.py:path=/data/mine.npz
  python -m experiments.dishonest_mia --config=configs/npz.py:path=/data/mine.npz,smoke
  python -m experiments.pastel --config=configs/npz.py:path=/data/mine.npz
  python -m experiments.fedmia --config=configs/npz.py:path=/data/mine.npz
  python -m experiments.training_audit --config=configs/npz.py:path=/data/mine.npz
  python -m experiments.reconstruction --config=configs/npz.py:path=/data/mine.npz

The file holds `images` (uint8 NHWC) or `x` (float32 features [N, d]) and `labels` or
`y` (ints); optional `images_test`/`x_test` and `labels_test`/`y_test`. Without test
arrays a deterministic split is made. The experiment sections use the digits defaults
(configs/_<experiment>.py, dataset key 'npz'); override any field on the command line,
e.g. `--config.ami.batch_size=50`.
"""

from configs import _base


def get_config(arg=None):
  return _base.build('npz', arg, data=_base.data_section('npz'),
                     experiments=('ami', 'dishonest', 'ldp_audit', 'fedmia', 'pastel',
                                  'dp_audit', 'training_audit', 'reconstruction'))
