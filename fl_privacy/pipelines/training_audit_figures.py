"""Table and figure of the training audit (`fl_privacy.pipelines.training_audit`).

- `training_audit.md`: one row per (defense, sampling, canary, threat, claim): the
  declaration's labels, the epsilon audited, the one-run bounds (counted ones marked), the
  estimate, the canaries behind them and the verdict, and which pipeline the training ran.
- `fig_training_audit.png`: claimed vs empirical epsilon, one panel per threat, one series per
  (defense, sampling, canary); the best counted one-run bound (filled) and Andrew et al.'s
  estimate (hollow), with y = x: a bound above it is a violation.
"""

from __future__ import annotations

import math

from fl_privacy.report import atomic_write_text
from fl_privacy.report import figures

_COLUMNS = ('defense', 'sampling', 'canary', 'threat', 'eps claimed', 'eps audited',
            'unit', 'relation', 'adversary', 'eps 1-run', 'eps 1-run f-DP', 'counted',
            'eps estimate', 'canaries (in/out)', 'test acc', 'violation', 'audited')


def _f(v, digits: int = 2) -> str:
  try:
    v = float(v)
  except (TypeError, ValueError):
    return str(v)
  if math.isnan(v):
    return '-'
  if math.isinf(v):
    return 'inf'
  return f'{v:.{digits}f}'


def _series(p: dict) -> str:
  q = p['params']
  return f"{q['defense']} {q['sampling']} {q['canary']}"


def table_markdown(stored: list[dict], config=None) -> str:
  """The run's table (markdown)."""
  lines = ['# Training audit: canaries inside the trainings that run', '',
           'Every row audited the pipeline the experiments run (`fl.rounds.run` with the '
           'defense configured by `defenses.configured.configure`), one training per '
           '(defense, sampling, claim, canary kind), both threats scored on the same '
           'training. Bounds are one-run lower bounds (Steinke et al. 2023; f-DP: Mahloujifar '
           'et al. 2024) at family-wise confidence over the counted ones; the estimate is '
           'Andrew et al. 2024\'s Gaussian fit (not a bound).', '']
  if config is not None:
    s = config.training_audit
    lines += [f'delta {s.delta:g}, confidence {s.confidence:g}, {s.num_clients} clients x '
              f'{s.per_client} rows, T = {s.num_rounds}, E = {s.epochs}, B = {s.batch_size}, '
              f'canary norm {s.canary_norm:g} C, plant `{s.plant}`.', '']
  lines += ['| ' + ' | '.join(_COLUMNS) + ' |', '|' + '---|' * len(_COLUMNS)]
  for p in stored:
    q, m = p['params'], p['metrics']
    lines.append('| ' + ' | '.join([
        q['defense'], q['sampling'], q['canary'], q['threat'], _f(q['claimed_epsilon']),
        _f(m.get('dp_epsilon')), str(m.get('dp_unit', '-')), str(m.get('dp_relation', '-')),
        str(m.get('dp_adversary', '-')), _f(m.get('epsilon_one_run')),
        _f(m.get('epsilon_one_run_fdp')), str(m.get('counted_bounds', '-')),
        _f(m.get('epsilon_estimate')),
        f"{m.get('num_canaries', '-')} ({m.get('n_in', '-')}/{m.get('n_out', '-')})",
        _f(m.get('test_accuracy'), 3),
        '**YES**' if float(m.get('privacy_violation', 0)) > 0 else 'no',
        f"`{m.get('audited_pipeline', '-')}`"]) + ' |')
  return '\n'.join(lines) + '\n'


def claims_figure(stored: list[dict], workdir: str) -> str | None:
  """Claimed (audited) vs empirical epsilon per series, one panel per threat."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  if not stored:
    return None
  threats = list(dict.fromkeys(p['params']['threat'] for p in stored))
  series = list(dict.fromkeys(_series(p) for p in stored))
  claims = [float(p['metrics']['dp_epsilon']) for p in stored
            if math.isfinite(float(p['metrics']['dp_epsilon']))]
  top = 1.1 * max(claims + [1.0])
  fig, axes = plt.subplots(1, len(threats), figsize=(5.0 * len(threats), 4.2), squeeze=False)
  colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
  markers = 'osD^v<>p*hX'
  for ax, threat in zip(axes[0], threats):
    ax.plot([0, top], [0, top], 'k--', lw=1, label='empirical = claimed (y = x)')
    for i, name in enumerate(series):
      pts = sorted((p for p in stored if p['params']['threat'] == threat and
                    _series(p) == name), key=lambda p: float(p['metrics']['dp_epsilon']))
      if not pts:
        continue
      # Series at the same claim with equal bounds (0 at a small claim) would hide each
      # other: each series is dodged sideways by a fixed 1.5% of the axis.
      dodge = (i - (len(series) - 1) / 2) * 0.015 * top
      x = [float(p['metrics']['dp_epsilon']) + dodge for p in pts]
      c, mk = colors[i % len(colors)], markers[i % len(markers)]
      ax.plot(x, [float(p['metrics']['best_bound']) for p in pts], marker=mk, color=c, lw=1,
              label=f'{name}: one-run bound')
      ax.plot(x, [min(top, float(p['metrics']['epsilon_estimate'])) for p in pts], marker=mk,
              color=c, lw=0, mfc='none', label=f'{name}: estimate')
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_title(f'threat: {threat}', fontsize=10)
    ax.set_xlabel('claimed epsilon of the training that ran (nats; series dodged sideways)')
    ax.set_ylabel('empirical epsilon (nats)')
  fig.suptitle('Training audit: one-run lower bounds (filled) and Gaussian-fit estimates '
               '(hollow) vs the claim', fontsize=10)
  fig.tight_layout()
  figures.figure_legend(fig)
  path = figures.save(fig, workdir, 'fig_training_audit')
  plt.close(fig)
  return path


def write(stored: list[dict], workdir: str, config=None) -> None:
  """training_audit.md and fig_training_audit.png (atomically)."""
  import os  # pylint: disable=g-import-not-at-top
  atomic_write_text(os.path.join(workdir, 'training_audit.md'), table_markdown(stored, config))
  claims_figure(stored, workdir)
