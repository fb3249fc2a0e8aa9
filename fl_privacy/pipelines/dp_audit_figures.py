"""Figures of the DP audit (`fl_privacy.pipelines.dp_audit`).

- `fig_dp_audit_claims.png`: claimed vs empirical epsilon, one series per mechanism, one
  panel per lower bound (Clopper-Pearson and GDP at 95% each, and the verdict's best counted
  bound at family-wise 95%, `dp_canary.claim_metrics`), with the line y = x: a point above
  it in the last panel is a privacy violation, a point on it a tight audit.
- `fig_dp_audit_profile.png`: the empirical lower bound of the privacy profile delta(eps) of
  one point (`dp_audit.profile_mechanism` at `dp_audit.profile_epsilon`) against the
  accountant's profile of the same declaration and noise multiplier
  (`accounting.delta_for`): the empirical curve must stay below the accountant's.
"""

from __future__ import annotations

import math

import numpy as np

from fl_privacy import accounting
from fl_privacy.report import figures

_PANELS = (('epsilon_cp', 'Clopper-Pearson bound (95%)'),
           ('epsilon_gdp_if_gaussian', 'GDP bound (95%, Gaussian curves only)'),
           ('best_bound', 'best counted bound (family-wise 95%)'))


def _finite(v) -> float:
  v = float(v)  # the store keeps inf / nan as strings
  return v if math.isfinite(v) else float('nan')


def claims_figure(stored: list[dict], workdir: str) -> str | None:
  """Claimed vs empirical epsilon per mechanism (y = x drawn); None without points."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  if not stored:
    return None
  mechs = []
  for p in stored:
    if p['params']['mechanism'] not in mechs:
      mechs.append(p['params']['mechanism'])
  claims = sorted({float(p['params']['claimed_epsilon']) for p in stored})
  top = max(claims) * 1.1
  fig, axes = plt.subplots(1, len(_PANELS), figsize=(4.0 * len(_PANELS), 3.8), squeeze=False)
  colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
  markers = 'osD^v<>p*'
  for ax, (key, title) in zip(axes[0], _PANELS):
    ax.plot([0, top], [0, top], 'k--', lw=1, label='empirical = claimed (y = x)')
    for i, mech in enumerate(mechs):
      pts = sorted((p for p in stored if p['params']['mechanism'] == mech),
                   key=lambda p: float(p['params']['claimed_epsilon']))
      x = [float(p['params']['claimed_epsilon']) for p in pts]
      y = [_finite(p['metrics'].get(key, 'nan')) for p in pts]
      if all(math.isnan(v) for v in y):
        continue  # no such bound for this mechanism: a legend entry would show nothing here
      ax.plot(x, y, marker=markers[i % len(markers)], color=colors[i % len(colors)], lw=1,
              label=mech)
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(figures.EPSILON_AXIS)
    ax.set_ylabel('empirical epsilon, lower bound (nats)')
  fig.suptitle('DP audit: claimed vs empirical epsilon (lower bounds; above y = x is a '
               'violation)', fontsize=10)
  fig.tight_layout()
  figures.figure_legend(fig)
  path = figures.save(fig, workdir, 'fig_dp_audit_claims')
  plt.close(fig)
  return path


def declaration_from_metrics(mechanism: str, claimed_epsilon: float,
                             metrics: dict) -> accounting.Declaration:
  """The declaration a stored point was audited against (from its `dp_*` metrics).

  Here, not in the pipeline, so that the figures read stored points without importing
  `pipelines.dp_audit` (which imports this module).
  """
  del mechanism
  pure = metrics.get('ldp_epsilon_per_report')
  return accounting.Declaration(
      metrics['dp_mechanism'], metrics['dp_unit'], metrics['dp_relation'],
      metrics['dp_adversary'], metrics['dp_sampling'], float(metrics['dp_sensitivity']),
      int(metrics['dp_compositions']), float(metrics['dp_sampling_rate']),
      population=metrics.get('dp_population'), sample_size=metrics.get('dp_sample_size'),
      pure_epsilon=None if pure is None else float(pure),
      note=f'as audited at claimed epsilon {claimed_epsilon:g}')


def profile_figure(point: dict, workdir: str, delta: float) -> str:
  """The point's empirical delta(eps) lower bound against the accountant's profile."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  m = point['metrics']
  mech, claim = point['params']['mechanism'], float(point['params']['claimed_epsilon'])
  eps = np.asarray(m['profile_epsilons'], np.float64)
  emp = np.asarray([_finite(v) for v in m['profile_delta_lower']])
  decl = declaration_from_metrics(mech, claim, m)
  z = _finite(m['noise_multiplier'])
  acc = np.asarray([accounting.delta_for(decl, z, epsilon_=float(e)) for e in eps])
  fig, ax = plt.subplots(figsize=(5.2, 3.8))
  floor = max(delta / 10.0, 1e-12)
  ax.semilogy(eps, np.maximum(acc, floor), 'k-', lw=1.5,
              label=f'accountant (RDP), z = {z:.3g}')
  ax.semilogy(eps, np.maximum(emp, floor), 'o-', color='C1', lw=1,
              label=f'empirical lower bound ({100 * float(m["confidence"]):.0f}%; '
              '0 on the bottom edge)')
  ax.axvline(claim, color='C2', ls=':', lw=1, label=f'claimed epsilon {claim:g}')
  ax.axhline(delta, color='C3', ls=':', lw=1, label=f'claimed delta {delta:g}')
  ax.set_ylim(bottom=floor, top=1.5)
  ax.set_xlabel('epsilon (nats)')
  ax.set_ylabel('delta(epsilon) (log scale)')
  ax.set_title(f'{mech} at claimed epsilon {claim:g}: privacy profile', fontsize=10)
  fig.tight_layout()
  figures.legend_outside(ax)
  path = figures.save(fig, workdir, 'fig_dp_audit_profile')
  plt.close(fig)
  return path


def draw_figures(stored: list[dict], workdir: str, config=None) -> list[str]:
  """Both figures from the stored points (the profile only when its point has one)."""
  paths = []
  path = claims_figure(stored, workdir)
  if path:
    paths.append(path)
  delta = float(config.dp_audit.delta) if config is not None else None
  for p in stored:
    if 'profile_epsilons' in p['metrics']:
      paths.append(profile_figure(p, workdir, delta if delta is not None
                                  else float(p['metrics']['dp_delta'])))
      break
  return paths
