"""Figures of the FedMIA pipeline (`fl_privacy.pipelines.fedmia`).

- `fedmia_roc.png`: ROC curves of the main setting on log-log axes, aligned (solid) and
  public-code (dashed) scoring.
- `fedmia_noniid.png`: TPR@0.1% FPR against Dirichlet beta (the paper's Fig. 4).
- `fedmia_rounds.png`: TPR@0.1% FPR against the number of rounds (Fig. 5a).
- `fedmia_clients_epochs.png`: TPR@0.1% FPR against K and against E (Fig. 5b, d).
- `fedmia_defenses.png`: test error against TPR@0.1% FPR for each defense (Fig. 6).
Error bars are the points' 95% intervals over the replicated trainings (`_ci_low/_ci_high`:
`fedmia_replicates.combine`); the ROC and the rounds curves are replicate 0's training.
"""

from __future__ import annotations

import math

import numpy as np

from fl_privacy import data as data_lib
from fl_privacy.attacks.passive import evaluate as evaluate_lib
from fl_privacy.attacks.passive import scores as scores_lib
from fl_privacy.eval import metrics as metrics_lib
from fl_privacy.pipelines import fedmia_tables
from fl_privacy.report import figures
from fl_privacy.report import point_key

# FedMIA without a suffix is the paper's filter; ours (leave-one-out) beside it.
CURVE_ATTACKS = ('blackbox_loss', 'grad_cosine', 'loss_series', 'avg_cosine', 'fedmia_i',
                 'fedmia_ii', 'fedmia_i@leave_one_out', 'fedmia_ii@leave_one_out')
MULTI = ('loss_series', 'avg_cosine', 'fedmia_i', 'fedmia_ii', 'fedmia_i@leave_one_out',
         'fedmia_ii@leave_one_out')
_COLOURS = {'blackbox_loss': 'tab:gray', 'grad_cosine': 'tab:olive', 'grad_diff': 'tab:brown',
            'grad_norm': 'tab:pink', 'loss_series': 'tab:blue', 'avg_cosine': 'tab:green',
            'fedmia_i': 'tab:purple', 'fedmia_ii': 'tab:red', 'lira_offline': 'tab:orange',
            'lira_offline_fixed': 'tab:cyan', 'lira_online': 'sienna',
            'lira_online_fixed': 'magenta', 'rmia': 'darkgoldenrod',
            'fedmia_i@leave_one_out': 'indigo', 'fedmia_ii@leave_one_out': 'darkred'}


# RMIA's threshold and offline parameter from the config: one definition for the tables too.
attack_options = fedmia_tables.attack_options


def _colour(attack: str) -> str:
  if attack in _COLOURS:
    return _COLOURS[attack]
  return _COLOURS.get(scores_lib.parse(attack)[0].replace('_best_round', ''), 'k')


def round_curves(config, key, records: dict, scored=None) -> dict:
  """{model: {scoring: {attack: curve}}} of `evaluate.rounds_curve` on the main recordings
  (replicate 0's), aligned from the scores `scored` kept where it has them."""
  s = config.fedmia
  out = {}
  for model, rec in records.items():
    out[model] = {}
    for scoring in s.nonmember_scoring:
      attacks = CURVE_ATTACKS if scoring == 'aligned' else MULTI
      out[model][scoring] = {}
      for a in attacks:
        rng = data_lib.rng_from_key(point_key(key, {'curve': a, 'model': model,
                                                   'scoring': scoring}))
        out[model][scoring][a] = evaluate_lib.rounds_curve(
            rec, rec['owner'], a, scoring=scoring, default_filter=s.outlier_filter, rng=rng,
            scored=scored and scored.aligned(model, a, scoring), **attack_options(config))
  return out


def _plt():
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def _legend_outside(ax, **kw):
  ax.legend(loc='upper left', bbox_to_anchor=(1.02, 1.0), fontsize=7, borderaxespad=0, **kw)


