"""PASTEL's points over its replicated trainings: attack statistics and paired claims.

`pastel.replicates` = R independent replicates (key fold_in(run key, r)), each training every
defense on its own shards, held-out rows, attack halves, w_0 and client keys. A point's attack
AUC and TPR at 1% and 0.1% FPR, and its paired change against `none` (the same attack on the
same rows of the same replicate), are reported over the replicates by `eval.replicated`,
following `pipelines.fedmia_replicates`: the headline is the mean of the R per-replicate
values, `<name>_ci_low/_ci_high` the interval `interval_method` names (Student's t over the
replicates for every R >= 2; for R = 1 the two-way bootstrap of the attacked models and the
examples, conditional on that training), for a TPR joined with Clopper-Pearson on the pooled
counts (their union). Entries: `target` = the attacked model (client k's upload on `local`, 0 for
the global model), `groups` = the example id (`attacks.passive.pastel.identities`).

What was the headline before, the rows pooled over replicates taken as one sample (DeLong for
the AUC and the paired change, Clopper-Pearson for a TPR), is kept under `pooled_*` (and
`<tpr>_pooled`, `_cp_low/high`); it is conditional on the trainings. Each replicate's own
single-training intervals are under `conditional`.

Not covered by default: the white-box attack model of Nasr et al. is trained once on every
replicate's training half (`attacks.passive.pastel.pooled_attack_scores`), so its own training
randomness (initialisation, Adam's batches) is shared by all replicates and no interval here
includes it; `pastel.attack_per_replicate=True` trains one per replicate on its own half
(independent, but on a tenth of the pairs at R = 10).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fl_privacy.attacks.passive import pastel as passive_pastel
from fl_privacy.eval import paired
from fl_privacy.eval import replicated
from fl_privacy.eval import utility as utility_lib

# Attack statistics reported over the replicates, by PASTEL's names.
ATTACK = ('attack_auc', 'tpr_at_fpr_1e-2', 'tpr_at_fpr_1e-3')
# The low FPR of the paired TPR change (FedMIA's claims use the same), and its name.
CLAIM_FPR, CLAIM_TPR = 1e-3, 'tpr_at_fpr_1e-3'
# Words for `interval_method` in the table and the docs.
METHODS = {'t': "Student's t over the per-replicate values, R - 1 degrees of freedom",
           'hierarchical_bootstrap': 'hierarchical bootstrap: replicates, then attacked '
                                     'models and examples',
           'two_way_bootstrap_conditional': 'one training: two-way bootstrap of its attacked '
                                            'models and examples, conditional on it'}


def attack_options(config) -> dict:
  """`pooled_attack_scores`' options: the white-box attack's training (`pastel.attack_*`)."""
  s = config.pastel
  return dict(steps=int(s.attack_steps), learning_rate=float(s.attack_learning_rate),
              hidden=int(s.attack_hidden), per_replicate=bool(s.attack_per_replicate))


def split(scored: tuple) -> list[dict[str, np.ndarray]]:
  """`pooled_attack_scores`' (scores, labels, ids, replicate, attacked) as R per-replicate
  entries for `eval.replicated` (`scores`, `labels`, `target` = attacked, `groups` = ids)."""
  scores, labels, ids, which, attacked = scored
  which = np.asarray(which)
  return [dict(scores=scores[which == r], labels=labels[which == r],
               target=attacked[which == r], groups=ids[which == r])
          for r in range(int(which.max()) + 1)]


def point(scored: tuple, *, rng: np.random.Generator, num_resamples: int) -> dict[str, Any]:
  """One point's attack metrics over the replicates (module docstring).

  Returns:
    `eval.replicated.metrics` with `auc` read as `attack_auc` (`attack_auc`, `_replicates`,
    `_t_low/high`, `_boot_low/high`, `_low/high`), `<name>_ci_low/high` = the reported
    interval for every name of ATTACK, `interval_method`, `replicates` = R; the pooled rows'
    counts (`n_pos`, `n_neg`, `n_neg_distinct`: distinct examples over all replicates) and
    single-sample numbers (`pooled_attack_auc` with DeLong's `_ci_low/high`,
    `pooled_log_auc`, `pooled_<tpr>_distinct_negatives`); `conditional`: per replicate its
    AUC, TPRs and their single-training intervals (DeLong, Clopper-Pearson).
  """
  scores, labels, ids = scored[:3]
  pooled = passive_pastel.attack_metrics(scores, labels, ids)
  out: dict[str, Any] = {k: pooled[k] for k in ('n_pos', 'n_neg', 'n_neg_distinct')}
  for k in ('attack_auc', 'attack_auc_ci_low', 'attack_auc_ci_high', 'log_auc'):
    out[f'pooled_{k}'] = pooled[k]
  for name in ATTACK[1:]:
    out[f'pooled_{name}_distinct_negatives'] = pooled[f'{name}_distinct_negatives']
  reps = split(scored)
  rep = replicated.metrics(reps, rng=rng, num_resamples=num_resamples)
  out.update({('attack_' + k if k.startswith('auc') else k): v for k, v in rep.items()})
  for name in ATTACK:
    out[f'{name}_ci_low'], out[f'{name}_ci_high'] = out[f'{name}_low'], out[f'{name}_high']
  out['replicates'] = len(reps)
  keep = [f'{n}{s}' for n in ATTACK for s in ('', '_ci_low', '_ci_high')]
  out['conditional'] = []
  for r in reps:
    m = passive_pastel.attack_metrics(r['scores'], r['labels'], r['groups'])
    out['conditional'].append({k: m[k] for k in keep})
  return out


def change(scored: tuple, reference: tuple, *, rng: np.random.Generator,
           num_resamples: int) -> dict[str, Any]:
  """The paired change against `none` over the replicates (`eval.replicated.compare`).

  `scored`, `reference`: `pooled_attack_scores` of the defended and the undefended trainings
  (the same rows of the same replicates, in the same order).

  Returns:
    `attack_auc_minus_none` (mean of the per-replicate AUC differences), `_ci_low/high` (the
    `interval_method` interval), `_replicates`, `_t_low/high`, `_verdict` ('not estimable'
    for a zero-width interval), `_t_stat` and `_p` (the per-replicate t test, NaN where it
    has none: one replicate or replicates that agree); the same for
    `tpr_at_fpr_1e-3_minus_none`; `pooled_attack_auc_minus_none` with DeLong's paired
    interval on the pooled rows (`attacks.passive.pastel.auc_change`, conditional).
  """
  c = replicated.compare(split(scored), split(reference), rng=rng,
                         num_resamples=num_resamples, fpr=CLAIM_FPR)
  out: dict[str, Any] = {}
  for short, name in (('auc', 'attack_auc'), ('tpr', CLAIM_TPR)):
    long = f'{name}_minus_none'
    out[long] = c[f'{short}_diff']
    out[f'{long}_ci_low'], out[f'{long}_ci_high'] = c[f'{short}_diff_low'], c[f'{short}_diff_high']
    for suffix in ('replicates', 't_low', 't_high', 'boot_low', 'boot_high', 't_stat', 'p'):
      out[f'{long}_{suffix}'] = c[f'{short}_diff_{suffix}']
    out[f'{long}_verdict'] = c[f'{short}_verdict']
  pooled = passive_pastel.auc_change(scored[0], scored[1], reference[0], reference[1])
  out.update({f'pooled_{k}': v for k, v in pooled.items()})
  return out


# The paired changes against `none` that `change_lines` states as one family.
CHANGES = (('attack_auc_minus_none', 'AUC'), (f'{CLAIM_TPR}_minus_none', 'TPR@0.1%'))


def change_lines(changes: list[tuple[str, dict]]) -> list[str]:
  """Markdown: every paired change against `none` with its unadjusted verdict and its Holm
  verdict over the family of all of them.

  Args:
    changes: (row label, point metrics holding `change`'s fields) of every defended point.

  Returns:
    A section stating the family (m = 2 x points: AUC and TPR at 0.1% FPR) and a table; [] for
    no points. Points recorded before the p-values were have none: Holm counts them in m
    and calls them not estimable.
  """
  if not changes:
    return []
  rows = []
  for _, m in changes:
    row = {}
    for name, q in CHANGES:
      row[f'{q}_diff'] = float(m.get(name, float('nan')))
      row[f'{q}_diff_p'] = float(m.get(f'{name}_p', float('nan')))
    rows.append(row)
  adjusted = replicated.holm_family(rows, quantities=[q for _, q in CHANGES])
  size = 2 * len(changes)
  lines = ['## Paired changes against `none` as claims', '',
           f'The {size} changes below (AUC and TPR at 0.1% FPR of every defended point) form one '
           'family. "verdict": from the interval alone, each at 95%, unadjusted (exploratory: '
           f'with no change anywhere about {0.05 * size:.1f} would read "better" or "worse" by '
           'chance; A = the defended training, B = `none`: "A better" means the attack does '
           'better against the defense). "Holm": the family adjusted '
           '(Holm 1979, two-sided p-values of the per-replicate t statistics, family-wise 95%). '
           'A zero-width interval (replicates that agree) supports no verdict: "not estimable".',
           '', '| point | ' + ' | '.join(f'{q} change [95%] | verdict ({q}) | Holm ({q})'
                                         for _, q in CHANGES) + ' |',
           '|' + '---|' * (1 + 3 * len(CHANGES))]
  for (label, m), a in zip(changes, adjusted):
    cells = [label]
    for name, q in CHANGES:
      if name not in m:
        cells += ['-', '-', '-']
        continue
      low, high = float(m[f'{name}_ci_low']), float(m[f'{name}_ci_high'])
      cells += [f'{float(m[name]):+.3f} [{low:+.3f}, {high:+.3f}]', paired.verdict(low, high),
                a[f'{q}_verdict_holm']]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return lines + ['']


def utility(arrays: list[dict]) -> dict[str, Any]:
  """Utility of one training's R replicates (`arrays`: each replicate's recording).

  `eval.utility.pooled_training_metrics` under its names (every replicate has the same test
  split, so the pooled accuracy is the mean over replicates), with `accuracy_ci_low/high` the
  t-interval over the replicates' accuracies for R >= 2 (its pooled Clopper-Pearson, which
  takes the test predictions of all replicates as independent, kept as
  `pooled_accuracy_ci_low/high`) and `accuracy_replicates`.
  """
  out = dict(utility_lib.pooled_training_metrics(arrays))
  values = [float(utility_lib.training_metrics(a)['accuracy']) for a in arrays]
  out['accuracy_replicates'] = values
  if len(values) > 1:
    out['pooled_accuracy_ci_low'] = out['accuracy_ci_low']
    out['pooled_accuracy_ci_high'] = out['accuracy_ci_high']
    _, out['accuracy_ci_low'], out['accuracy_ci_high'] = replicated.t_interval(
        values, bounds=(0.0, 1.0))
  return out
