"""Figures of the AMI pipeline (`fl_privacy.pipelines.ami`), from the stored points.

`ami_vs_epsilon.png` (Figs. 5, 11), `neuron_histograms.png` (Fig. 10, from the saved draws in
`<workdir>/draws`), `certified.png` (Figs. 7, 12) and `dp_rounds.png` (Fig. 13).
"""

from __future__ import annotations

import os

import numpy as np

from fl_privacy import report
from fl_privacy.attacks import ami
from fl_privacy.report import figures


def _series(points, mechanism):
  pts = sorted((p for p in points if p['params'].get('part') == 'game'
                and p['params']['mechanism'] == mechanism),
               key=lambda p: p['params']['epsilon'] or 0.0)
  return pts


# Classes of the datasets the configs name (the stored points do not carry it): chance for
# an accuracy is 1 / classes. Unknown datasets draw no accuracy chance line.
_CLASSES = {'digits': 10, 'mnist': 10, 'fashion_mnist': 10, 'cifar10': 10, 'svhn_cropped': 10,
            'imagenette': 10, 'cifar100': 100}


def _num_classes(config) -> int | None:
  data = config.get('data') or {}
  if data.get('num_classes'):
    return int(data['num_classes'])
  return _CLASSES.get(data.get('name') or config.get('dataset'))


def _intervals(ax, xs, pts, name, label, color, shift):
  """Each measured epsilon as a marker with its 95% interval as an error bar.

  Each epsilon is a separate experiment: a band between two of them would suggest
  measurements in between. `shift` (a fraction of the epsilon range) keeps the bars of the
  series at one epsilon apart.
  """
  ys = np.array([float(p['metrics'][name]) for p in pts])
  lo = np.array([float(p['metrics'][f'{name}_ci_low']) for p in pts])
  hi = np.array([float(p['metrics'][f'{name}_ci_high']) for p in pts])
  step = (max(xs) - min(xs)) or 1.0
  x = np.asarray(xs, float) + shift * step
  ax.errorbar(x, ys, yerr=[np.maximum(ys - lo, 0), np.maximum(hi - ys, 0)], marker='o', ms=3,
              capsize=2, lw=0.8, label=label, color=color)


def _no_ldp_column(ax, xs, m, colors, titles) -> None:
  """The no-LDP point's rates: beside the epsilon axis as their own column, or (no LDP points
  in the panel) as horizontal lines.

  Drawn as lines across an epsilon axis, the no-LDP levels (all near 1) hide under the TPR
  curve; as markers with their intervals in a column of their own, each reads alone.
  """
  names = ['adv', 'tpr', 'tnr', 'accuracy'] + (['adv_calibrated'] if 'adv_calibrated' in m else [])
  colors = dict(colors, adv_calibrated='tab:purple')
  titles = dict(titles, adv_calibrated='Adv calibrated')
  if not xs:
    for name in names:
      ax.axhline(float(m[name]), color=colors[name], ls=':', lw=1,
                 label=f'{titles[name]}, no LDP')
    return
  step = 0.12 * (max(xs) - min(xs)) or 1.0  # the column's offset scales with the axis
  x0 = max(xs) + 1.5 * step
  width = 0.5 * step
  for i, name in enumerate(names):
    x = x0 + width * (i / max(1, len(names) - 1) - 0.5)
    y = float(m[name])
    err = [[y - float(m.get(f'{name}_ci_low', y))], [float(m.get(f'{name}_ci_high', y)) - y]]
    ax.errorbar([x], [y], yerr=err, fmt='D', ms=3.5, capsize=2, lw=1, color=colors[name],
                label=f'{titles[name]}, no LDP')
  ax.axvline(max(xs) + 0.75 * step, color='grey', ls='--', lw=0.6, label='_nolegend_')
  ticks = [t for t in ax.get_xticks() if min(xs) - 1e-9 <= t <= max(xs) + 1e-9]
  ax.set_xticks(ticks + [x0])
  ax.set_xticklabels([f'{t:g}' for t in ticks] + ['no\nLDP'])


