"""Figures of the LDP-audit experiment (`fl_privacy.pipelines.ldp_audit`).

`fig2_<mechanism>.png`, one per audited mechanism: measured vs claimed epsilon per
crafter, one line per distinguisher with bars from the one-sided 95% bounds (together a 90%
bracket), like Fig. 2 of
Matsumoto et al. (for an input mechanism, its claimed vs attained epsilon).
"""

from __future__ import annotations

import math

import numpy as np

from fl_privacy.attacks import audit
from fl_privacy.report import figures


def _float(v) -> float:
  return float(v)  # the store keeps inf as the string "inf"


def draw_figures(stored: list[dict], workdir: str) -> list[str]:
  """Fig. 2 style (measured vs theoretical epsilon per crafter) and the
  claimed-vs-attained plot of the input mechanisms.

  A point whose estimate is unbounded (eps_emp = inf: the test never erred on one side) is
  not drawn as a measurement: a caret on the top edge marks it, with a dotted line up
  from its finite 95% lower bound, which is what the trials certify.
  """
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  paths = []
  by_mech: dict[str, list[dict]] = {}
  for p in stored:
    by_mech.setdefault(p['params']['mechanism'], []).append(p)
  for mech, pts in sorted(by_mech.items()):
    crafter_names = sorted({p['params']['crafter'] for p in pts},
                           key=lambda c: audit.CRAFTERS.index(c)
                           if c in audit.CRAFTERS else 99)
    n = len(crafter_names)
    cols = min(3, n)
    rows = -(-n // cols)
    # One scale for every crafter's panel (limits from all of them): equal gaps read equal.
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols + 1.8, 3.6 * rows),
                             squeeze=False, sharex=True, sharey=True)
    eps_all = sorted({p['params']['epsilon'] for p in pts})
    finite = [_float(p['metrics'][k]) for p in pts
              for k in ('eps_emp', 'eps_emp_lower', 'eps_emp_upper')]
    finite = [v for v in finite if math.isfinite(v)]
    top = max([max(eps_all) * 1.15] + finite) * 1.12
    for ax, crafter in zip(axes.ravel(), crafter_names):
      sub = [p for p in pts if p['params']['crafter'] == crafter]
      ax.plot([0, top], [0, top], 'k--', lw=1, label='claimed = empirical')
      ax.set_ylim(bottom=min([0.0] + finite) - 0.02 * top, top=top)
      ax.set_xlim(0, max(eps_all) * 1.15)
      colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
      for i, dname in enumerate(sorted({p['params']['distinguisher'] for p in sub})):
        color = colors[i % len(colors)]
        line = sorted((p for p in sub if p['params']['distinguisher'] == dname),
                      key=lambda p: p['params']['epsilon'])
        shown = [p for p in line if math.isfinite(_float(p['metrics']['eps_emp']))]
        label = dname.replace('_', '-')
        if shown:
          e = np.array([p['params']['epsilon'] for p in shown])
          mid = np.array([_float(p['metrics']['eps_emp']) for p in shown])
          lo = np.array([_float(p['metrics']['eps_emp_lower']) for p in shown])
          # An unbounded upper end (a test that never errs on one side) gets no
          # upper bar rather than one to the top of the axes.
          hi = np.array([mid[j] if math.isinf(_float(p['metrics']['eps_emp_upper'])) else
                         _float(p['metrics']['eps_emp_upper'])
                         for j, p in enumerate(shown)])
          ax.errorbar(e, mid, yerr=[np.maximum(mid - lo, 0), np.maximum(hi - mid, 0)],
                      marker='o', capsize=3, color=color, label=f'{label} (90% bracket)')
        unbounded = [p for p in line if not math.isfinite(_float(p['metrics']['eps_emp']))]
        for j, p in enumerate(unbounded):
          low = _float(p['metrics']['eps_emp_lower'])
          figures.mark_unbounded(
              ax, p['params']['epsilon'], low, color=color,
              label=f'{label}: eps_emp = inf, dotted from its lower bound' if j == 0
              else '_nolegend_', text=f'inf (>= {low:.2f})')
      ax.set_title(crafter.replace('_', ' '), fontsize=10)
      ax.set_xlabel(figures.EPSILON_AXIS)
      ax.set_ylabel('empirical epsilon, Eq. 3 (nats)')
    for ax in axes.ravel()[n:]:
      ax.axis('off')
    # Each bar end is a one-sided 95% bound: together a 90% bracket.
    fig.suptitle(f'Empirical LDP of {mech}: Eq. 3; bars: one-sided 95% bounds, '
                 'together a 90% bracket (no upper bar: unbounded)', fontsize=10)
    fig.tight_layout()
    figures.figure_legend(fig)
    paths.append(figures.save(fig, workdir, f'fig2_{mech}'))
    plt.close(fig)
  return paths