def roc_figure(config, key, records: dict, scored=None):
  """Log-log ROC of every main-setting attack (Table 1's attacks), aligned from the scores
  `scored` kept where it has them."""
  plt = _plt()
  s = config.fedmia
  models = list(records)
  fig, axes = plt.subplots(1, max(1, len(models)), figsize=(6.5 * max(1, len(models)), 4.6),
                           squeeze=False)
  recorded = None
  for ax, model in zip(axes[0], models):
    rec = records[model]
    recorded = list(np.asarray(rec['rounds']) + 1)
    single = recorded.index(int(s.single_round))
    floor = None
    for attack in (a for a in s.attacks if '@' not in a and not a.endswith('_best_round')):
      for scoring, style in (('aligned', '-'), ('public_code', '--')):
        if scoring not in s.nonmember_scoring:
          continue
        base, _ = scores_lib.parse(attack)
        if scoring == 'public_code' and (base not in scores_lib.MULTI_ROUND or
                                         not scores_lib.supports(attack, scoring)):
          continue  # one round: the public code's redraw only reorders non-members; RMIA
        rng = data_lib.rng_from_key(point_key(key, {'roc': attack, 'model': model,
                                                   'scoring': scoring}))
        kept = scored and scored.aligned(model, attack, scoring)
        if kept is None:
          pooled = scores_lib.pooled_round_scores(rec, rec['owner'], attack, scoring=scoring,
                                                  default_filter=s.outlier_filter, rng=rng,
                                                  **attack_options(config))
          kept = dict(round_scores=pooled['scores'], labels=pooled['labels'])
        final = scores_lib.combine_rounds(kept['round_scores'], attack, single_index=single)
        fpr, tpr, _ = metrics_lib.roc_curve(final, kept['labels'])
        floor = 1.0 / max(1, int((kept['labels'] == 0).sum()))
        ax.plot(np.maximum(fpr, floor), np.maximum(tpr, floor), style, color=_colour(attack),
                lw=1.2, label=f'{scores_lib.label(attack, s.outlier_filter)}'
                f'{" (public code)" if scoring == "public_code" else ""}')
    if floor is not None:
      grid = np.logspace(math.log10(floor), 0, 50)
      ax.plot(grid, grid, ':', color='k', lw=0.8, label='chance')
      ax.set_xlim(floor, 1)
      ax.set_ylim(floor, 1)
    ax.set_xscale('log')
    ax.set_yscale('log')
    # Log axes cannot show 0: rates below 1 / (non-members) are drawn at that floor.
    shown = f'; 0 on either axis drawn at {floor:.2g}' if floor is not None else ''
    ax.set_xlabel(f'false positive rate (non-members flagged, fraction{shown})')
    ax.set_ylabel('true positive rate (members flagged, fraction)')
    ax.set_title(f'{model}: ROC, round {s.single_round} for single-round attacks, '
                 f'{len(recorded)} rounds averaged', fontsize=8)
    _legend_outside(ax)
  return fig


def _chance(ax):
  # A random guess flags members at the rate it flags non-members: 0.1%.
  ax.axhline(0.1, color='k', ls=':', lw=0.8, label='chance (0.1%)')


def _errorbar(ax, x, ms, attack, label, **kw):
  y = np.array([100 * float(m['tpr_at_fpr_1e-3']) for m in ms])
  lo = np.array([100 * float(m['tpr_at_fpr_1e-3_ci_low']) for m in ms])
  hi = np.array([100 * float(m['tpr_at_fpr_1e-3_ci_high']) for m in ms])
  ax.errorbar(x, y, yerr=[y - lo, hi - y], marker='o', ms=3, capsize=2, lw=1,
              color=_colour(attack), label=label, **kw)


def noniid_figure(config, points):
  plt = _plt()
  s = config.fedmia
  idx = fedmia_tables._index(points)  # pylint: disable=protected-access
  # One y scale for every model: equal gaps read as equal between panels.
  fig, axes = plt.subplots(1, len(s.models), figsize=(6.5 * len(s.models), 4), squeeze=False,
                           sharey=True)
  betas = sorted({float(b) for b in s.betas}, reverse=True)
  for ax, model in zip(axes[0], s.models):
    pos = np.arange(len(betas))
    for i, a in enumerate(s.sweep_attacks):
      ms = [fedmia_tables._get(idx, config, model, a, beta=b) for b in betas]  # pylint: disable=protected-access
      keep = [j for j, m in enumerate(ms) if m is not None]
      if keep:
        _errorbar(ax, pos[keep] + 0.08 * (i - len(s.sweep_attacks) / 2),
                  [ms[j] for j in keep], a, scores_lib.label(a, s.outlier_filter), ls='none')
    _chance(ax)
    ax.set_xticks(pos)
    ax.set_xticklabels(['IID (inf)' if math.isinf(b) else f'{b:g}' for b in betas])
    ax.set_xlabel('Dirichlet concentration beta (smaller = more label skew)')
    ax.set_ylabel('TPR at 0.1% FPR (%, 95% CI)')
    ax.set_title(f'{model}: non-IID data (Fig. 4), aligned scoring', fontsize=9)
    _legend_outside(ax)
  figures.rate_limits(axes[0][0], scale=100)  # shared: sets every panel
  return fig


