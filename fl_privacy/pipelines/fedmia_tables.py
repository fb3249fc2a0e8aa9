"""Tables of the FedMIA pipeline: `table1.md` (attacks, sweeps) and `table2.md` (defenses)."""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np

from fl_privacy.attacks.passive import scores as scores_lib
from fl_privacy.eval import metrics as metrics_lib
from fl_privacy.eval import paired
from fl_privacy.eval import replicated
from fl_privacy.eval import stats
from fl_privacy.pipelines import fedmia_replicates
from fl_privacy.report import atomic
from fl_privacy.report import json_safe

TABLE1 = 'table1.md'
TABLE2 = 'table2.md'
CLAIMS = 'claims.json'

# Table 1 of the paper, AlexNet on CIFAR-100: (TPR % at 0.1% FPR, AUC), scored as its code does.
PAPER_ALEXNET_CIFAR100 = {
    'blackbox_loss': (0.18, 0.58), 'grad_cosine': (7.26, 0.78), 'grad_norm': (0.14, 0.51),
    'loss_series': (25.3, 0.82), 'avg_cosine': (54.66, 0.85), 'grad_diff': (20.52, 0.61),
    'fedmia_i': (53.78, 0.90), 'fedmia_ii': (66.98, 0.89),
}
_SCORING = {'public_code': 'public code', 'public_code_2024': 'public code 2024'}
ORDERING = fedmia_replicates.ORDERING


def dumps(obj: Any) -> str:
  return json.dumps(json_safe(obj), indent=1) + '\n'


def _f(v) -> float:
  return float(v)


def _is_inf(v) -> bool:
  return isinstance(v, str) and v == 'inf' or (isinstance(v, float) and math.isinf(v))


def _pct(m: dict, name: str) -> str:
  return (f'{100 * _f(m[name]):.2f} [{100 * _f(m[name + "_ci_low"]):.2f}, '
          f'{100 * _f(m[name + "_ci_high"]):.2f}]')


def _per_replicate(m: dict, name: str) -> str:
  """Each replicated training's value in %, '' for points stored without them."""
  if m is None or f'{name}_replicates' not in m:
    return ''
  return ', '.join(f'{100 * _f(v):.2f}' for v in m[f'{name}_replicates'])


def _distinct(m: dict, name: str) -> str:
  """Distinct non-member queries behind the threshold, of the distinct non-member queries."""
  if m is None or f'{name}_distinct_negatives' not in m:
    return ''
  return f'{int(m[name + "_distinct_negatives"])} / {int(m["n_neg_distinct"])}'


def _difference(p: dict, a: dict, name: str = 'tpr_at_fpr_1e-3') -> str:
  """p - a of a TPR in percentage points: over R >= 2 replicates the mean of the per-replicate
  differences with the t-interval over them (the same trainings, paired), else Newcombe's
  hybrid score 95% interval (independent samples assumed)."""
  if p is None or a is None:
    return ''
  if len(p.get(f'{name}_replicates', ())) > 1 and len(a.get(f'{name}_replicates', ())) > 1:
    d = np.asarray(p[f'{name}_replicates'], float) - np.asarray(a[f'{name}_replicates'], float)
    mean, low, high = replicated.t_interval(d, bounds=(-1.0, 1.0))
    return f'{100 * mean:+.2f} [{100 * low:+.2f}, {100 * high:+.2f}] (t, paired)'
  counts = [(int(round(_f(m[name]) * int(m['n_pos']))), int(m['n_pos'])) for m in (p, a)]
  d, low, high = stats.newcombe_difference(*counts[0], *counts[1])
  return f'{100 * d:+.2f} [{100 * low:+.2f}, {100 * high:+.2f}]'


def _auc(m: dict) -> str:
  return f'{_f(m["auc"]):.3f} [{_f(m["auc_ci_low"]):.3f}, {_f(m["auc_ci_high"]):.3f}]'


