"""Table and figures of the PASTEL pipeline (`fl_privacy.pipelines.pastel`).

- `table.md`: defense x strength: test accuracy, attack AUC on the local and global targets.
- `pastel_privacy_utility.png` (PASTEL Fig. 4b, d): white-box AUC against test accuracy.
- `pastel_auc.png` (Fig. 4a, c): every attack's AUC per training, local and global.
- `pastel_loss_hist.png` (Fig. 3): member vs non-member losses of the global model, none vs
  PASTEL.
"""

from __future__ import annotations

import math

import numpy as np

from fl_privacy.pipelines import pastel_replicates
from fl_privacy.report import figures
from fl_privacy.report import summary

_COLOURS = {'none': 'tab:gray', 'pastel': 'tab:green', 'wdp': 'tab:orange', 'ldp': 'tab:blue',
            'cdp': 'tab:purple'}
_MARKERS = {'none': 'o', 'pastel': '*', 'wdp': 's', 'ldp': '^', 'cdp': 'D'}
_CHANCE = 'chance (AUC 0.5)'
_ATTACK_LABELS = {'nasr_whitebox': 'Nasr white-box', 'loss_threshold': 'loss threshold',
                  'fedmia_i': 'FedMIA-I', 'fedmia_ii': 'FedMIA-II'}


def _training(p: dict) -> tuple:
  return (p['defense'], float(p['strength']), p['optimizer'], p.get('representation', '-'))


def _name(tr: tuple) -> str:
  d, s, o, r = tr
  if d == 'none':
    return f'none ({o})'
  sym = 'lambda' if d == 'pastel' else 'eps'
  reading = f', {r}' if d == 'pastel' else ''
  return f'{d} {sym}={s:g} ({o}{reading})'


def _by_training(points: list[dict]) -> dict[tuple, dict]:
  """{training: {(attack, target): metrics}} in first-seen order."""
  out: dict[tuple, dict] = {}
  for pt in points:
    p = pt['params']
    out.setdefault(_training(p), {})[(p['attack'], p['target'])] = {
        k: summary.as_number(v) for k, v in pt['metrics'].items()
        if not isinstance(v, (list, dict))}
  return out


def _cell(m: dict | None, name: str, scale: float = 1.0, digits: int = 3) -> str:
  if m is None or name not in m or math.isnan(m[name]):
    return '-'
  return (f'{scale * m[name]:.{digits}f} [{scale * m[name + "_ci_low"]:.{digits}f}, '
          f'{scale * m[name + "_ci_high"]:.{digits}f}]')


def table_markdown(config, points: list[dict]) -> str:
  """Defense x strength: accuracy, AUCs (local, global) of every attack, epsilon, JSD."""
  s = config.pastel
  by = _by_training(points)
  attacks = [a for a in s.attacks]
  lines = [f'# PASTEL and DP baselines on {config.dataset}', '',
           f'K = {s.num_clients} clients, T = {s.num_rounds} rounds, E = {s.local_epochs}, '
           f'B = {s.batch_size}, {s.optimizer} lr {s.learning_rate}; PASTEL '
           f'{"/".join(s.pastel_representations)} at layers {list(s.pastel_layers) or "every Dense"}, '
           f'tau {s.pastel_temperature}; delta {s.dp_delta}, clip {s.clip_norm} (ldp), '
           f'update clip {s.update_clip_norm} (cdp, wdp). Attacks score the evaluation half '
           f'of each of {s.get("replicates", 1)} replicated training(s) (n_pos = n_neg per cell, '
           'all replicates, below the table). Attack AUC: the mean over the replicates [95% '
           f'{_method(points)}]. Accuracy of the global model on the test split: the mean '
           "over the replicates [95% Student's t over them; Clopper-Pearson for one].", '']
  header = ['Defense', 'Strength', 'Opt.', 'Test acc. %', 'Local acc. %', 'Gap']
  cols = []
  for a in attacks:
    for t in s.targets:
      if a.startswith('fedmia') and t != 'local':
        continue
      cols.append((a, t))
      header.append(f'{_ATTACK_LABELS.get(a, a)} AUC {t}')
  header += ['eps (total; unit, against)', 'eps / round', 'JSD (nats)']
  lines.append('| ' + ' | '.join(header) + ' |')
  lines.append('|' + '---|' * len(header))
  counts = {}
  for tr, cells in by.items():
    any_m = next(iter(cells.values()))
    row = [tr[0], f'lambda {tr[1]:g} ({tr[3]})' if tr[0] == 'pastel' else
           ('-' if tr[0] == 'none' else f'eps {tr[1]:g}'), tr[2],
           _cell(any_m, 'accuracy', 100, 1), f'{100 * any_m["local_accuracy_mean"]:.1f}',
           f'{100 * any_m["generalization_gap"]:.1f}']
    for a, t in cols:
      row.append(_cell(cells.get((a, t)), 'attack_auc'))
      if (a, t) in cells:
        counts[t] = (int(cells[(a, t)]['n_pos']), int(cells[(a, t)]['n_neg']))
    # Rows attacking uploads under aggregate-only DP carry no epsilon: take a row that does.
    with_eps = [m for m in cells.values() if not math.isnan(m.get('dp_epsilon', math.nan))]
    ref = with_eps[0] if with_eps else any_m
    eps, per = ref.get('dp_epsilon', math.nan), ref.get('dp_epsilon_per_round', math.nan)
    claim = '-' if math.isnan(eps) else f'{eps:.3g}'
    if 'dp_unit' in ref:
      claim += f' ({ref["dp_unit"]}, {ref["dp_adversary"]}' + (
          '; none vs the server' if ref['dp_adversary'] == 'aggregate' else '') + ')'
    row += [claim, '-' if math.isnan(per) else f'{per:.3g}', f'{any_m["jsd_last_round"]:.4f}']
    lines.append('| ' + ' | '.join(row) + ' |')
  lines.append('')
  for t, (npos, nneg) in counts.items():
    lines.append(f'- {t} target: {npos} members vs {nneg} non-members scored per cell.')
  lines += ['', '## AUC change against `none` (same optimizer, same rows of the same '
            f'replicates: mean of the per-replicate changes [95% {_method(points)}])', '',
            '| ' + ' | '.join(header[:3] + header[6:6 + len(cols)]) + ' |',
            '|' + '---|' * (3 + len(cols))]
  for tr, cells in by.items():
    if tr[0] == 'none':
      continue
    row = [tr[0], f'lambda {tr[1]:g} ({tr[3]})' if tr[0] == 'pastel' else f'eps {tr[1]:g}',
           tr[2]]
    row += [_signed(cells.get(c), 'attack_auc_minus_none') for c in cols]
    lines.append('| ' + ' | '.join(row) + ' |')
  lines.append('')
  # Every change is a claim: stated as one family with Holm beside the unadjusted verdicts.
  lines += pastel_replicates.change_lines(
      [(f'{_name(tr)}, {_ATTACK_LABELS.get(c[0], c[0])} {c[1]}', cells[c])
       for tr, cells in by.items() if tr[0] != 'none' for c in cols
       if c in cells and 'attack_auc_minus_none' in cells[c]])
  return '\n'.join(lines)


