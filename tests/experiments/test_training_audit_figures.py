"""`pipelines.training_audit_figures` in process, on stored points written out by hand.

The smoke run (test_training_audit.py) renders the real table and figure in a subprocess; these
tests pin what each cell and each plotted point must be, so that a wrong column, verdict text,
interval, series, dodge or axis limit fails here.
"""

from __future__ import annotations

# pylint: disable=protected-access

import math
import os
import types

import matplotlib.pyplot as plt
import pytest

from configs import digits
from fl_privacy.pipelines import training_audit as ta
from fl_privacy.pipelines import training_audit_figures as taf
from fl_privacy.report import figures
from tests import figure_checks

COLUMNS = ['defense', 'sampling', 'canary', 'threat', 'eps claimed', 'eps audited', 'unit',
           'relation', 'adversary', 'counted', 'eps best counted', 'eps reachable',
           'simulated optimal', 'eps estimate', 'canaries (bounding / all; trainings)',
           '2 m delta', 'test acc', 'acc change vs twin', 'verdict', 'audited',
           'eps certified, assumes none (test)', 'eps if Gaussian (test)', 'refutable by',
           'verdict by (assumes)', 'detects noise x at 95% (hits; eps planted)',
           'simulated optimum [95%] (draws)']
LABELS = ['-'] * 6   # a row stored without the labels and the power
NAN = float('nan')


def _point(defense, sampling, canary, threat, claim, *, audited=None, bound=0.5,
           estimate=1.0, reach=4.0, verdict='no violation', **extra):
  metrics = dict(
      dp_epsilon=claim if audited is None else audited, dp_unit='client',
      dp_relation='replace_one', dp_adversary='server',
      counted_bounds='epsilon_one_run,epsilon_cp,profile', best_bound=bound,
      max_certifiable=reach, epsilon_estimate=estimate, estimate_method='gaussian_fit',
      bounding_canaries=100, num_canaries=200, replicates=4, one_run_delta_term=0.0041,
      test_accuracy=0.91234, test_accuracy_ci_low=0.9, test_accuracy_ci_high=0.92468,
      twin_accuracy=0.93, accuracy_change=-0.0126, accuracy_change_ci_low=-0.02,
      accuracy_change_ci_high=-0.005, privacy_violation=float(verdict == 'violation'),
      can_refute=float(verdict != 'cannot refute'), canaries_needed=0, verdict=verdict,
      audited_pipeline=ta.AUDITED)
  metrics.update(extra)
  return dict(params=dict(defense=defense, sampling=sampling, claimed_epsilon=claim,
                          canary=canary, threat=threat), metrics=metrics)


def test_number_format():
  assert taf._f(1.234) == '1.23'
  assert taf._f(1.23456, 3) == '1.235'
  assert taf._f('2') == '2.00'
  assert taf._f(NAN) == '-' and taf._f('nan') == '-' and taf._f(None) == '-'
  assert taf._f(float('inf')) == 'inf'
  assert taf._f('abc') == 'abc'
  assert taf._f(0) == '0.00'


def test_intervals_show_the_mean_and_the_bounds_only_where_both_are_known():
  m = dict(test_accuracy=0.91234, test_accuracy_ci_low=0.9, test_accuracy_ci_high=0.92468)
  assert taf._ci(m, 'test_accuracy', 3) == '0.912 [0.900, 0.925]'
  assert taf._ci(m, 'test_accuracy', 2) == '0.91 [0.90, 0.92]'
  # No interval from a single replicate (NaN), none stored, or no value at all.
  assert taf._ci(dict(m, test_accuracy_ci_low=NAN, test_accuracy_ci_high=NAN),
                 'test_accuracy', 3) == '0.912'
  assert taf._ci({'test_accuracy': 0.5}, 'test_accuracy', 3) == '0.500'
  assert taf._ci({'test_accuracy': 0.5, 'test_accuracy_ci_low': 0.4}, 'test_accuracy',
                 3) == '0.500'
  assert taf._ci({}, 'test_accuracy', 3) == '-'
  assert taf._ci({'test_accuracy': None}, 'test_accuracy', 3) == '-'
  assert taf._ci({'accuracy_change': NAN}, 'accuracy_change', 3) == '-'
  assert taf._ci(dict(accuracy_change=-0.0126, accuracy_change_ci_low=-0.02,
                      accuracy_change_ci_high=-0.005), 'accuracy_change', 3) == (
                          '-0.013 [-0.020, -0.005]')


