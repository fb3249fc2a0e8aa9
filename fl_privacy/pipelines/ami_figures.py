"""Figures of the AMI pipeline (`fl_privacy.pipelines.ami`), from the stored points.

`ami_vs_epsilon.png` (Figs. 5, 11), `neuron_histograms.png` (Fig. 10, from the saved draws in
`<workdir>/draws`), `certified.png` (Figs. 7, 12) and `dp_rounds.png` (Fig. 13).
"""

from __future__ import annotations

import numpy as np

from fl_privacy import report
from fl_privacy.attacks import ami
from fl_privacy.report import figures


def _series(points, mechanism):
  pts = sorted((p for p in points if p['params'].get('part') == 'game'
                and p['params']['mechanism'] == mechanism),
               key=lambda p: p['params']['epsilon'] or 0.0)
  return pts


def _band(ax, xs, pts, name, label, color):
  ys = [float(p['metrics'][name]) for p in pts]
  lo = [float(p['metrics'][f'{name}_ci_low']) for p in pts]
  hi = [float(p['metrics'][f'{name}_ci_high']) for p in pts]
  ax.plot(xs, ys, marker='o', ms=3, label=label, color=color)
  ax.fill_between(xs, lo, hi, alpha=0.25, color=color)


def make_figures(points, workdir, config) -> None:
  """Writes the paper-style figures from the stored points (also after a resume)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  ldp = [m for m in ami.MECHANISMS if m != 'none' and _series(points, m)]
  none = _series(points, 'none')
  colors = {'adv': 'k', 'tpr': 'tab:red', 'tnr': 'tab:blue', 'accuracy': 'tab:green'}
  if ldp or none:
    panels = ldp or ['none']
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, mech in zip(axes[0], panels):
      pts = _series(points, mech) if mech != 'none' else []
      xs = [p['params']['epsilon'] for p in pts]
      for name in ('adv', 'tpr', 'tnr', 'accuracy'):
        if pts:
          _band(ax, xs, pts, name, name.upper() if name != 'accuracy' else 'accuracy',
                colors[name])
        if none:
          ax.axhline(float(none[0]['metrics'][name]), color=colors[name], ls=':', lw=1,
                     label=f'{name} (no LDP)' if name == 'adv' else None)
      # Our calibrated variant beside the paper's rule (same trials), when the run has it.
      if pts and all('adv_calibrated' in p['metrics'] for p in pts):
        _band(ax, xs, pts, 'adv_calibrated', 'ADV, calibrated bias (ours)', 'tab:purple')
      if none and 'adv_calibrated' in none[0]['metrics']:
        ax.axhline(float(none[0]['metrics']['adv_calibrated']), color='tab:purple', ls=':',
                   lw=1, label='adv calibrated (no LDP)')
      ax.axhline(0.5, color='grey', lw=0.5)
      ax.set_ylim(0, 1.02)
      ax.set_xlabel('epsilon')
      ax.set_title(f'AMI under {mech} ({config.dataset}, |D| = {config.ami.batch_size})')
      ax.legend(fontsize=7, loc='lower right')
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


def _histograms(points, workdir, plt) -> None:
  """Fig. 10: v of randomized target vs non-target draws, at up to 4 epsilons per mechanism."""
  store = draws_store(workdir)
  found = {}
  for point in points:
    p = point['params']
    if p.get('part') != 'game' or p.get('mechanism') in (None, 'none'):
      continue
    draws = store.load(draw_params(p['mechanism'], float(p['epsilon'])))
    if draws is not None:
      found.setdefault(p['mechanism'], []).append((float(p['epsilon']), draws))
  if not found:
    return
  rows = sorted(found)
  picks = {}
  for mech in rows:
    available = sorted(found[mech], key=lambda e: e[0])
    chosen = []
    for want in (1.0, 3.0, 5.0, 10.0):  # the paper's Fig. 10 panels
      best = min(available, key=lambda e: abs(e[0] - want))
      if all(best[0] != c[0] for c in chosen):
        chosen.append(best)
    picks[mech] = chosen
  cols = max(len(v) for v in picks.values())
  fig, axes = plt.subplots(len(rows), cols, figsize=(3 * cols, 2.6 * len(rows)),
                           squeeze=False)
  for i, mech in enumerate(rows):
    for j, (eps, z) in enumerate(picks[mech]):
      ax = axes[i][j]
      ax.hist(z['other'], bins=50, alpha=0.6, color='tab:blue', density=True,
              label='non-target M(x)')
      ax.hist(z['target'], bins=50, alpha=0.6, color='tab:red', density=True,
              label='target M(t)')
      ax.axvline(0, color='green', ls=':')
      ax.set_title(f'{mech}, eps = {eps:g}', fontsize=8)
    for j in range(len(picks[mech]), cols):
      axes[i][j].axis('off')
  axes[0][0].legend(fontsize=7)
  figures.save(fig, workdir, 'neuron_histograms')
  plt.close(fig)


def _certified_figure(points, workdir, plt, ldp) -> None:
  if not ldp:
    return
  fig, axes = plt.subplots(2, len(ldp), figsize=(5 * len(ldp), 6), squeeze=False)
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
    ax.axhline(0, color='green', ls=':')
    ax.set_yscale('symlog', linthresh=1e-2)
    ax.set_title(f'{mech}: v and its Hoeffding bounds', fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[1][j]
    ax.semilogy(xs, np.maximum(g('certified_delta_star'), 1e-300), marker='o', ms=3,
                label='smallest delta (line search)')
    ax.semilogy(xs, np.maximum(g('certified_delta_star_exact'), 1e-300), ls='--',
                label='closed form')
    ax.semilogy(xs, np.maximum(g('certified_delta_star_empirical_range'), 1e-300), ls=':',
                label='with the empirical range (NOT valid)')
    ax.set_xlabel('epsilon')
    ax.set_ylabel('broken probability delta*')
    ax.legend(fontsize=7)
  figures.save(fig, workdir, 'certified')
  plt.close(fig)


def _dp_figure(points, workdir, plt, delta0: float) -> None:
  pts = [p for p in points if p['params'].get('part') == 'dp_averaging']
  if not pts:
    return
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
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
    if mc:
      axes[0].plot(*zip(*mc), 'o', ms=3, color=line.get_color())
  axes[0].set_title('1 chosen neuron (lines: closed form, dots: MC)', fontsize=9)
  for k in neurons:
    s = sorted((p for p in pts if p['params']['num_chosen'] == k and
                p['params']['dp_delta'] == delta0), key=lambda p: p['params']['epsilon'])
    axes[1].semilogy([p['params']['epsilon'] for p in s],
                     [p['metrics']['rounds_closed_form'] for p in s], marker='o', ms=3,
                     label=f'K = {k}')
  axes[1].set_title(f'K chosen neurons, delta = {delta0:g}')
  for ax in axes:
    ax.set_xlabel('epsilon')
    ax.legend(fontsize=7)
  figures.save(fig, workdir, 'dp_rounds')
  plt.close(fig)
