"""Coverage of the membership-inference intervals by simulation (`eval.coverage`).

Not a speed benchmark: it prints, for synthetic FedMIA-like scores with a training effect, a
target-client effect and a query effect (`eval.coverage.Design`), how often each interval
holds the expected value over trainings of the statistic, out of how many simulated
experiments, with a Clopper-Pearson interval on each coverage. Cases:

- `training effect`: the membership signal varies by training (sd 0.5 around 1.0), R = 3 and
  5 trainings per experiment; AUC of attack A and AUC of A minus B (a correlated attack).
- `no training effect`: the same without the training's random effect (clients and queries
  still shared by the entries), R = 5.
- `few true positives`: one training of 10 clients x 400 queries, TPR at 0.1% FPR with about
  1.4 true positives on average (0 to 5 in most trainings): the percentile query-cluster bootstrap against Clopper-Pearson on the
  counts and the wider of the two.

  python -m benchmarks.coverage_simulation                  # the default table, < 2 min
  python -m benchmarks.coverage_simulation --replicates=10,20 --no_effect_replicates=10,20 \
      --cases=training_effect,no_training_effect --experiments=200   # behind the R threshold

The estimand of each case comes from `eval.coverage.estimand` (a Monte Carlo over
`--truth_entries` / (K Q) trainings; its standard error is printed and is small against the
intervals' widths). The last line is a JSON object of every coverage.
"""

from __future__ import annotations

import dataclasses
import json
import time

from absl import app
from absl import flags
import numpy as np

from fl_privacy.eval import coverage
from fl_privacy.eval import replicated

FLAGS = flags.FLAGS
flags.DEFINE_list('replicates', ['3', '5'], 'R of the training-effect case.')
flags.DEFINE_list('no_effect_replicates', ['5'], 'R of the no-training-effect case.')
flags.DEFINE_list('cases', ['training_effect', 'no_training_effect', 'few_true_positives'],
                  'Cases to run.')
flags.DEFINE_integer('experiments', 250, 'Simulated experiments per case and R.')
flags.DEFINE_integer('resamples', 200, 'Bootstrap resamples of every interval.')
flags.DEFINE_integer('truth_entries', 10_000_000,
                     'Monte Carlo budget of each estimand, in entries (trainings x K x Q).')
flags.DEFINE_integer('seed', 0, 'Seed of every draw.')

TRAINING_EFFECT = coverage.Design()
NO_TRAINING_EFFECT = dataclasses.replace(TRAINING_EFFECT, training_sd=0.0)
# About 1.4 of 200 members above the threshold at 0.1% FPR on average (3,800 non-member
# entries, 3 false positives admitted): the 0-5 true positives of the FedMIA headlines' TPR
# at 0.1% FPR (3 of 320).
FEW_TRUE_POSITIVES = dataclasses.replace(TRAINING_EFFECT, num_clients=10, num_queries=400,
                                         signal_a=0.7, training_sd=0.0, client_sd=0.2,
                                         client_signal_sd=0.1, query_sd=0.5)
FEW_FPR = 1e-3


def _rows(case: str, num_trainings: int, truth: dict, result: dict) -> list[dict]:
  rows = []
  for (quantity, method), c in result.items():
    rows.append(dict(case=case, R=num_trainings, quantity=quantity, method=method,
                     estimand=truth[quantity], **c))
  return rows


def _print(rows: list[dict]) -> None:
  print(f"{'case':<20} {'R':>2} {'quantity':<9} {'method':<23} {'coverage':>8} "
        f"{'95% CP':>15} {'n':>4} {'miss lo/hi':>10} {'width':>7}")
  for r in rows:
    print(f"{r['case']:<20} {r['R']:>2} {r['quantity']:<9} {r['method']:<23} "
          f"{r['coverage']:>8.3f} [{r['coverage_low']:.3f}, {r['coverage_high']:.3f}] "
          f"{r['num_experiments']:>4} {r['missed_low']:>4}/{r['missed_high']:<5} "
          f"{r['mean_width']:>7.4f}")


def main(argv):
  del argv
  rng = np.random.default_rng(FLAGS.seed)
  rows = []
  start = time.time()
  cases = []
  if 'training_effect' in FLAGS.cases:
    cases += [('training_effect', TRAINING_EFFECT, int(r), None) for r in FLAGS.replicates]
  if 'no_training_effect' in FLAGS.cases:
    cases += [('no_training_effect', NO_TRAINING_EFFECT, int(r), None)
              for r in FLAGS.no_effect_replicates]
  if 'few_true_positives' in FLAGS.cases:
    cases.append(('few_true_positives', FEW_TRUE_POSITIVES, 1, FEW_FPR))
  truths = {}
  for case, design, num_trainings, fpr in cases:
    if case not in truths:
      truths[case] = coverage.estimand(
          design, rng=rng, num_trainings=max(1000, FLAGS.truth_entries // design.num_entries),
          fpr=fpr)
      t = truths[case]
      print(f'{case}: {design}')
      print('  estimand: ' + ', '.join(
          f"{k} {t[k]:.4f} (MC se {t[k + '_se']:.4f})" for k in ('auc_a', 'auc_diff', 'tpr_a')
          if k in t) + f" over {t['num_trainings']} trainings")
    result = coverage.coverage(design, num_trainings, truths[case], rng=rng,
                               num_experiments=FLAGS.experiments,
                               num_resamples=FLAGS.resamples, fpr=fpr, auc=fpr is None)
    rows += _rows(case, num_trainings, truths[case], result)
  print()
  _print(rows)
  print(f'\n{FLAGS.experiments} experiments per row, {FLAGS.resamples} bootstrap resamples, '
        f'seed {FLAGS.seed}; reported interval: replicated.interval_method(R) = '
        f"{replicated.interval_method(2)!r} for R >= 2; {time.time() - start:.0f} s")
  print(json.dumps([{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
                    for r in rows]))


if __name__ == '__main__':
  app.run(main)