def _cells(line):
  assert line.startswith('| ') and line.endswith(' |'), line
  return line[2:-2].split(' | ')


def _config():
  config = digits.get_config()
  s = config.training_audit
  s.delta, s.confidence, s.accountant, s.canary_norm, s.plant = 2e-5, 0.9, 'pld', 3.0, 'none'
  s.record.update(num_clients=7, per_client=50, canaries_per_client=5, batch_size=10,
                  epochs=2, num_rounds=3, hidden=(16, 8), canaries=700, input_canaries=70)
  s.client.update(num_clients=300, per_client=2, participation=0.25, canary_share=0.2,
                  batch_size=1, epochs=1, num_rounds=6, hidden=(20,), canaries=120)
  return config


def test_table_has_one_exact_row_per_point_with_the_config_line():
  stored = [
      _point('update_dp', 'none', 'client', 'all_iterates', 8.0, audited=8.5, bound=9.25,
             estimate=NAN, reach=12.0, verdict='violation', simulated_bound=10.0,
             counted_bounds='epsilon_one_run,epsilon_one_run_fdp,epsilon_cp,epsilon_gdp,'
             'epsilon_gdp_midpoint,profile'),
      _point('dp_sgd', 'poisson', 'gradient', 'all_steps', 2.0, bound=0.0, estimate=2.3456,
             estimate_method='subsampled_gaussian_fit (pld)', dp_unit='record',
             dp_relation='add_remove', reach=1.5, verdict='cannot refute',
             canaries_needed=12345, test_accuracy_ci_low=NAN, test_accuracy_ci_high=NAN,
             accuracy_change=NAN, accuracy_change_ci_low=NAN, accuracy_change_ci_high=NAN),
      _point('weak_dp', 'none', 'client', 'last_iterate', 2.0, audited=2.9415,
             dp_epsilon_per_round=2.0, dp_adversary='aggregate', reach=1.0,
             verdict='cannot refute', canaries_needed=-1, bound=0.25,
             counted_bounds='epsilon_one_run,epsilon_one_run_fdp'),
  ]
  lines = taf.table_markdown(stored, _config()).splitlines()
  assert lines[0] == '# Training audit: canaries inside the trainings that run'
  # The sentence every run's table carries: what each row audited and what its numbers are.
  assert lines[1] == '' and lines[2].startswith(
      'Every row audited the pipeline the experiments run (`fl.rounds.run` with the defense '
      'configured by `defenses.configured.configure`), replicate trainings per (defense, '
      'sampling, claim, canary kind), every threat scored on the same trainings.')
  for words in ('family-wise confidence', '"reachable" is what a perfect attack',
                'cannot refute it', 'not a bound'):
    assert words in lines[2], words
  assert lines[3] == ''
  assert lines[4] == (
      'delta 2e-05, confidence 0.9 (family-wise), accountant pld, canary norm 3 C, plant '
      '`none`. Record level (dp_sgd, cross-silo): 7 clients x 50 rows (+ 5 canary rows), '
      'B = 10, E = 2, T = 3, MLP (16, 8), 700 gradient and 70 input canaries a row. Client '
      'level (cross-device): 300 clients x 2 rows, 0.25 of them a round, canaries at most '
      '0.2 of the participants, B = 1, E = 1, T = 6, MLP (20,), 120 canary clients a row.')
  assert lines[5] == ''
  assert _cells(lines[6]) == COLUMNS
  assert lines[7] == '|' + '---|' * len(COLUMNS)
  assert len(lines) == 8 + len(stored)
  audited = f'`{ta.AUDITED}`'
  assert _cells(lines[8]) == [
      'update_dp', 'none', 'client', 'all_iterates', '8.00', '8.50', 'client', 'replace_one',
      'server', 'epsilon_one_run,epsilon_one_run_fdp,epsilon_cp,epsilon_gdp,'
      'epsilon_gdp_midpoint,profile', '9.25', '12.00', '10.00', '-', '100 / 200; 4', '0.004',
      '0.912 [0.900, 0.925]', '-0.013 [-0.020, -0.005]', '**VIOLATION**', audited] + LABELS
  # A Poisson all_steps row's estimate is the subsampled fit; no simulated curve: '-'.
  assert _cells(lines[9]) == [
      'dp_sgd', 'poisson', 'gradient', 'all_steps', '2.00', '2.00', 'record', 'add_remove',
      'server', 'epsilon_one_run,epsilon_cp,profile', '0.00', '1.50', '-', '2.35 (fit)',
      '100 / 200; 4', '0.004', '0.912', '-', 'cannot refute (needs 12,345)', audited] + LABELS
  # weak_dp: audited composed over the rounds, its per-round claim beside it.
  assert _cells(lines[10]) == [
      'weak_dp', 'none', 'client', 'last_iterate', '2.00', '2.94 (2.00 a round)', 'client',
      'replace_one', 'aggregate', 'epsilon_one_run,epsilon_one_run_fdp', '0.25', '1.00', '-',
      '1.00', '100 / 200; 4', '0.004', '0.912 [0.900, 0.925]', '-0.013 [-0.020, -0.005]',
      'cannot refute (no count up to 2^24)', audited] + LABELS
  # Without a config: no settings line; the text ends with a newline.
  bare = taf.table_markdown(stored)
  assert bare.endswith('|\n') and 'delta 2e-05' not in bare
  assert bare.splitlines()[4:] == lines[6:]