def rounds_figure(config, curves: dict):
  """TPR@0.1% FPR after each recorded round: one panel per (model, attack), both scorings.

  One panel per attack, because on one axes the attacks' bands (all near 0 under aligned
  scoring) merged into one block and coinciding lines hid each other. In a panel, aligned
  scoring is a solid line with a filled band, public-code scoring a dashed line with a
  hatched band, so the two bands stay apart where they overlap; every panel shares one y
  scale.
  """
  plt = _plt()
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  models = list(curves) or ['(none)']
  attacks = []
  for model in models:
    for scoring in ('aligned', 'public_code'):
      for a in curves.get(model, {}).get(scoring, {}):
        if a not in attacks:
          attacks.append(a)
  attacks = attacks or ['(none)']
  cols = min(3, len(attacks))
  per_model = -(-len(attacks) // cols)
  fig, axes = plt.subplots(per_model * len(models), cols, figsize=(4.2 * cols, 3.3 * per_model
                                                                   * len(models)),
                           squeeze=False, sharex=True, sharey=True)
  flat = [(m, a) for m in models for a in attacks]
  f = config.fedmia.outlier_filter
  for ax, (model, a) in zip(axes.reshape(-1), flat):
    for scoring in ('public_code', 'aligned'):  # aligned on top: its markers are smaller
      c = curves.get(model, {}).get(scoring, {}).get(a)
      if c is None:
        continue
      y = 100 * np.asarray(c['tpr_at_fpr_1e-3'], float)
      lo = 100 * np.asarray(c['tpr_at_fpr_1e-3_ci_low'], float)
      hi = 100 * np.asarray(c['tpr_at_fpr_1e-3_ci_high'], float)
      colour = _colour(a)
      if scoring == 'aligned':
        ax.fill_between(c['round'], lo, hi, color=colour, alpha=0.18, lw=0)
        ax.plot(c['round'], y, '-', marker='o', ms=2.5, lw=1.2, color=colour, zorder=3,
                label='aligned scoring (band: 95% CI)')
      else:
        ax.fill_between(c['round'], lo, hi, facecolor='none', edgecolor=colour,
                        hatch='////', lw=0, alpha=0.6)
        ax.plot(c['round'], y, '--', marker='s', ms=4.5, mfc='white', lw=1, color=colour,
                zorder=2.5, label='public-code scoring (hatched band: 95% CI)')
    _chance(ax)
    ax.set_title(f'{model}: {scores_lib.label(a, f)}', fontsize=8)
    ax.set_xlabel('communication round (count)')
    ax.set_ylabel('TPR at 0.1% FPR (%, symlog)')
  for ax in axes.reshape(-1)[len(flat):]:
    ax.axis('off')
  first = axes[0][0]
  # Aligned scoring stays within a few tenths of a percent, public-code scoring reaches tens
  # of percent: a linear axis would flatten the first onto zero.
  first.set_yscale('symlog', linthresh=0.1, linscale=0.5)
  figures.rate_limits(first, scale=100)
  first.yaxis.set_major_formatter(ticker.FormatStrFormatter('%g'))
  first.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))  # rounds are whole
  fig.suptitle('Attack strength over rounds (Fig. 5a); multi-round attacks use every '
               'recorded round so far; y linear below 0.1%', fontsize=9)
  fig.tight_layout()
  figures.figure_legend(fig)
  return fig


def clients_epochs_figure(config, points):
  plt = _plt()
  s = config.fedmia
  idx = fedmia_tables._index(points)  # pylint: disable=protected-access
  # One y scale for every panel: equal gaps read as equal between K, E and the models.
  fig, axes = plt.subplots(len(s.models), 2, figsize=(12, 4 * len(s.models)), squeeze=False,
                           sharey=True)
  ks = sorted({int(s.num_clients), *map(int, s.client_counts)})
  es = sorted({int(s.local_epochs), *map(int, s.epoch_counts)})
  for row, model in zip(axes, s.models):
    for ax, values, field, xlabel in ((row[0], ks, 'k', 'number of clients K'),
                                      (row[1], es, 'e', 'local epochs E')):
      n = len(s.sweep_attacks)
      for i, a in enumerate(s.sweep_attacks):
        ms = [fedmia_tables._get(idx, config, model, a, **{field: v}) for v in values]  # pylint: disable=protected-access
        keep = [j for j, m in enumerate(ms) if m is not None]
        if keep:
          # A small horizontal offset per attack keeps the error bars apart.
          _errorbar(ax, [values[j] * (1 + 0.02 * (i - n / 2)) for j in keep],
                    [ms[j] for j in keep], a, scores_lib.label(a, s.outlier_filter))
      _chance(ax)
      # A log axis needs two labelled ticks: with one value swept, the axis stays linear.
      if len(values) > 1:
        ax.set_xscale('log')
      ax.set_xticks(values)
      ax.set_xticklabels([str(v) for v in values])
      ax.minorticks_off()
      ax.set_xlabel(xlabel + (' (log scale)' if len(values) > 1 else ' (count)'))
      ax.set_ylabel('TPR at 0.1% FPR (%, 95% CI)')
      ax.set_title(f'{model}: {xlabel} (Fig. 5{"b" if field == "k" else "d"}), aligned',
                   fontsize=9)
    _legend_outside(row[1])
  figures.rate_limits(axes[0][0], scale=100)  # shared: sets every panel
  fig.tight_layout()
  return fig