def _method(points: list[dict]) -> str:
  """The interval the points report (`eval.replicated.interval_method`), in words."""
  found = {str(pt['metrics'].get('interval_method')) for pt in points} - {'None'}
  return '; '.join(pastel_replicates.METHODS.get(m, m) for m in sorted(found)) or 'interval'


def _signed(m: dict | None, name: str) -> str:
  if m is None or name not in m or math.isnan(m[name]):
    return '-'
  return f'{m[name]:+.3f} [{m[name + "_ci_low"]:+.3f}, {m[name + "_ci_high"]:+.3f}]'


def privacy_utility_figure(config, points: list[dict], attack: str = 'nasr_whitebox'):
  """AUC of `attack` against test accuracy per training; one panel per target (Fig. 4b, d)."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  targets = list(config.pastel.targets)
  # One AUC scale for both targets: equal gaps read as equal between the panels.
  fig, axes = plt.subplots(1, len(targets), figsize=(5.2 * len(targets), 4.2), squeeze=False,
                           sharey=True)
  by = _by_training(points)
  for ax, target in zip(axes[0], targets):
    # One errorbar series per defense (and optimizer): each appears once in the legend.
    series: dict[str, dict] = {}
    for tr, cells in by.items():
      m = cells.get((attack, target))
      if m is None:
        continue
      d = tr[0]
      ablation = tr[2] != config.pastel.optimizer
      name = f'{d} {tr[3]}' if d == 'pastel' else d
      label = f'{name} ({tr[2]})' if ablation else name
      x, y = 100 * m['accuracy'], m['attack_auc']
      s = series.setdefault(label, dict(d=d, ablation=ablation, x=[], y=[], xerr=[[], []],
                                         yerr=[[], []]))
      s['x'].append(x)
      s['y'].append(y)
      s['xerr'][0].append(x - 100 * m['accuracy_ci_low'])
      s['xerr'][1].append(100 * m['accuracy_ci_high'] - x)
      s['yerr'][0].append(y - m['attack_auc_ci_low'])
      s['yerr'][1].append(m['attack_auc_ci_high'] - y)
      if d != 'none':
        ax.annotate(f'{tr[1]:g}', (x, y), textcoords='offset points', xytext=(4, 4), fontsize=7,
                    color=_COLOURS.get(d, 'k'))
    for label, s in series.items():
      d = s['d']
      ax.errorbar(s['x'], s['y'], xerr=s['xerr'], yerr=s['yerr'], fmt=_MARKERS.get(d, 'o'),
                  color=_COLOURS.get(d, 'k'), ms=8 if d == 'pastel' else 6,
                  mfc='white' if s['ablation'] else _COLOURS.get(d, 'k'), capsize=2, lw=0.8,
                  label=label)
    ax.axhline(0.5, color='k', ls='--', lw=0.8, label=_CHANCE)
    ax.set_xlabel('global model test accuracy (%)')
    ax.set_ylabel(f'{_ATTACK_LABELS.get(attack, attack)} attack AUC (mean over replicates, 95% CI)')
    ax.set_title(f'{target} target')
  handles, labels = axes[0][0].get_legend_handles_labels()
  for ax in axes[0][1:]:
    h, l = ax.get_legend_handles_labels()
    for hh, ll in zip(h, l):
      if ll not in labels:
        handles.append(hh)
        labels.append(ll)
  fig.legend(handles, labels, loc='center left', bbox_to_anchor=(1.0, 0.5), fontsize=8,
             title='defense (numbers: lambda or eps)')
  fig.tight_layout()
  for ax in axes[0]:
    figures.spread_annotations(ax)  # the strong-utility trainings crowd near 100%
  return fig


def auc_figure(config, points: list[dict]):
  """Every attack's AUC per training with its interval over the replicates; one panel per
  target (Fig. 4a, c)."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  targets = list(config.pastel.targets)
  by = _by_training(points)
  names = [_name(tr) for tr in by]
  attacks = list(config.pastel.attacks)
  fig, axes = plt.subplots(len(targets), 1, figsize=(max(7, 0.55 * len(names) + 2),
                                                     3.6 * len(targets)), squeeze=False,
                           sharey=True)  # one AUC scale for both targets
  width = 0.8 / max(1, len(attacks))
  for ax, target in zip(axes[:, 0], targets):
    for j, attack in enumerate(attacks):
      xs, ys, lo, hi = [], [], [], []
      for i, cells in enumerate(by.values()):
        m = cells.get((attack, target))
        if m is None:
          continue
        xs.append(i - 0.4 + width * (j + 0.5))
        ys.append(m['attack_auc'])
        lo.append(m['attack_auc'] - m['attack_auc_ci_low'])
        hi.append(m['attack_auc_ci_high'] - m['attack_auc'])
      if xs:
        ax.bar(xs, np.asarray(ys) - 0.5, width, bottom=0.5, yerr=[lo, hi], capsize=2,
               label=_ATTACK_LABELS.get(attack, attack))
    ax.axhline(0.5, color='k', ls='--', lw=0.8, label=_CHANCE)
    ax.set_ylabel('attack AUC (mean over replicates, 95% CI)')
    ax.set_title(f'{target} target')
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=35, ha='right', fontsize=8)
    ax.set_xlabel('defense and strength (client optimizer)')
  handles, labels = axes[0, 0].get_legend_handles_labels()
  fig.legend(handles, labels, loc='center left', bbox_to_anchor=(1.0, 0.5), fontsize=8,
             title='attack')
  fig.tight_layout()
  return fig