def test_the_labels_power_and_optimum_cells():
  p = _point('dp_sgd', 'shuffle', 'gradient', 'all_steps', 8.0, bound=7.14,
             certified_free=2.81, certified_free_test='epsilon_cp', certified_gaussian=7.14,
             certified_gaussian_test='epsilon_gdp_midpoint', reach_tests='epsilon_cp,profile',
             verdict_tests='epsilon_cp,profile', verdict_assumes='none',
             power_model="the row's statistic", power_factor=0.9, power_hits=20,
             power_draws=20, power_planted_epsilon=9.3456, simulated_bound=6.99,
             simulated_bound_ci_low=6.5, simulated_bound_ci_high=7.25, simulated_draws=20)
  row = _cells(taf.table_markdown([p]).splitlines()[-1])
  assert row[-6:] == ['2.81 (epsilon_cp)', '7.14 (epsilon_gdp_midpoint)',
                      'epsilon_cp,profile', 'epsilon_cp,profile (none)', '0.90x (20/20; 9.35)',
                      '6.99 [6.50, 7.25] (20)']
  p['metrics'].update(power_factor=NAN, power_next_factor=0.1, power_next_hits=3,
                      simulated_draws=None)
  row = _cells(taf.table_markdown([p]).splitlines()[-1])
  assert row[-2:] == ['none (next 0.10x: 3/20)', '-']
  p['metrics'] = dict(p['metrics'], power_model='not simulated', power_draws=None)
  assert _cells(taf.table_markdown([p]).splitlines()[-1])[-2] == 'not simulated'


def test_table_marks_missing_metrics():
  p = _point('central_dp', 'none', 'client', 'side_channel', 2.0)
  for k in list(p['metrics']):
    if k != 'dp_epsilon':
      del p['metrics'][k]
  row = _cells(taf.table_markdown([p]).splitlines()[-1])
  assert row == ['central_dp', 'none', 'client', 'side_channel', '2.00', '2.00', '-', '-', '-',
                 '-', '-', '-', '-', '-', '- / -; -', '-', '-', '-', '-', '`-`'] + LABELS
  # NaN reads as missing too.
  p['metrics'].update(best_bound=NAN, max_certifiable=None, test_accuracy=NAN,
                      simulated_bound=NAN, one_run_delta_term=None)
  row = _cells(taf.table_markdown([p]).splitlines()[-1])
  assert row[10:14] == ['-', '-', '-', '-'] and row[15:17] == ['-', '-']


@pytest.fixture
def drawn(monkeypatch):
  """Runs `claims_figure` with `figures.save` recording (fig, workdir, name)."""
  calls = []

  def save(fig, workdir, name, **kw):
    del kw
    calls.append((fig, workdir, name))
    return f'{workdir}/{name}.png'

  monkeypatch.setattr(figures, 'save', save)
  return calls


def _line(ax, label):
  found = [l for l in ax.get_lines() if l.get_label() == label]
  assert len(found) == 1, (label, [l.get_label() for l in ax.get_lines()])
  return found[0]


KINDS = ('certified bound', 'estimate', 'perfect attack (capped)')


def _ys(line):
  return [float(v) for v in line.get_ydata()]


