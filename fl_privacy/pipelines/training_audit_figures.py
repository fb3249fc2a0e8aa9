"""Table and figure of the training audit (`fl_privacy.pipelines.training_audit`).

- `training_audit.md`: one row per (defense, sampling, canary, threat, claim): the
  declaration's labels, the epsilon audited (weak_dp: composed, its per-round claim beside
  it), the best counted bound, the most a perfect attack with these canaries certifies, the
  simulated optimal attack where the row has one, the estimate, the canaries (bounding / all,
  replicate trainings), the one-run bound's 2 m delta, the accuracy beside the canary-free
  twin and the verdict ('cannot refute' with the canaries that would).
- `fig_training_audit.png`: claimed vs empirical epsilon, one panel per threat, one series per
  (defense, sampling, canary); the best counted bound (filled), the estimate (hollow) and what
  a perfect attack could certify (a cross), with y = x: a bound above it is a violation.
"""

from __future__ import annotations

import math

from fl_privacy.report import atomic_write_text
from fl_privacy.report import figures

_COLUMNS = ('defense', 'sampling', 'canary', 'threat', 'eps claimed', 'eps audited',
            'unit', 'relation', 'adversary', 'counted', 'eps best counted', 'eps reachable',
            'simulated optimal', 'eps estimate', 'canaries (bounding / all; trainings)',
            '2 m delta', 'test acc', 'acc change vs twin', 'verdict', 'audited',
            'eps certified, assumes none (test)', 'eps if Gaussian (test)', 'refutable by',
            'verdict by (assumes)', 'detects noise x at 95% (hits; eps planted)',
            'simulated optimum [95%] (draws)')


def _labelled(m: dict, value: str, test: str) -> str:
  """`value (test)`, or '-' where the value is missing."""
  text = _f(m.get(value))
  return text if text == '-' or m.get(test) is None else f'{text} ({m[test]})'


def _power(m: dict) -> str:
  """The detected noise factor with its hits and the planted bug's epsilon; 'none down to
  <smallest>' when no factor is detected; the model's words where not simulated."""
  if m.get('power_model') is None:
    return '-'
  if m.get('power_draws') is None:
    return str(m['power_model'])
  if _f(m.get('power_factor')) == '-':
    return f"none (next {_f(m.get('power_next_factor'))}x: {m.get('power_next_hits')}/" \
           f"{m['power_draws']})"
  return (f"{_f(m['power_factor'])}x ({m['power_hits']}/{m['power_draws']}; "
          f"{_f(m.get('power_planted_epsilon'))})")


def _optimum(m: dict) -> str:
  if _f(m.get('simulated_bound')) == '-' or m.get('simulated_draws') is None:
    return '-'
  return (f"{_f(m['simulated_bound'])} [{_f(m.get('simulated_bound_ci_low'))}, "
          f"{_f(m.get('simulated_bound_ci_high'))}] ({m['simulated_draws']})")


def _f(v, digits: int = 2) -> str:
  if v is None:
    return '-'
  try:
    v = float(v)
  except (TypeError, ValueError):
    return str(v)
  if math.isnan(v):
    return '-'
  if math.isinf(v):
    return 'inf'
  return f'{v:.{digits}f}'


def _ci(m: dict, name: str, digits: int) -> str:
  """`x [low, high]`, or `x`, or `-`."""
  if m.get(name) is None:
    return '-'
  low, high = m.get(f'{name}_ci_low'), m.get(f'{name}_ci_high')
  text = _f(m[name], digits)
  if low is None or high is None or _f(low) == '-':
    return text
  return f'{text} [{_f(low, digits)}, {_f(high, digits)}]'


def _series(p: dict) -> str:
  q = p['params']
  return f"{q['defense']} {q['sampling']} {q['canary']}"