def loss_hist_figure(config, losses: dict):
  """Member vs non-member loss of the global model at the last round, none vs PASTEL (Fig. 3)."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  main = config.pastel.optimizer
  chosen = [(n, v) for n, v in losses.items() if v['params']['optimizer'] == main and
            v['params']['defense'] in ('none', 'pastel')]
  # none first, then PASTEL at lambda 1 if trained, else the largest lambda.
  none = [c for c in chosen if c[1]['params']['defense'] == 'none']
  past = sorted([c for c in chosen if c[1]['params']['defense'] == 'pastel'],
                key=lambda c: (c[1]['params']['strength'] != 1.0, -c[1]['params']['strength']))
  panels = none[:1] + past[:1]
  fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5 * max(1, len(panels)), 3.8),
                           squeeze=False, sharey=True)
  floor = 1e-6
  everything = np.concatenate([np.r_[v['member'], v['nonmember']] for _, v in panels] or
                              [np.ones(1)])
  bins = np.linspace(np.log10(max(floor, float(everything.min()))),
                     np.log10(max(floor * 10, float(everything.max()))), 40)
  for ax, (name, v) in zip(axes[0], panels):
    for key, colour, label in (('member', 'tab:blue', 'members'),
                               ('nonmember', 'tab:red', 'non-members')):
      vals = np.log10(np.maximum(np.asarray(v[key], np.float64), floor))
      ax.hist(vals, bins=bins, density=True, alpha=0.5, color=colour, label=label)
    ax.set_xlabel(f'log10 cross-entropy loss (nats; below {floor:g} drawn at {floor:g})')
    ax.set_title(_name(_training(v['params'])))
    ax.set_ylabel('density (1 / unit of log10 loss)')
  handles, labels = axes[0][0].get_legend_handles_labels()
  fig.legend(handles, labels, loc='center left', bbox_to_anchor=(1.0, 0.5), fontsize=8)
  fig.tight_layout()
  return fig


def save_figures(config, points: list[dict], losses: dict, workdir: str) -> None:
  """Writes the three figures (those with data) into `workdir`."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  if not points:
    return
  made = []
  if 'nasr_whitebox' in config.pastel.attacks:
    made.append((privacy_utility_figure(config, points), 'pastel_privacy_utility'))
  else:
    made.append((privacy_utility_figure(config, points, config.pastel.attacks[0]),
                 'pastel_privacy_utility'))
  made.append((auc_figure(config, points), 'pastel_auc'))
  if losses:
    made.append((loss_hist_figure(config, losses), 'pastel_loss_hist'))
  for fig, name in made:
    figures.save(fig, workdir, name)
    plt.close(fig)