def _defense_points(ax, metrics, **kw):
  """Test error against TPR@0.1% FPR of `metrics`, with both 95% Clopper-Pearson intervals."""
  x = np.array([100 * float(m['test_error']) for m in metrics])
  y = np.array([100 * float(m['tpr_at_fpr_1e-3']) for m in metrics])
  ylo = np.array([100 * float(m['tpr_at_fpr_1e-3_ci_low']) for m in metrics])
  yhi = np.array([100 * float(m['tpr_at_fpr_1e-3_ci_high']) for m in metrics])
  xerr = None
  if all('test_accuracy_ci_low' in m for m in metrics):
    # The error's interval is the accuracy's, mirrored: error = 1 - accuracy.
    xlo = np.array([100 * (1 - float(m['test_accuracy_ci_high'])) for m in metrics])
    xhi = np.array([100 * (1 - float(m['test_accuracy_ci_low'])) for m in metrics])
    xerr = [np.maximum(x - xlo, 0), np.maximum(xhi - x, 0)]
  return ax.errorbar(x, y, yerr=[np.maximum(y - ylo, 0), np.maximum(yhi - y, 0)], xerr=xerr,
                     capsize=2, elinewidth=0.8, **kw)


def defenses_figure(config, points):
  plt = _plt()
  s = config.fedmia
  idx = fedmia_tables._index(points)  # pylint: disable=protected-access
  attacks = list(s.sweep_attacks)
  cols = 3
  rows_ = -(-len(attacks) // cols) * len(s.models)
  # Shared axes: each panel on its own scale made a gap well inside the intervals look large.
  fig, axes = plt.subplots(rows_, cols, figsize=(4.2 * cols, 3.4 * rows_), squeeze=False,
                           sharex=True, sharey=True)
  names = list(s.defenses.keys())
  cmap = plt.get_cmap('tab10')
  flat = []
  for model in s.models:
    for a in attacks:
      flat.append((model, a))
  handles = {}
  for ax, (model, a) in zip(axes.reshape(-1), flat):
    base = fedmia_tables._get(idx, config, model, a)  # pylint: disable=protected-access
    if base is not None:
      h = _defense_points(ax, [base], marker='*', ms=10, color='k', ls='none',
                          label='no defense')
      handles.setdefault('no defense', h)
    for i, name in enumerate(names):
      ms = []
      for v in s.defenses[name]:
        m = fedmia_tables._get(idx, config, model, a, defense=name, param=float(v))  # pylint: disable=protected-access
        if m is not None:
          ms.append(m)
      if ms:
        ms.sort(key=lambda m: float(m['test_error']))
        h = _defense_points(ax, ms, marker='o', ms=3, lw=1, color=cmap(i % 10), label=name)
        handles.setdefault(name, h)
    ax.set_xlabel('test error (%)')
    ax.set_ylabel('TPR at 0.1% FPR (%, 95% CI)')
    ax.set_title(f'{model}: {scores_lib.label(a, s.outlier_filter)}', fontsize=8)
  figures.rate_limits(axes[0][0], 'x', scale=100)  # shared: sets every panel
  figures.rate_limits(axes[0][0], 'y', scale=100)
  for ax in axes.reshape(-1)[len(flat):]:
    ax.axis('off')
  fig.legend(list(handles.values()), list(handles), loc='upper center', ncol=min(5, len(handles)),
             fontsize=8, bbox_to_anchor=(0.5, 1.0))
  fig.tight_layout(rect=(0, 0, 1, 0.93))
  return fig


def save_all(config, key, points, records: dict, curves: dict, workdir: str,
             scored=None) -> None:
  """Writes the five figures (those whose data exist; the main ROC needs `records`, and
  reads the aligned scores `scored` kept)."""
  plt = _plt()
  makers = [('fedmia_noniid', lambda: noniid_figure(config, points)),
            ('fedmia_rounds', lambda: rounds_figure(config, curves)),
            ('fedmia_clients_epochs', lambda: clients_epochs_figure(config, points)),
            ('fedmia_defenses', lambda: defenses_figure(config, points))]
  if records:
    makers.insert(0, ('fedmia_roc', lambda: roc_figure(config, key, records, scored)))
  for name, make in makers:
    fig = make()
    figures.save(fig, workdir, name)
    plt.close(fig)