def test_claims_figure_plots_each_series_sorted_dodged_and_capped(drawn):
  a, b, c = 'dp_sgd poisson gradient', 'central_dp none client', 'ldp_sgd none client'
  stored = [
      _point('dp_sgd', 'poisson', 'gradient', 'all_iterates', 8.0, bound=3.0, estimate=50.0,
             reach=20.0),
      _point('dp_sgd', 'poisson', 'gradient', 'all_iterates', 2.0, bound=0.25, estimate=1.5,
             reach=1.75),
      _point('dp_sgd', 'poisson', 'gradient', 'last_iterate', 2.0, bound=0.0, estimate=0.5),
      _point('central_dp', 'none', 'client', 'all_iterates', 2.0, audited=2.5, bound=1.0,
             estimate=2.25),
      # An unbounded claim does not set the axes.
      _point('central_dp', 'none', 'client', 'all_iterates', 4.0, audited=float('inf'),
             bound=0.5, estimate=0.75),
      # A third series, only under the last iterate, after one that is absent there; an
      # estimate that is not one (ldp_sgd's NaN) and a missing reach stay missing.
      _point('ldp_sgd', 'none', 'client', 'last_iterate', 4.0, bound=2.0, estimate=NAN,
             reach=None),
  ]
  del stored[-1]['metrics']['max_certifiable']
  path = taf.claims_figure(stored, '/some/run')
  assert len(drawn) == 1
  fig, workdir, name = drawn[0]
  assert (workdir, name, path) == ('/some/run', 'fig_training_audit',
                                   '/some/run/fig_training_audit.png')
  assert not plt.fignum_exists(fig.number)  # closed after saving
  top = 1.1 * 8.0
  axes = fig.axes
  assert len(axes) == 2
  assert list(fig.get_size_inches()) == pytest.approx([10.0, 4.2])
  assert [ax.get_title() for ax in axes] == ['threat: all_iterates', 'threat: last_iterate']
  for ax in axes:
    assert ax.title.get_fontsize() == 10
    assert ax.get_xlim() == pytest.approx((0, top)) and ax.get_ylim() == pytest.approx((0, top))
    diag = _line(ax, 'empirical = claimed (y = x)')
    assert list(diag.get_xdata()) == [0, top] and list(diag.get_ydata()) == [0, top]
    assert diag.get_color() == 'k' and diag.get_linestyle() == '--'
    assert diag.get_linewidth() == 1
    assert ax.get_xlabel() == 'claimed epsilon that ran (nats; series dodged)'
    assert ax.get_ylabel() == 'empirical epsilon (nats)'
  # Series i keeps the i-th colour of the style's cycle and the i-th marker in every panel;
  # its bound is a line of filled markers, its estimate hollow markers, its reach crosses.
  cycle = plt.rcParams['axes.prop_cycle'].by_key()['color']
  for ax in axes:
    for i, series in enumerate((a, b, c)):
      for l in ax.get_lines():
        if l.get_label().startswith(f'{series}: '):
          kind = l.get_label()[len(series) + 2:]
          assert kind in KINDS, l.get_label()
          assert l.get_color() == cycle[i], l.get_label()
          assert l.get_marker() == ('x' if kind == KINDS[2] else 'osD'[i]), l.get_label()
          assert l.get_linewidth() == (1 if kind == KINDS[0] else 0), l.get_label()
          assert (l.get_markerfacecolor() == 'none') == (kind == KINDS[1]), l.get_label()
  dodge = {a: -1 * 0.015 * top, b: 0.0, c: 0.015 * top}
  all_it, last_it = axes
  # Sorted by the claim, dodged sideways; the estimate and the reach capped at the top.
  for kind, want in zip(KINDS, ([0.25, 3.0], [1.5, top], [1.75, top])):
    line = _line(all_it, f'{a}: {kind}')
    assert list(line.get_xdata()) == pytest.approx([2.0 + dodge[a], 8.0 + dodge[a]])
    assert _ys(line) == pytest.approx(want), kind
  other = _line(all_it, f'{b}: certified bound')
  assert list(other.get_xdata()) == pytest.approx([2.5 + dodge[b], math.inf])
  assert _ys(other) == pytest.approx([1.0, 0.5])
  assert _ys(_line(all_it, f'{b}: estimate')) == pytest.approx([2.25, 0.75])
  assert _ys(_line(all_it, f'{b}: {KINDS[2]}')) == pytest.approx([4.0, 4.0])
  # The last-iterate panel draws only the series that ran there, with their global dodge;
  # ldp_sgd's missing estimate and reach are neither drawn (least of all at the top) nor named.
  assert sorted(l.get_label() for l in last_it.get_lines()) == sorted(
      ['empirical = claimed (y = x)', f'{c}: certified bound'] + [f'{a}: {k}' for k in KINDS])
  assert list(_line(last_it, f'{a}: certified bound').get_xdata()) == pytest.approx(
      [2.0 + dodge[a]])
  assert _ys(_line(last_it, f'{a}: estimate')) == pytest.approx([0.5])
  assert list(_line(last_it, f'{c}: certified bound').get_xdata()) == pytest.approx(
      [4.0 + dodge[c]])
  assert _ys(_line(last_it, f'{c}: certified bound')) == pytest.approx([2.0])
  assert fig._suptitle.get_text() == (
      'Training audit: certified lower bounds (filled), estimates (hollow) and what a perfect '
      'attack on the same canaries certifies (x) vs the claim')
  assert fig._suptitle.get_fontsize() == 10


