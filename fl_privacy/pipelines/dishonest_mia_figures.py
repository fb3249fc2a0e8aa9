"""Figures of the dishonest-server MI pipeline (`fl_privacy.pipelines.dishonest_mia`)."""

from __future__ import annotations

import numpy as np

from fl_privacy.report import figures


def delta_figure(config, deltas: dict):
  """Delta of every run per point, inside vs outside (outside zeros drawn at the floor)."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  names = list(deltas)
  fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(names)), 4))
  floor = 1e-4
  for i, name in enumerate(names):
    for key, colour, shift in (('inside', 'tab:blue', -0.15), ('outside', 'tab:red', 0.15)):
      v = np.maximum(np.asarray(deltas[name][key], dtype=np.float64), floor)
      ax.scatter(np.full(len(v), i + shift), v, s=6, c=colour, alpha=0.5,
                 label=f'target {key} the client data' if i == 0 else '_nolegend_')
  ax.axhline(config.dishonest.threshold, color='k', lw=0.8, ls='--',
             label=f'threshold xi = {config.dishonest.threshold:g}')
  ax.set_yscale('log')
  ax.set_xticks(range(len(names)))
  ax.set_xticklabels(names, rotation=90, fontsize=7)
  ax.set_xlabel('point (optimizer_M_J_E)')
  ax.set_ylabel(f'Delta (ratio, log; 0 drawn at {floor:g})')
  ax.set_title('Delta of every run: member iff Delta >= xi', fontsize=10)
  figures.legend_outside(ax, title='runs')
  fig.tight_layout()
  return fig


def save_delta_figure(config, deltas: dict, workdir: str) -> None:
  """Writes `delta_figure` as `<workdir>/delta.png`."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig = delta_figure(config, deltas)
  figures.save(fig, workdir, 'delta')
  plt.close(fig)
