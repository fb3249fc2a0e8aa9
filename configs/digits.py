"""scikit-learn's 8x8 handwritten digits: the embedded offline default.

Runs anywhere, no download: 1,797 real images shipped with scikit-learn.
Every experiment uses this config when `--config` is not given.

  python -m experiments.ami                              # main job, about 1-1.5 minutes on 2 CPU cores
  python -m experiments.ami --config=configs/digits.py:smoke   # seconds (CI)
  python -m experiments.dishonest_mia --config=configs/digits.py
  python -m experiments.ldp_audit --config=configs/digits.py
  python -m experiments.duplicates --config=configs/digits.py
  python -m experiments.fedmia --config=configs/digits.py     # FedMIA: 32 trainings, docs/experiments/fedmia.md
  python -m experiments.fedmia --config=configs/digits.py:setting=well_generalising  # the second setting
  python -m experiments.pastel --config=configs/digits.py     # PASTEL vs DP: 18 trainings x 10 replicates
  python -m experiments.dp_audit --config=configs/digits.py   # every DP mechanism vs its claim
  python -m experiments.flower_audit --config=configs/digits.py  # a Flower deployment (extra [flower])
  python -m experiments.flower_audit --config=configs/digits.py:deployment  # Flower's Deployment Engine, 24 nodes
  python -m experiments.training_audit --config=configs/digits.py  # canaries in the trainings that run
  python -m experiments.reconstruction --config=configs/digits.py  # imprint/analytic/inversion under defenses
  python -m experiments.dp_bugs --config=configs/digits.py    # documented DP bugs vs their twins

Arguments after `:` (comma-separated): `smoke`, `setting=leaky|well_generalising` (FedMIA
and PASTEL: little data per client, the default, or the whole train split over fewer clients;
configs/_fedmia.py and configs/_pastel.py say what each gives), and `deployment`: the
`flower_audit` preset for a local Flower Deployment Engine that fits this machine (24 nodes;
its canaries certify at most 0.0: configs/_flower_audit.py `deployment_preset`).

Sections: `data` (see configs/_base.py), `game.chunk_size`, `seed`, and `ami`,
`dishonest`, `ldp_audit`, `fedmia`, `pastel`, `dp_audit`, `flower_audit`, `training_audit`,
`reconstruction`, `dp_bugs` (each documented in configs/_<experiment>.py, with the
result to expect on this dataset), and `defense` (configs/_defense.py: the defense the
ami, dishonest and reconstruction clients run, default none).
"""

from configs import _base
from configs import _flower_audit


def get_config(arg=None):
  words = [w for w in (arg or '').split(',') if w]
  rest = ','.join(w for w in words if w != 'deployment') or None
  config = _base.build('digits', rest, data=_base.data_section('digits'),
                       experiments=('ami', 'dishonest', 'ldp_audit', 'fedmia', 'pastel',
                                    'dp_audit', 'flower_audit', 'training_audit',
                                    'reconstruction', 'dp_bugs'))
  if 'deployment' in words:
    _flower_audit.deployment_preset(config.flower_audit)
  return config