def _index(points: list[dict]) -> dict:
  out = {}
  for p in points:
    q = p['params']
    beta = math.inf if _is_inf(q['beta']) else _f(q['beta'])
    key = (q['model'], q['attack'], q['defense'], q['defense_param'], beta,
           int(q['num_clients']), int(q['local_epochs']), q['nonmember_scoring'])
    out[key] = p['metrics']
  return out


def _get(idx, config, model, attack, *, scoring='aligned', defense='none', param=None,
         beta=math.inf, k=None, e=None):
  s = config.fedmia
  k = int(s.num_clients) if k is None else k
  e = int(s.local_epochs) if e is None else e
  return idx.get((model, attack, defense, param, beta, k, e, scoring))


def _ordering_lines(idx, config, model) -> list[str]:
  lines = []
  for scoring in ('aligned', 'public_code'):
    for winner, losers in ORDERING:
      w = _get(idx, config, model, winner, scoring=scoring)
      if w is None:
        continue
      for loser in losers:
        l = _get(idx, config, model, loser, scoring=scoring)
        if l is None:
          continue
        a, b = _f(w['tpr_at_fpr_1e-3']), _f(l['tpr_at_fpr_1e-3'])
        separated = _f(w['tpr_at_fpr_1e-3_ci_low']) > _f(l['tpr_at_fpr_1e-3_ci_high'])
        reversed_ = _f(l['tpr_at_fpr_1e-3_ci_low']) > _f(w['tpr_at_fpr_1e-3_ci_high'])
        # A zero-width or undefined interval (replicates that agree) shows no spread.
        degenerate = any(paired.verdict(_f(m['tpr_at_fpr_1e-3_ci_low']),
                                        _f(m['tpr_at_fpr_1e-3_ci_high'])) == paired.NOT_ESTIMABLE
                         for m in (w, l))
        # Point estimates decide nothing: only disjoint intervals give a verdict either way.
        verdict = (paired.NOT_ESTIMABLE if degenerate else
                   'holds (intervals disjoint)' if separated else
                   'does not hold (intervals disjoint, reversed)' if reversed_ else
                   f'not shown (intervals overlap; {"higher" if a > b else "not higher"} '
                   'as a point estimate)')
        lines.append(f'- {scoring}: {scores_lib.label(winner)} {100 * a:.2f}% vs '
                     f'{scores_lib.label(loser)} {100 * b:.2f}% at 0.1% FPR: {verdict}')
  return lines


def attack_options(config) -> dict:
  """RMIA's threshold and offline parameter from the config (`scores.pooled_round_scores`)."""
  return dict(rmia_gamma=float(config.fedmia.rmia_gamma), rmia_a=float(config.fedmia.rmia_a))


def _rmia_ties(m: dict | None) -> str:
  """RMIA's population size and the ties at its top score (aligned), '' when not scored."""
  if m is None or 'rmia_population' not in m:
    return ''
  return (f'RMIA (aligned): population n_z = {int(m["rmia_population"])} rows that no client '
          'holds (owner -1: the test split and the train rows outside every shard; each score '
          'a fraction of them, averaged over rounds); entries sharing the top score: '
          f'{int(m["top_tied"])}, of them non-members: {int(m["top_tied_negatives"])} (ties are '
          'one threshold of the ROC, so a rate never rests on a tie broken for the members; '
          f'with more than {0.001 * int(m["n_neg"]):.1f} tied non-members TPR@0.1% FPR is 0).')


