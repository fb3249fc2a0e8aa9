"""Figures of the LDP-audit experiment (`fl_privacy.pipelines.ldp_audit`).

`fig2_<mechanism>.png`, one per audited mechanism: measured vs claimed epsilon per
crafter, one line per distinguisher with 95% Clopper-Pearson bars, like Fig. 2 of
Matsumoto et al. (for an input mechanism, its claimed vs attained epsilon).
"""

from __future__ import annotations

import math

import numpy as np

from fl_privacy.attacks import audit
from fl_privacy.report import figures


def _finite(v, cap: float) -> float:
  v = float(v)
  return cap if math.isinf(v) and v > 0 else v


def draw_figures(stored: list[dict], workdir: str) -> list[str]:
  """Fig. 2 style (measured vs theoretical epsilon per crafter) and the
  claimed-vs-attained plot of the input mechanisms."""
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
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows),
                             squeeze=False)
    for ax, crafter in zip(axes.ravel(), crafter_names):
      sub = [p for p in pts if p['params']['crafter'] == crafter]
      eps_all = sorted({p['params']['epsilon'] for p in sub})
      top = max(eps_all) * 1.15
      ax.plot([0, top], [0, top], 'k--', lw=1, label='theoretical')
      for dname in sorted({p['params']['distinguisher'] for p in sub}):
        line = sorted((p for p in sub if p['params']['distinguisher'] == dname),
                      key=lambda p: p['params']['epsilon'])
        e = np.array([p['params']['epsilon'] for p in line])
        m = [p['metrics'] for p in line]
        cap = max(top, max(_finite(q['eps_emp_lower'], top) for q in m)) * 1.1
        mid = np.array([_finite(q['eps_emp'], cap) for q in m])
        lo = np.array([_finite(q['eps_emp_lower'], cap) for q in m])
        # An unbounded upper end (a test that never errs on one side) gets no
        # upper bar rather than one to the top of the axes.
        hi = np.array([mid[i] if math.isinf(float(q['eps_emp_upper'])) else
                       float(q['eps_emp_upper']) for i, q in enumerate(m)])
        ax.errorbar(e, mid, yerr=[np.maximum(mid - lo, 0),
                                  np.maximum(hi - mid, 0)],
                    marker='o', capsize=3, label=dname.replace('_', '-'))
      ax.set_title(crafter.replace('_', ' '))
      ax.set_xlabel('claimed epsilon')
      ax.set_ylabel('empirical epsilon (90% bracket)')
      ax.legend(fontsize=8)
    for ax in axes.ravel()[n:]:
      ax.axis('off')
    # Each bar end is a one-sided 95% bound: together a 90% bracket.
    fig.suptitle(f'Empirical LDP of {mech}: Eq. 3; bars: one-sided 95% bounds, '
                 'together a 90% bracket (no upper bar: unbounded)')
    fig.tight_layout()
    paths.append(figures.save(fig, workdir, f'fig2_{mech}'))
    plt.close(fig)
  return paths
