"""What reading the float32 loss instead of the margin-derived one changes on a FedMIA run.

Blackbox-Loss, Loss-Series and FedMIA-I read the cross-entropy softplus(-margin) derived in
float64 from each recording's logit margin (`attacks.passive.scores.signed_measurement`); the
recordings also keep the float32 loss, which rounds to exactly 0 from a margin of about 14.5.
This reads a finished run's stored recordings (`<workdir>/recorded/*.npz`, nothing is trained):
how many float32 losses are exactly 0, and, on the main trainings (no defense, IID, the main
K and E = 1), each loss attack's pooled AUC (scikit-learn) both ways.

  python -m benchmarks.fedmia_loss_precision --workdir=DIR [--num_clients=20]
"""

from __future__ import annotations

import glob
import os

from absl import app
from absl import flags
import numpy as np
from sklearn import metrics

from fl_privacy.attacks.passive import evaluate
from fl_privacy.attacks.passive import scores

_WORKDIR = flags.DEFINE_string('workdir', None, 'A finished experiments.fedmia workdir.')
_CLIENTS = flags.DEFINE_integer('num_clients', 20, 'K of the main setting (leaky 20, '
                                'well_generalising 10).')
ATTACKS = ('blackbox_loss', 'loss_series', 'fedmia_i')


def float32_reading(recording, name):
  """The reading before issue 41: -float32 loss, everything else as the library reads it."""
  if name == 'loss':
    return -np.asarray(recording['loss'], np.float64)
  return _LIBRARY(recording, name)


_LIBRARY = scores.signed_measurement


def auc(recording, attack) -> float:
  out = evaluate.final_scores(recording, recording['owner'], attack)
  return float(metrics.roc_auc_score(out['labels'], out['scores']))


def main(argv):
  del argv
  files = sorted(glob.glob(os.path.join(_WORKDIR.value, 'recorded', '*.npz')))
  if not files:
    raise app.UsageError(f'--workdir={_WORKDIR.value}: no recorded/*.npz there')
  zero = total = 0
  for name in files:
    with np.load(name) as f:
      zero += int((f['loss'] == 0).sum())
      total += f['loss'].size
  print(f'{len(files)} recordings: the float32 loss is exactly 0 in {zero:,} of {total:,} '
        f'entries ({zero / total:.2%})')
  main_runs = [n for n in files if 'defense-none' in n and 'beta-inf' in n
               and 'local_epochs-1_' in n and f'num_clients-{_CLIENTS.value}-' in n]
  for name in main_runs:
    with np.load(name) as f:
      recording = {k: f[k] for k in f.files}
    cells = []
    for attack in ATTACKS:
      derived = auc(recording, attack)
      scores.signed_measurement = float32_reading
      try:
        rounded = auc(recording, attack)
      finally:
        scores.signed_measurement = _LIBRARY
      cells.append(f'{attack} {derived:.5f} (float32 {rounded:.5f})')
    print(os.path.basename(name)[-24:], '|', ' | '.join(cells))


if __name__ == '__main__':
  flags.mark_flag_as_required('workdir')
  app.run(main)