def table1(config, points: list[dict], claims_: dict | None = None) -> str:
  """Markdown: Table 1 (main setting, both scorings, the paper's numbers) and the sweeps."""
  s = config.fedmia
  idx = _index(points)
  lines = [f'# FedMIA on {config.dataset}', '',
           f'K = {s.num_clients} clients, T = {s.num_rounds} rounds recorded every '
           f'{s.record_every}, E = {s.local_epochs}, B = {s.batch_size}, {s.optimizer} lr '
           f'{s.learning_rate} ({s.lr_schedule}), weight decay {s.weight_decay}. Each client is '
           'the target in turn; members = its data, non-members = the test split and the other '
           "clients' data, pooled. Every rate and AUC is the mean over the "
           f'{s.replicates} replicated trainings (independent partitions, initialisations '
           'and client keys) with a 95% interval over them (Student\'s t over the '
           'per-replicate values for 2 or more replicates, `eval.replicated`; for a TPR at low FPR '
           'the union of that and Clopper-Pearson on the members above the pooled threshold); '
           '"per replicate": the value of each training; "distinct negatives": distinct '
           'non-member queries among the false positives at the threshold, summed over the '
           'replicates, of all distinct non-member queries; "minus aligned": the mean of the '
           'per-replicate differences of TPR@0.1% FPR in percentage points with the t-interval '
           'over them. Single-round attacks at round '
           f'{s.single_round}; "best round" picks the round on the evaluation data (optimistic). '
           f'FedMIA without a suffix uses the {s.outlier_filter.replace("_", "-")} filter.', '']
  for model in s.models:
    first = next((m for (mo, a, d, p, b, k, e, sc), m in idx.items() if mo == model and
                  d == 'none' and math.isinf(b) and k == s.num_clients and
                  e == s.local_epochs), None)
    if first is None:
      continue
    others = [sc for sc in ('public_code', 'public_code_2024') if sc in s.nonmember_scoring]
    head = ''.join(f'TPR@0.1% FPR ({_SCORING[sc]}) | AUC ({_SCORING[sc]}) | {_SCORING[sc]} '
                   'minus aligned, TPR@0.1% (points) | ' for sc in others)
    lines += [f'## Table 1: {model}, IID, no defense', '',
              f'{int(first["n_pos"])} members, {int(first["n_neg"])} non-members (pooled over '
              f'targets; {first.get("n_neg_distinct", "?")} distinct non-member queries); test '
              f'accuracy {_pct(first, "test_accuracy")}, accuracy on the clients\' rows '
              f'{_pct(first, "train_accuracy") if "train_accuracy_ci_low" in first else "n/a"}'
              f' (generalisation gap {100 * _f(first.get("generalisation_gap", math.nan)):.1f} '
              'points); the uploads\' median own-rows loss is below their median test-rows '
              f'loss by {_f(first.get("upload_loss_gap", math.nan)):.3f} nats (last recorded '
              'round, mean over clients).', '',
              '| Attack | TPR@0.1% FPR (aligned) | per replicate | distinct negatives at '
              '0.1% FPR | TPR@1% FPR (aligned) | AUC (aligned) | ' + head +
              'per-target TPR@0.1% (aligned, min-max) | paper: AlexNet CIFAR-100 TPR@0.1% / '
              'AUC |',
              '|' + '---|' * (8 + 3 * len(others))]
    for attack in s.attacks:
      a = _get(idx, config, model, attack)
      ps = [_get(idx, config, model, attack, scoring=sc) for sc in others]
      if a is None and all(p is None for p in ps):
        continue
      base, filt = scores_lib.parse(attack, s.outlier_filter)
      paper = PAPER_ALEXNET_CIFAR100.get(base) if filt in (None, 'paper') else None
      paper_cell = f'{paper[0]:.2f} / {paper[1]:.2f}' if paper else ''
      rng = (f'{100 * _f(a["tpr_at_fpr_1e-3_target_min"]):.1f}-'
             f'{100 * _f(a["tpr_at_fpr_1e-3_target_max"]):.1f}'
             if a is not None and 'tpr_at_fpr_1e-3_target_min' in a else '')
      cells = ''.join(f'{_pct(p, "tpr_at_fpr_1e-3") if p else ""} | {_auc(p) if p else ""} | '
                      f'{_difference(p, a)} | ' for p in ps)
      lines.append(
          f'| {scores_lib.label(attack, s.outlier_filter)} | '
          f'{_pct(a, "tpr_at_fpr_1e-3") if a else ""} | {_per_replicate(a, "tpr_at_fpr_1e-3")} | '
          f'{_distinct(a, "tpr_at_fpr_1e-3")} | '
          f'{_pct(a, "tpr_at_fpr_1e-2") if a else ""} | {_auc(a) if a else ""} | {cells}'
          f'{rng} | {paper_cell} |')
    fm = [_get(idx, config, model, f'fedmia_ii@{f}') or
          (_get(idx, config, model, 'fedmia_ii') if f == s.outlier_filter else None)
          for f in ('paper', 'leave_one_out')]
    lines += ['', 'Outlier filter: fraction of shadow values removed '
              '(FedMIA-II, aligned): ' + ', '.join(
                  f'{f} {_f(m["filter_removed_fraction"]):.4f} (owner of a non-member query '
                  f'removed: {_f(m["filter_owner_removed_fraction"]):.3f})'
                  for f, m in zip(('paper', 'leave-one-out'), fm) if m is not None), '']
    ties = _rmia_ties(_get(idx, config, model, 'rmia'))
    lines += [ties, ''] if ties else []
    lines += ["### The paper's ordering at 0.1% FPR (separate intervals)", '']
    lines += _ordering_lines(idx, config, model) + ['']
    lines += fedmia_replicates.claim_lines(config, (claims_ or {}).get(model, []))
    lines += _sweep_tables(config, idx, model)
  return '\n'.join(lines) + '\n'


