"""Why PASTEL's white-box attack trails the loss threshold: its AUC against known pairs and groups.

Reads the undefended AdaGrad training of a finished `python -m experiments.pastel` run (its
`trained/` artifacts: nothing is retrained) and trains the white-box attack of Nasr et al.
(`attacks.passive.whitebox.train_and_score`, the run's steps, learning rate and width) on the
training halves of the first k replicates, for several k and feature groups, always scoring the
same rows as the run (every replicate's evaluation half). A diagnostic: the run's attack is not
changed by it (docs/experiments/pastel.md, "The white-box attack").

  PYTHONPATH=. python tools/pastel_whitebox_pairs.py --workdir=/tmp/pastel-leaky \
      [--config=configs/digits.py[:ARGS]]
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from experiments import common
from fl_privacy.attacks.passive import pastel as passive_pastel
from fl_privacy.attacks.passive import whitebox
from fl_privacy.eval import metrics
from fl_privacy.pipelines import pastel
from fl_privacy.report import ArtifactStore
from fl_privacy.report import point_key

GROUPS = (('loss',), ('output', 'label', 'loss'), ('output', 'label', 'loss', 'grad_norms'),
          whitebox.GROUPS)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--config', default='configs/digits.py')
  args = parser.parse_args()
  path, _, arg = args.config.partition(':')
  config = common.load_config_file(path, arg or None)
  s = config.pastel
  state = pastel.prepare(config)
  key = jax.random.key(int(config.seed))
  reps = [passive_pastel.replicate(
      jax.random.fold_in(key, r), state['x_train'], state['train'].y, state['x_test'],
      state['test'].y, int(s.num_clients), float(s.validation_fraction),
      None if s.per_client is None else int(s.per_client)) for r in range(int(s.replicates))]
  tr = dict(defense='none', strength=0.0, optimizer=s.optimizer, representation='-')
  store = ArtifactStore(args.workdir, pastel.TRAINED)
  arrays = [store.load(dict(tr, replicate=r)) for r in range(len(reps))]
  if any(a is None for a in arrays):
    raise SystemExit(f'{args.workdir}: the undefended trainings are not all stored')
  counts = sorted({1, 2, len(reps) // 2, len(reps)} - {0})
  for target in s.targets:
    pre = f'{target}/'
    feats = [{k[len(pre):]: v for k, v in a.items() if k.startswith(pre)} for a in arrays]
    rows = [d['rows'][target] for d in reps]
    cat = lambda part, groups, k: {g: np.concatenate([f[g][r[part]] for f, r in zip(
        feats[:k], rows[:k])]) for g in groups}
    labels = np.concatenate([r['labels'][r['eval']] for r in rows])
    evaluated = cat('eval', whitebox.GROUPS, len(reps))
    loss_auc = metrics.roc_auc(whitebox.loss_scores({'loss': evaluated['loss']}), labels)
    print(f'{target}: loss threshold AUC {loss_auc:.3f} on {labels.size // 2} + '
          f'{labels.size // 2} rows')
    for groups in GROUPS:
      line = []
      for k in counts:
        train_labels = np.concatenate([r['labels'][r['train']] for r in rows[:k]])
        scores = whitebox.train_and_score(
            point_key(key, {'role': 'attack', 'target': target}), cat('train', groups, k),
            train_labels, {g: evaluated[g] for g in groups}, steps=int(s.attack_steps),
            learning_rate=float(s.attack_learning_rate), hidden=int(s.attack_hidden))
        line.append(f'{train_labels.size // 2} pairs {metrics.roc_auc(scores, labels):.3f}')
      print(f'  {"+".join(groups)}: ' + ', '.join(line), flush=True)


if __name__ == '__main__':
  main()