def make_figures(points, workdir, config) -> None:
  """Writes the paper-style figures from the stored points (also after a resume)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  ldp = [m for m in ami.MECHANISMS if m != 'none' and _series(points, m)]
  none = _series(points, 'none')
  colors = {'adv': 'k', 'tpr': 'tab:red', 'tnr': 'tab:blue', 'accuracy': 'tab:green'}
  classes = _num_classes(config)
  titles = {'adv': 'Adv', 'tpr': 'TPR', 'tnr': 'TNR',
            'accuracy': f'{classes}-class accuracy' if classes else 'accuracy'}
  if ldp or none:
    panels = ldp or ['none']
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 1.6, 3.6),
                             squeeze=False)
    for ax, mech in zip(axes[0], panels):
      pts = _series(points, mech) if mech != 'none' else []
      xs = [p['params']['epsilon'] for p in pts]
      names = ['adv', 'tpr', 'tnr', 'accuracy']
      # Our calibrated variant beside the paper's rule (same trials), when the run has it.
      calibrated = bool(pts) and all('adv_calibrated' in p['metrics'] for p in pts)
      if calibrated:
        names.append('adv_calibrated')
      for i, name in enumerate(names if pts else []):
        label = ('Adv, calibrated bias (ours; 95% CI)' if name == 'adv_calibrated'
                 else f'{titles[name]} (95% CI)')
        _intervals(ax, xs, pts, name, label, colors.get(name, 'tab:purple'),
                   0.015 * (i - (len(names) - 1) / 2))
      if none:
        _no_ldp_column(ax, xs, none[0]['metrics'], colors, titles)
      # Chance differs between the series: a guess is right half the time on TPR and TNR,
      # but 1 / classes of the time on the test accuracy.
      ax.axhline(0.5, color='grey', lw=0.6, ls='--', label='chance for TPR, TNR (0.5)')
      if classes:
        ax.axhline(1.0 / classes, color='tab:green', lw=0.6, ls='--',
                   label=f'chance for {classes}-class accuracy ({1.0 / classes:g})')
      ax.set_ylim(0, 1.02)
      ax.set_xlabel(figures.EPSILON_AXIS if pts else 'no LDP: epsilon does not apply (-)')
      # Adv, TPR and TNR are fractions of trials, accuracy one of test examples.
      ax.set_ylabel('Adv, TPR, TNR, accuracy (fraction)')
      ax.set_title(f'AMI under {mech}', fontsize=10)
    figures.legend_outside(axes[0][-1])
    fig.suptitle(f'{config.dataset}, |D| = {config.ami.batch_size}, '
                 f'{config.ami.num_trials:,} trials per point', fontsize=10)
    fig.tight_layout()
    figures.save(fig, workdir, 'ami_vs_epsilon')
    plt.close(fig)
  _histograms(points, workdir, plt)
  _certified_figure(points, workdir, plt, ldp)
  _dp_figure(points, workdir, plt, float(config.ami.dp_deltas[0]))


def draws_store(workdir: str) -> report.ArtifactStore:
  """`<workdir>/draws/`: v(M(t)) ('target') and v(M(x)) ('other') of target 0 per LDP point."""
  return report.ArtifactStore(workdir, 'draws')


def draw_params(mechanism: str, epsilon: float) -> dict:
  """The params the draws of a game point are stored under."""
  return {'mechanism': mechanism, 'epsilon': float(epsilon)}


def load_draws(workdir: str, mechanism: str, epsilon: float) -> tuple[dict | None, str]:
  """The draws of one game point, or None and why (missing, or unreadable / another point's)."""
  store = draws_store(workdir)
  params = draw_params(mechanism, epsilon)
  draws = store.load(params)  # warns about an unreadable or foreign file
  if draws is not None and all(k in draws for k in ('target', 'other')):
    return draws, ''
  path = os.path.relpath(store.path(params), workdir)
  if not os.path.exists(store.path(params)):
    return None, f'{path} is missing'
  return None, f'{path} is unreadable or holds another point\'s draws'


def _histograms(points, workdir, plt) -> None:
  """Fig. 10: v of randomized target vs non-target draws, at up to 4 epsilons per mechanism.

  Panels are chosen among the stored points and read each point's own `draws/` file; a file
  that is missing or unreadable leaves its panel saying so (never another point's values).
  """
  found = {}
  for p in points:
    if p['params'].get('part') == 'game' and p['params']['mechanism'] != 'none':
      found.setdefault(p['params']['mechanism'], []).append(float(p['params']['epsilon']))
  if not found:
    return
  rows = [m for m in ami.MECHANISMS if m in found]
  picks = {}
  for mech in rows:
    available = sorted(found[mech])
    chosen = []
    for want in (1.0, 3.0, 5.0, 10.0):  # the paper's Fig. 10 panels
      best = min(available, key=lambda e: abs(e - want))  # pylint: disable=cell-var-from-loop
      if best not in chosen:
        chosen.append(best)
    picks[mech] = chosen
  cols = max(len(v) for v in picks.values())
  fig, axes = plt.subplots(len(rows), cols, figsize=(3 * cols + 1.6, 2.8 * len(rows)),
                           squeeze=False)
  for i, mech in enumerate(rows):
    for j, eps in enumerate(picks[mech]):
      ax = axes[i][j]
      ax.set_title(f'{mech}, eps = {eps:g}', fontsize=8)
      draws, reason = load_draws(workdir, mech, eps)
      if draws is None:
        ax.text(0.5, 0.5, f'no draws:\n{reason}', ha='center', va='center', fontsize=7,
                wrap=True, transform=ax.transAxes, color='tab:red')
        ax.set_xticks([])
        ax.set_yticks([])
        continue
      ax.hist(draws['other'], bins=50, alpha=0.6, color='tab:blue', density=True,
              label='non-target M(x)')
      ax.hist(draws['target'], bins=50, alpha=0.6, color='tab:red', density=True,
              label='target M(t)')
      ax.axvline(0, color='green', ls=':', label='v = 0: the neuron fires above')
      ax.set_xlabel('v = w.M(.) + b of the chosen neuron (a.u.)', fontsize=8)
      # Each panel's v spans its own range, so its density has its own height: the label
      # says the y scales differ rather than squash the narrow histograms.
      ax.set_ylabel('density (1 / a.u. of v; y scale per panel)', fontsize=8)
    for j in range(len(picks[mech]), cols):
      axes[i][j].axis('off')
  fig.tight_layout()
  figures.figure_legend(fig)
  figures.save(fig, workdir, 'neuron_histograms')
  plt.close(fig)


def _certified_figure(points, workdir, plt, ldp) -> None:
  if not ldp:
    return
  fig, axes = plt.subplots(2, len(ldp), figsize=(4.6 * len(ldp) + 2.4, 6.2), squeeze=False)
  for j, mech in enumerate(ldp):
    pts = [p for p in _series(points, mech) if 'certified_mean_target' in p['metrics']]
    if not pts:
      continue
    xs = [p['params']['epsilon'] for p in pts]
    g = lambda k: np.array([float(p['metrics'][k]) for p in pts])  # pylint: disable=cell-var-from-loop
    ax = axes[0][j]
    ax.plot(xs, g('certified_mean_target'), color='tab:red', label='E[v(M(t))]')
    ax.fill_between(xs, g('certified_lower_target'), g('certified_mean_target'),
                    color='tab:red', alpha=0.2, label='Hoeffding lower bound')
    ax.plot(xs, g('certified_mean_other'), color='tab:blue', label='E[v(M(x))]')
    ax.fill_between(xs, g('certified_mean_other'), g('certified_upper_other'),
                    color='tab:blue', alpha=0.2, label='Hoeffding upper bound')
    ax.axhline(0, color='green', ls=':', label='v = 0')
    ax.set_yscale('symlog', linthresh=1e-2)
    ax.set_title(f'{mech}: v and its Hoeffding bounds', fontsize=9)
    ax.set_xlabel(figures.EPSILON_AXIS)
    ax.set_ylabel('v of the chosen neuron (a.u., symlog)')
    ax = axes[1][j]
    ax.semilogy(xs, np.maximum(g('certified_delta_star'), 1e-300), marker='o', ms=3,
                label='smallest delta (line search)')
    ax.semilogy(xs, np.maximum(g('certified_delta_star_exact'), 1e-300), ls='--',
                label='closed form')
    ax.semilogy(xs, np.maximum(g('certified_delta_star_empirical_range'), 1e-300), ls=':',
                label='with the empirical range (NOT valid)')
    ax.set_xlabel(figures.EPSILON_AXIS)
    ax.set_ylabel('broken probability delta* (log)')
    ax.set_title(f'{mech}: smallest certified delta', fontsize=9)
  figures.legend_outside(axes[0][-1])
  figures.legend_outside(axes[1][-1])
  fig.tight_layout()
  figures.save(fig, workdir, 'certified')
  plt.close(fig)


def _dp_figure(points, workdir, plt, delta0: float) -> None:
  pts = [p for p in points if p['params'].get('part') == 'dp_averaging']
  if not pts:
    return
  fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), sharey=True)  # one scale: comparable
  deltas = sorted({p['params']['dp_delta'] for p in pts}, reverse=True)
  neurons = sorted({p['params']['num_chosen'] for p in pts})
  for delta in deltas:
    s = sorted((p for p in pts if p['params']['dp_delta'] == delta and
                p['params']['num_chosen'] == 1), key=lambda p: p['params']['epsilon'])
    xs = [p['params']['epsilon'] for p in s]
    line, = axes[0].semilogy(xs, [p['metrics']['rounds_closed_form'] for p in s],
                             label=f'delta = {delta:g}')
    mc = [(x, p['metrics']['rounds_monte_carlo']) for x, p in zip(xs, s)
          if p['metrics']['rounds_monte_carlo'] > 0]
    line.set_label(f'closed form, delta = {delta:g}')
    if mc:
      axes[0].plot(*zip(*mc), 'o', ms=3, color=line.get_color(),
                   label=f'Monte Carlo, delta = {delta:g}')
  axes[0].set_title('1 chosen neuron', fontsize=9)
  for k in neurons:
    s = sorted((p for p in pts if p['params']['num_chosen'] == k and
                p['params']['dp_delta'] == delta0), key=lambda p: p['params']['epsilon'])
    axes[1].semilogy([p['params']['epsilon'] for p in s],
                     [p['metrics']['rounds_closed_form'] for p in s], marker='o', ms=3,
                     label=f'K = {k} (closed form)')
  axes[1].set_title(f'K chosen neurons, delta = {delta0:g}', fontsize=9)
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  lo, hi = axes[0].get_ylim()
  # Within a decade or two a log axis labels one power of ten at most: label 1, 2, 5 per
  # decade, or whole counts spread over the range when even those are fewer than two.
  ticks = [m * 10.0 ** k for k in range(int(np.floor(np.log10(max(lo, 1e-9)))),
                                        int(np.ceil(np.log10(max(hi, 1.0)))) + 1)
           for m in (1, 2, 5)]
  ticks = [t for t in ticks if lo <= t <= hi and t >= 1]
  if len(ticks) < 2:
    ticks = [t for t in ticker.MaxNLocator(nbins=4, integer=True).tick_values(lo, hi)
             if lo <= t <= hi and t >= 1]
  for ax in axes:
    # Plain numbers on the log axis: rounds are counts, 6 reads better than 6 x 10^0.
    ax.yaxis.set_major_locator(ticker.FixedLocator(ticks))
    ax.yaxis.set_major_formatter(ticker.FormatStrFormatter('%g'))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())  # crowded labels between decades
    ax.set_xlabel('DP-SGD epsilon (nats)')
    ax.set_ylabel('rounds to FPR, FNR <= delta (count, log)')
    figures.legend_outside(ax)
  fig.tight_layout()
  figures.save(fig, workdir, 'dp_rounds')
  plt.close(fig)