def table_markdown(stored: list[dict], config=None) -> str:
  """The run's table (markdown)."""
  lines = ['# Training audit: canaries inside the trainings that run', '',
           'Every row audited the pipeline the experiments run (`fl.rounds.run` with the '
           'defense configured by `defenses.configured.configure`), replicate trainings per '
           '(defense, sampling, claim, canary kind), every threat scored on the same '
           'trainings. Certified bounds are lower bounds at family-wise confidence over the '
           'counted tests (one-run: Steinke et al. 2023; f-DP: Mahloujifar et al. 2024; '
           'Clopper-Pearson, GDP and the privacy-profile test where the canaries are '
           'independent trials); "reachable" is what a perfect attack on these canaries '
           'certifies (a row below its claim cannot refute it unless the profile test can: '
           '"refutable by" names the tests that could); the estimate is Andrew et al. '
           '2024\'s Gaussian fit, or the Poisson-subsampled fit of every step (not a bound). '
           'One-run, Clopper-Pearson and the profile test assume nothing of the mechanism; GDP '
           'and f-DP bounds assume its trade-off curve is Gaussian ("eps if Gaussian"). '
           'Power: the largest noise factor the row detects in at least 95% of simulations '
           'of its own statistic and tests, and the epsilon that noise spends.',
           '']
  if config is not None:
    s = config.training_audit
    r, c = s.record, s.client
    lines += [f'delta {s.delta:g}, confidence {s.confidence:g} (family-wise), accountant '
              f'{s.accountant}, canary norm {s.canary_norm:g} C, plant `{s.plant}`. Record level '
              f'(dp_sgd, cross-silo): {r.num_clients} clients x {r.per_client} rows (+ '
              f'{r.canaries_per_client} canary rows), B = {r.batch_size}, E = {r.epochs}, T = '
              f'{r.num_rounds}, MLP {tuple(r.hidden)}, {r.canaries} gradient and '
              f'{r.input_canaries} input canaries a row. Client level (cross-device): '
              f'{c.num_clients} clients x {c.per_client} rows, {c.participation:g} of them a '
              f'round, canaries at most {c.canary_share:g} of the participants, B = '
              f'{c.batch_size}, E = {c.epochs}, T = {c.num_rounds}, MLP {tuple(c.hidden)}, '
              f'{c.canaries} canary clients a row.', '']
  lines += ['| ' + ' | '.join(_COLUMNS) + ' |', '|' + '---|' * len(_COLUMNS)]
  for p in stored:
    q, m = p['params'], p['metrics']
    audited = _f(m.get('dp_epsilon'))
    if m.get('dp_epsilon_per_round') is not None:
      audited += f" ({_f(m.get('dp_epsilon_per_round'))} a round)"
    verdict = str(m.get('verdict', '-'))
    if verdict == 'violation':
      verdict = '**VIOLATION**'
    elif verdict == 'cannot refute':
      need = int(float(m.get('canaries_needed', -1)))
      verdict += f" (needs {need:,})" if need > 0 else ' (no count up to 2^24)'
    estimate = _f(m.get('epsilon_estimate'))
    if str(m.get('estimate_method', '')).startswith('subsampled'):
      estimate += ' (fit)'
    lines.append('| ' + ' | '.join([
        q['defense'], q['sampling'], q['canary'], q['threat'], _f(q['claimed_epsilon']),
        audited, str(m.get('dp_unit', '-')), str(m.get('dp_relation', '-')),
        str(m.get('dp_adversary', '-')), str(m.get('counted_bounds', '-')),
        _f(m.get('best_bound')), _f(m.get('max_certifiable')), _f(m.get('simulated_bound')),
        estimate,
        f"{m.get('bounding_canaries', '-')} / {m.get('num_canaries', '-')}; "
        f"{m.get('replicates', '-')}", _f(m.get('one_run_delta_term'), 3),
        _ci(m, 'test_accuracy', 3), _ci(m, 'accuracy_change', 3), verdict,
        f"`{m.get('audited_pipeline', '-')}`",
        _labelled(m, 'certified_free', 'certified_free_test'),
        _labelled(m, 'certified_gaussian', 'certified_gaussian_test'),
        str(m.get('reach_tests', '-')),
        '-' if m.get('verdict_tests') is None else
        f"{m['verdict_tests']} ({m.get('verdict_assumes', '-')})",
        _power(m), _optimum(m)]) + ' |')
  return '\n'.join(lines) + '\n'


def claims_figure(stored: list[dict], workdir: str) -> str | None:
  """Claimed (audited) vs empirical epsilon per series, one panel per threat."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  if not stored:
    return None
  threats = list(dict.fromkeys(p['params']['threat'] for p in stored))
  series = list(dict.fromkeys(_series(p) for p in stored))
  # The axes hold every finite claim and every finite certified bound: a violation (a bound
  # above y = x) is never drawn outside them.
  finite = [float(p['metrics'][k]) for p in stored for k in ('dp_epsilon', 'best_bound')
            if math.isfinite(float(p['metrics'].get(k, math.nan)))]
  top = 1.1 * max(finite + [1.0])
  # Capped at the top; a missing value (NaN: ldp_sgd's estimate) stays missing, not the top.
  cap = lambda v: v if math.isnan(v) else min(top, v)
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
      # other: each series is dodged sideways, 1.5% of the axis apart, the whole fan within
      # 6% of it (many series are packed closer rather than moved far from their claim).
      step = min(0.015, 0.06 / max(len(series) - 1, 1)) * top
      dodge = (i - (len(series) - 1) / 2) * step
      x = [float(p['metrics']['dp_epsilon']) + dodge for p in pts]
      c, mk = colors[i % len(colors)], markers[i % len(markers)]
      ax.plot(x, [float(p['metrics']['best_bound']) for p in pts], marker=mk, color=c, lw=1,
              label=f'{name}: certified bound')
      # A series of missing values (no estimate: ldp_sgd, a fit the moments do not determine)
      # is not drawn, nor named in the legend.
      est = [cap(float(p['metrics'].get('epsilon_estimate', math.nan))) for p in pts]
      if any(math.isfinite(v) for v in est):
        ax.plot(x, est, marker=mk, color=c, lw=0, mfc='none', label=f'{name}: estimate')
      reach = [cap(float(p['metrics'].get('max_certifiable', math.nan))) for p in pts]
      if any(math.isfinite(v) for v in reach):
        ax.plot(x, reach, marker='x', color=c, lw=0, label=f'{name}: perfect attack (capped)')
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_title(f'threat: {threat}', fontsize=10)
    ax.set_xlabel('claimed epsilon that ran (nats; series dodged)')
    ax.set_ylabel('empirical epsilon (nats)')
  fig.suptitle('Training audit: certified lower bounds (filled), estimates (hollow) and what '
               'a perfect attack on the same canaries certifies (x) vs the claim', fontsize=10)
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