def _sweep_tables(config, idx, model) -> list[str]:
  s = config.fedmia
  attacks = list(s.sweep_attacks)
  head = ('| setting | test acc. | ' + ' | '.join(scores_lib.label(a, s.outlier_filter)
                                                   for a in attacks) + ' |')
  sep = '|' + '---|' * (len(attacks) + 2)
  out = []
  sweeps = (
      ('Non-IID (Fig. 4): Dirichlet beta', [dict(beta=b) for b in
                                             sorted(set(float(b) for b in s.betas),
                                                    reverse=True)]),
      ('Clients (Fig. 5b): K', [dict(k=k) for k in sorted({int(s.num_clients),
                                                           *map(int, s.client_counts)})]),
      ('Local epochs (Fig. 5d): E', [dict(e=e) for e in sorted({int(s.local_epochs),
                                                                *map(int, s.epoch_counts)})]),
  )
  for title, settings in sweeps:
    if len(settings) < 2:
      continue
    out += [f'### {title}, TPR@0.1% FPR (aligned) [95% CI]', '', head, sep]
    for st in settings:
      row = [_get(idx, config, model, a, **st) for a in attacks]
      if all(r is None for r in row):
        continue
      acc = next((r for r in row if r is not None), None)
      name = ', '.join(f'{k}={v}' for k, v in st.items())
      out.append(f'| {name} | {100 * _f(acc["test_accuracy"]):.1f} | ' +
                 ' | '.join(_pct(r, 'tpr_at_fpr_1e-3') if r else '' for r in row) + ' |')
    out.append('')
  return out