def test_claims_figure_keeps_a_violation_inside_the_axes(drawn):
  # A certified bound above the claim (the figure's point: above y = x) stays on the figure.
  taf.claims_figure([_point('update_dp', 'none', 'client', 'all_iterates', 2.0, bound=3.0,
                            reach=30.0, verdict='violation')], '/x')
  (ax,) = drawn[0][0].axes
  assert ax.get_ylim() == pytest.approx((0, 3.3)) and ax.get_xlim() == pytest.approx((0, 3.3))
  assert _ys(_line(ax, 'update_dp none client: certified bound')) == [3.0]
  assert _ys(_line(ax, 'update_dp none client: perfect attack (capped)')) == pytest.approx(
      [3.3])


def test_claims_figure_axes_reach_one_at_small_claims_and_nothing_is_drawn_empty(drawn):
  assert taf.claims_figure([], '/x') is None and not drawn
  taf.claims_figure([_point('weak_dp', 'none', 'client', 'side_channel', 0.5, bound=0.0,
                            reach=0.5)], '/x')
  (ax,) = drawn[0][0].axes
  assert ax.get_xlim() == pytest.approx((0, 1.1)) and ax.get_title() == 'threat: side_channel'
  assert list(_line(ax, 'weak_dp none client: certified bound').get_xdata()) == [0.5]


def test_a_series_with_some_missing_values_keeps_the_others(drawn):
  stored = [_point('dp_sgd', 'poisson', 'gradient', 'all_steps', e, estimate=v)
            for e, v in ((2.0, NAN), (4.0, 3.0))]
  taf.claims_figure(stored, '/x')
  (ax,) = drawn[0][0].axes
  ys = _ys(_line(ax, 'dp_sgd poisson gradient: estimate'))
  assert math.isnan(ys[0]) and ys[1] == 3.0


def test_figure_reads_alone(monkeypatch):
  # (a Poisson fit the moments did not determine: NaN)
  stored = [_point(d, x, k, t, e, bound=0.5 * e, estimate=NAN if t == 'all_steps' else e)
            for d, x, k in (('dp_sgd', 'poisson', 'gradient'), ('central_dp', 'none', 'client'))
            for t in ('all_steps', 'all_iterates', 'last_iterate', 'side_channel')
            for e in (2.0, 8.0) if not (t == 'all_steps' and k == 'client')]
  with figure_checks.capture(monkeypatch) as found:
    taf.claims_figure(stored, '/x')
  assert found == {'fig_training_audit': []}


def test_write_and_the_pipeline_hook_write_table_and_figure(tmp_path):
  config = _config()
  stored = [_point('update_dp', 'none', 'client', 'all_iterates', 2.0),
            _point('update_dp', 'none', 'client', 'last_iterate', 2.0)]
  os.makedirs(tmp_path / 'a')  # the store creates the run folder
  taf.write(stored, str(tmp_path / 'a'), config)
  assert (tmp_path / 'a' / 'training_audit.md').read_text() == taf.table_markdown(
      stored, config)
  assert sorted(os.listdir(tmp_path / 'a')) == ['fig_training_audit.png', 'training_audit.md']
  store = types.SimpleNamespace(points=stored, workdir=str(tmp_path / 'b'))
  os.makedirs(store.workdir)
  ta.figures(config, None, store, None)
  assert (tmp_path / 'b' / 'training_audit.md').read_text() == taf.table_markdown(
      stored, config)
  assert (tmp_path / 'b' / 'fig_training_audit.png').stat().st_size > 0
