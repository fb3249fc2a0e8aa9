"""PASTEL and the DP baselines, judged by membership attacks (Elhattab and Bouchenak).

Each client adds to its cross-entropy lambda times the Jensen-Shannon divergence between a member
batch and a held-out batch at hidden layers, and trains with AdaGrad (Eqs. 1-5, Algorithm 1);
it is compared with weak, local and central DP (accounted with dp-accounting) by the white-box
attack of Nasr et al. (2019), the loss threshold and FedMIA-I/II, on the clients' uploaded
models (`local`) and on the global model (`global`).

  python -m experiments.pastel                                   # digits leaky: 5.3 min cold, 2 cores
  python -m experiments.pastel --config=configs/digits.py:setting=well_generalising
  python -m experiments.pastel --config=configs/digits.py:smoke  # seconds (CI)
  python -m experiments.pastel --config=configs/cifar10.py       # ResNet-18-GN: GPU advised
  python -m experiments.pastel --config.pastel.pastel_representations="('gradient',)"

Writes, beside results.json (one point per defense, strength, optimizer, representation,
attack, target, its scores pooled over `pastel.replicates` trainings; defended points carry
their paired AUC change against `none`): `table.md` (defense x strength: accuracy, AUC local
and global, the changes), `pastel_privacy_utility.png`,
`pastel_auc.png`, `pastel_loss_hist.png`, and `trained/*.npz` (recorded features and FedMIA
measurements of each training, so re-scoring and resuming never retrain).
Code: fl_privacy/pipelines/pastel.py (`prepare`, `plan`, `figures`), fl_privacy/pipelines/pastel_figures.py,
fl_privacy/defenses/pastel.py, fl_privacy/defenses/pastel_training.py (trainings, DP baselines),
fl_privacy/attacks/passive/pastel.py (recording, attacks), fl_privacy/attacks/passive/whitebox.py.
Fields: configs/_pastel.py.
Expected results: docs/experiments/pastel.md.
"""

from __future__ import annotations

from experiments import common

if __name__ == '__main__':
  common.run('pastel')