def table2(config, points: list[dict]) -> str:
  """Markdown: hypervolume of each defense's (test error, TPR@0.1% FPR) front (Fig. 6)."""
  s = config.fedmia
  idx = _index(points)
  lines = [f'# FedMIA defenses on {config.dataset}', '',
           'Hypervolume (Eq. 13, reference (1, 1), both objectives minimised) of each '
           "defense's front of (test error, TPR@0.1% FPR) over its strengths plus the "
           'undefended run, per attack, aligned scoring. Larger = better privacy-utility '
           'trade-off for the defender.', '']
  attacks = list(s.sweep_attacks)
  for model in s.models:
    lines += [f'## {model}', '',
              '| defense | ' + ' | '.join(scores_lib.label(a, s.outlier_filter)
                                         for a in attacks) + ' |',
              '|' + '---|' * (len(attacks) + 1)]
    none_row = [_get(idx, config, model, a) for a in attacks]
    lines.append('| none (undefended point alone) | ' + ' | '.join(
        f'{metrics_lib.hypervolume([[_f(m["test_error"]), _f(m["tpr_at_fpr_1e-3"])]], (1, 1)):.4f}'
        if m else '' for m in none_row) + ' |')
    details = ['', '| defense | strength | test acc. [95% CI] | DP epsilon (client-level, '
               'replace-one, vs the server) | ' +
               ' | '.join(f'TPR@0.1% {scores_lib.label(a, s.outlier_filter)}'
                          for a in attacks) + ' |', '|' + '---|' * (len(attacks) + 4)]
    for name in s.defenses.keys():
      values = [float(v) for v in s.defenses[name]]
      cells = []
      for a, base in zip(attacks, none_row):
        pts = [] if base is None else [[_f(base['test_error']), _f(base['tpr_at_fpr_1e-3'])]]
        for v in values:
          m = _get(idx, config, model, a, defense=name, param=v)
          if m is not None:
            pts.append([_f(m['test_error']), _f(m['tpr_at_fpr_1e-3'])])
        cells.append(f'{metrics_lib.hypervolume(pts, (1, 1)):.4f}' if len(pts) > 1 else '')
      lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
      for v in values:
        row = [_get(idx, config, model, a, defense=name, param=v) for a in attacks]
        ref = next((r for r in row if r is not None), None)
        if ref is None:
          continue
        eps = _f(ref['dp_epsilon'])
        details.append(f'| {name} | {v:g} | {_pct(ref, "test_accuracy")} | '
                       f'{"inf" if math.isinf(eps) else f"{eps:.3g}"} | ' +
                       ' | '.join(_pct(r, 'tpr_at_fpr_1e-3') if r else '' for r in row) + ' |')
    lines += details + ['']
    lines += _paired_defense_lines(config, idx, model, attacks, none_row)
  return '\n'.join(lines) + '\n'


def _minus(m: dict | None, base: dict | None, name: str = 'auc') -> str:
  """m - base of `name` over the same replicates: the mean of the per-replicate differences
  with the t-interval over them ('' without two paired replicates)."""
  if m is None or base is None:
    return ''
  a, b = m.get(f'{name}_replicates', ()), base.get(f'{name}_replicates', ())
  if len(a) < 2 or len(a) != len(b):
    return ''
  mean, low, high = replicated.t_interval(np.asarray(a, float) - np.asarray(b, float),
                                          bounds=(-1.0, 1.0))
  return f'{mean:+.3f} [{low:+.3f}, {high:+.3f}]'


def _paired_defense_lines(config, idx, model, attacks, none_row) -> list[str]:
  """Each defense's AUC change against the undefended run, paired over the replicates (a
  defense and the undefended run of one replicate share data, keys and w_0)."""
  s = config.fedmia
  rows = []
  for name in s.defenses.keys():
    for v in (float(x) for x in s.defenses[name]):
      cells = [_minus(_get(idx, config, model, a, defense=name, param=v), base)
               for a, base in zip(attacks, none_row)]
      if any(cells):
        rows.append(f'| {name} | {v:g} | ' + ' | '.join(cells) + ' |')
  if not rows:
    return []
  return ['### AUC minus the undefended run (paired over the replicates, t 95%)', '',
          '| defense | strength | ' + ' | '.join(scores_lib.label(a, s.outlier_filter)
                                               for a in attacks) + ' |',
          '|' + '---|' * (len(attacks) + 2)] + rows + ['']


def write(config, points: list[dict], workdir: str, records: dict | None = None,
          key=None, scored=None) -> None:
  """table1.md and table2.md; given the main recordings and the run key, also the paired
  claims (`claims`, with the entries point scoring kept in `scored`) in table1.md and
  claims.json."""
  found = fedmia_replicates.claims(config, key, records, scored) if records else {}
  if found:
    atomic.atomic_write_text(os.path.join(workdir, CLAIMS), dumps(found))
  atomic.atomic_write_text(os.path.join(workdir, TABLE1), table1(config, points, found))
  atomic.atomic_write_text(os.path.join(workdir, TABLE2), table2(config, points))
