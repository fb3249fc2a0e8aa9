"""Coverage of the membership-inference intervals by simulation (`eval.coverage`).

Not a speed benchmark: it prints, for synthetic FedMIA-like scores with a training effect, a
target-client effect and a query effect (`eval.coverage.Design`), how often each interval
holds the expected value over trainings of the statistic, out of how many simulated
experiments, with a Clopper-Pearson interval on each coverage and the count of zero-width
intervals (no verdict). The training effect is FITTED to the measured runs first:

- Measured (copied from the docs, sources below): for each FedMIA paired AUC claim of the
  leaky default, the variance over its 3 replicated trainings (from the 95% t half-width h:
  s = h sqrt(3) / t_{0.975, 2}) against the within-training variance of one training's
  query-cluster bootstrap interval ((high - low) / 3.92)^2; pooled by
  `eval.coverage.variance_ratio` (total / within, 1 = no training effect, with its chi-square
  interval). PASTEL's leaky default (10 replicates, 108 points): the median ratio 1.08 of the
  t-interval's width to DeLong's on the pooled rows gives total / within = (1.08 / (t_{0.975,
  9} / 1.96))^2. The well-generalising FedMIA run's per-replicate TPRs at 0.1% FPR against a
  binomial within-training variance are printed as a check.
- Fitted: the `training_sd` whose `simulated_ratio` (the same total / within in the
  generative model) is nearest the measured one (`eval.coverage.fit_training_sd`), at the
  measured point and at the upper end of its interval; the cases below use the larger.

Cases:
- `fitted`: the AUC design with the fitted training effect, R = 3 (FedMIA's default) and 10
  (PASTEL's): AUC of attack A and A minus B.
- `fitted_tpr`: the few-true-positives design (200 members, about 1.4 above the 0.1%-FPR
  threshold: FedMIA's 320 members at 0.2-1.9%) with the fitted training effect, R = 3: TPR at
  0.1% FPR and the paired TPR difference A - B (what every 0.1%-FPR claim reports).
- `invented`: the earlier design's training effect (sd 0.5 on a signal of 1.0), which the
  measured data do not show, kept for contrast at R = 3.
- `few_true_positives`: one training (R = 1) of that design: the percentile query-cluster
  bootstrap against Clopper-Pearson on the counts.

  python -m benchmarks.coverage_simulation        # the table of benchmarks/README.md

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
from scipy import stats as sps

from fl_privacy.eval import coverage
from fl_privacy.eval import replicated

FLAGS = flags.FLAGS
flags.DEFINE_list('fitted_replicates', ['3', '10'], 'R of the fitted AUC case.')
flags.DEFINE_list('cases', ['fitted', 'fitted_tpr', 'invented', 'few_true_positives'],
                  'Cases to run.')
flags.DEFINE_integer('experiments', 250, 'Simulated experiments per case and R.')
flags.DEFINE_integer('resamples', 200, 'Bootstrap resamples of every interval.')
flags.DEFINE_integer('truth_entries', 10_000_000,
                     'Monte Carlo budget of each estimand, in entries (trainings x K x Q).')
flags.DEFINE_integer('seed', 0, 'Seed of every draw.')

INVENTED = coverage.Design()
# About 1.4 of 200 members above the threshold at 0.1% FPR on average (3,800 non-member
# entries, 3 false positives admitted): the 0-5 true positives of the FedMIA headlines' TPR
# at 0.1% FPR (3 of 320).
FEW_TRUE_POSITIVES = dataclasses.replace(INVENTED, num_clients=10, num_queries=400,
                                         signal_a=0.7, training_sd=0.0, client_sd=0.2,
                                         client_signal_sd=0.1, query_sd=0.5)
FEW_FPR = 1e-3
FIT_GRID = (0.0, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5)

# docs/experiments/fedmia.md, leaky default (digits, 20 clients, seed 0): A - B in AUC,
# (one training's query-cluster bootstrap 95% interval, "Claims as paired differences", one
# training) and (the 3-replicate 95% t-interval, "Findings"). FedMIA-II minus Avg-Cosine's
# replicated value is given per training (-0.004, -0.003, -0.002) instead.
FEDMIA_AUC_DIFF = (
    ('FedMIA-II - Grad-Cosine', (0.013, 0.033), (0.017, 0.031)),
    ('FedMIA-II - Avg-Cosine', (-0.007, -0.001), (-0.004, -0.003, -0.002)),
    ('FedMIA-I - Blackbox-Loss', (0.155, 0.236), (0.179, 0.192)),
    ('FedMIA-I - Loss-Series', (0.075, 0.147), (0.084, 0.129)),
    ('FedMIA-II - LiRA offline', (-0.001, 0.004), (0.0006, 0.0027)),
    ('FedMIA-II - RMIA', (0.000, 0.030), (0.004, 0.030)),
    ('FedMIA-II - LiRA online', (0.041, 0.106), (0.004, 0.088)),
    ('FedMIA-II - LiRA online fixed', (-0.011, 0.015), (-0.008, 0.009)),
)
FEDMIA_REPLICATES = 3
# docs/experiments/pastel.md, leaky default: median width ratio (t over 10 replicates /
# DeLong on the pooled rows) over the 108 points.
PASTEL_WIDTH_RATIO, PASTEL_REPLICATES = 1.08, 10
# docs/experiments/fedmia.md, well-generalising Table 1: per-replicate TPR@0.1% FPR (%) of
# each attack, 1,438 members per training.
WELL_GENERALISING_TPR = ((0.07, 0.14, 0.14), (0.21, 0.14, 0.35), (0.07, 0.14, 0.14),
                         (0.07, 0.07, 0.07), (0.35, 0.28, 0.14), (0.49, 0.49, 0.56),
                         (0.28, 0.35, 0.14), (0.07, 0.07, 0.07), (0.21, 0.35, 0.07),
                         (0.35, 0.42, 0.28), (0.70, 0.42, 0.56), (0.14, 0.49, 0.28),
                         (0.70, 0.42, 0.56), (0.28, 0.35, 0.21), (0.70, 0.42, 0.56))
WELL_GENERALISING_MEMBERS = 1438
Z = 1.959963984540054


def measured_ratios() -> dict[str, dict[str, float]]:
  """The measured total / within-training variance ratios (module docstring)."""
  t2 = float(sps.t.ppf(0.975, FEDMIA_REPLICATES - 1))
  s2, w = [], []
  for _, (low, high), rep in FEDMIA_AUC_DIFF:
    w.append(((high - low) / (2 * Z)) ** 2)
    if len(rep) == FEDMIA_REPLICATES:
      s2.append(float(np.var(rep, ddof=1)))
    else:
      s2.append(((rep[1] - rep[0]) / 2 * np.sqrt(FEDMIA_REPLICATES) / t2) ** 2)
  out = dict(fedmia_auc_diff=coverage.variance_ratio(s2, w, [FEDMIA_REPLICATES - 1] * len(w)))
  t9 = float(sps.t.ppf(0.975, PASTEL_REPLICATES - 1))
  ratio = (PASTEL_WIDTH_RATIO / (t9 / Z)) ** 2
  out['pastel_auc'] = dict(ratio=ratio, low=float('nan'), high=float('nan'),
                           df=float('nan'), points=108)
  tprs = np.asarray(WELL_GENERALISING_TPR) / 100.0
  p = tprs.mean(axis=1)
  out['fedmia_tpr_binomial'] = coverage.variance_ratio(
      tprs.var(axis=1, ddof=1), p * (1 - p) / WELL_GENERALISING_MEMBERS,
      [tprs.shape[1] - 1] * len(p))
  return out


def _rows(case: str, num_trainings: int, truth: dict, result: dict) -> list[dict]:
  rows = []
  for (quantity, method), c in result.items():
    rows.append(dict(case=case, R=num_trainings, quantity=quantity, method=method,
                     estimand=truth[quantity], **c))
  return rows


def _print(rows: list[dict]) -> None:
  print(f"{'case':<20} {'R':>2} {'quantity':<9} {'method':<23} {'coverage':>8} "
        f"{'95% CP':>15} {'n':>4} {'miss lo/hi':>10} {'width':>7} {'0-width':>7}")
  for r in rows:
    print(f"{r['case']:<20} {r['R']:>2} {r['quantity']:<9} {r['method']:<23} "
          f"{r['coverage']:>8.3f} [{r['coverage_low']:.3f}, {r['coverage_high']:.3f}] "
          f"{r['num_experiments']:>4} {r['missed_low']:>4}/{r['missed_high']:<5} "
          f"{r['mean_width']:>7.4f} {r['not_estimable']:>7}")


def _finite(x):
  """`x` with NaN floats as None, so the last line is valid JSON."""
  if isinstance(x, dict):
    return {str(k): _finite(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_finite(v) for v in x]
  return None if isinstance(x, float) and np.isnan(x) else x


def _print_fit(measured: dict, fits: dict) -> None:
  print('Measured total / within-training variance (1 = no training effect):')
  for name, m in measured.items():
    print(f"  {name:<20} {m['ratio']:.3f} [{m['low']:.3f}, {m['high']:.3f}] "
          f"({m['points']} points, df {m['df']:g})")
  for name, (quantity, target, sd, ratios) in fits.items():
    print(f'  fit {name}: {quantity} target {target:.3f} -> training_sd {sd:g}; simulated '
          + ', '.join(f'{k:g}: {v:.2f}' for k, v in ratios.items()))


def main(argv):
  del argv
  rng = np.random.default_rng(FLAGS.seed)
  start = time.time()
  measured = measured_ratios()
  fits = {}
  for name, quantity, key in (('fedmia', 'auc_diff', 'fedmia_auc_diff'),
                              ('pastel', 'auc_a', 'pastel_auc')):
    for bound in ('ratio', 'high'):
      target = measured[key][bound]
      if np.isnan(target):
        continue
      sd, ratios = coverage.fit_training_sd(INVENTED, target, FIT_GRID, rng=rng,
                                            quantity=quantity)
      fits[f'{name} ({"point" if bound == "ratio" else "upper 95%"})'] = (quantity, target,
                                                                         sd, ratios)
  fitted_sd = max(f[2] for f in fits.values())
  _print_fit(measured, fits)
  print(f'  fitted training_sd (largest of the fits): {fitted_sd:g}\n')
  fitted = dataclasses.replace(INVENTED, training_sd=fitted_sd)
  fitted_tpr = dataclasses.replace(FEW_TRUE_POSITIVES, training_sd=fitted_sd)
  cases = []
  if 'fitted' in FLAGS.cases:
    cases += [('fitted', fitted, int(r), None) for r in FLAGS.fitted_replicates]
  if 'fitted_tpr' in FLAGS.cases:
    cases.append(('fitted_tpr', fitted_tpr, 3, FEW_FPR))
  if 'invented' in FLAGS.cases:
    cases.append(('invented', INVENTED, 3, None))
  if 'few_true_positives' in FLAGS.cases:
    cases.append(('few_true_positives', FEW_TRUE_POSITIVES, 1, FEW_FPR))
  truths, rows = {}, []
  for case, design, num_trainings, fpr in cases:
    if case not in truths:
      truths[case] = coverage.estimand(
          design, rng=rng, num_trainings=max(1000, FLAGS.truth_entries // design.num_entries),
          fpr=fpr)
      t = truths[case]
      print(f'{case}: {design}')
      print('  estimand: ' + ', '.join(
          f"{k} {t[k]:.4f} (MC se {t[k + '_se']:.4f})"
          for k in ('auc_a', 'auc_diff', 'tpr_a', 'tpr_diff') if k in t)
            + f" over {t['num_trainings']} trainings")
    tpr_case = case == 'fitted_tpr'
    result = coverage.coverage(
        design, num_trainings, truths[case], rng=rng, num_experiments=FLAGS.experiments,
        num_resamples=FLAGS.resamples, fpr=fpr, auc=fpr is None, tpr_diff=tpr_case,
        resample=not tpr_case,
        conditional=('conditional_one',) if tpr_case else ('conditional_one',
                                                           'conditional_pooled'))
    rows += _rows(case, num_trainings, truths[case], result)
  print()
  _print(rows)
  print(f'\n{FLAGS.experiments} experiments per row, {FLAGS.resamples} bootstrap resamples, '
        f'seed {FLAGS.seed}; reported interval: replicated.interval_method(R) = '
        f"{replicated.interval_method(2)!r} for R >= 2; {time.time() - start:.0f} s")
  print(json.dumps(_finite(dict(
      measured=measured, fitted_training_sd=fitted_sd,
      fits={k: dict(quantity=q, target=t, training_sd=sd, simulated=r)
            for k, (q, t, sd, r) in fits.items()},
      rows=[{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
            for r in rows]))))


if __name__ == '__main__':
  app.run(main)
