"""`pipelines.training_audit_figures` in process, on stored points written out by hand.

The smoke run (test_training_audit.py) renders the real table and figure in a subprocess; these
tests pin what each cell and each plotted point must be, so that a wrong column, series, dodge
or axis limit fails here.
"""

from __future__ import annotations

import math
import os
import types

import matplotlib.pyplot as plt
import pytest

from configs import digits
from fl_privacy.pipelines import training_audit as ta
from fl_privacy.pipelines import training_audit_figures as taf
from fl_privacy.report import figures

COLUMNS = ['defense', 'sampling', 'canary', 'threat', 'eps claimed', 'eps audited', 'unit',
           'relation', 'adversary', 'eps 1-run', 'eps 1-run f-DP', 'counted', 'eps estimate',
           'canaries (in/out)', 'test acc', 'violation', 'audited']


def _point(defense, sampling, canary, threat, claim, *, audited=None, bound=0.5,
           estimate=1.0, violation=0.0, **extra):
  metrics = dict(dp_epsilon=claim if audited is None else audited, dp_unit='client',
                 dp_relation='replace_one', dp_adversary='server', epsilon_one_run=bound,
                 epsilon_one_run_fdp=bound + 0.125, counted_bounds='epsilon_one_run,profile',
                 epsilon_estimate=estimate, num_canaries=10, n_in=4, n_out=6,
                 test_accuracy=0.91234, privacy_violation=violation, best_bound=bound,
                 audited_pipeline=ta.AUDITED)
  metrics.update(extra)
  return dict(params=dict(defense=defense, sampling=sampling, claimed_epsilon=claim,
                          canary=canary, threat=threat), metrics=metrics)


def test_number_format():
  assert taf._f(1.234) == '1.23'
  assert taf._f(1.23456, 3) == '1.235'
  assert taf._f('2') == '2.00'
  assert taf._f(float('nan')) == '-' and taf._f('nan') == '-'
  assert taf._f(float('inf')) == 'inf'
  assert taf._f(None) == 'None' and taf._f('abc') == 'abc'
  assert taf._f(0) == '0.00'


def _cells(line):
  assert line.startswith('| ') and line.endswith(' |'), line
  return line[2:-2].split(' | ')


def test_table_has_one_exact_row_per_point_with_the_config_line():
  config = digits.get_config()
  s = config.training_audit
  stored = [
      _point('update_dp', 'none', 'client', 'all_iterates', 8.0, audited=8.5, bound=9.25,
             estimate=float('nan'), violation=1.0),
      _point('dp_sgd', 'poisson', 'gradient', 'last_iterate', 2.0, bound=0.0,
             estimate=0.3333, dp_unit='record', dp_relation='add_remove', n_in=3, n_out=7,
             test_accuracy=float('nan')),
  ]
  lines = taf.table_markdown(stored, config).splitlines()
  assert lines[0] == '# Training audit: canaries inside the trainings that run'
  # The sentence every run's table carries: what each row audited and what its numbers are.
  assert lines[1] == '' and lines[2] == (
      'Every row audited the pipeline the experiments run (`fl.rounds.run` with the defense '
      'configured by `defenses.configured.configure`), one training per (defense, sampling, '
      'claim, canary kind), both threats scored on the same training. Bounds are one-run '
      'lower bounds (Steinke et al. 2023; f-DP: Mahloujifar et al. 2024) at family-wise '
      'confidence over the counted ones; the estimate is Andrew et al. 2024\'s Gaussian fit '
      '(not a bound).')
  assert lines[3] == ''
  assert lines[4] == (
      f'delta {s.delta:g}, confidence {s.confidence:g}, {s.num_clients} clients x '
      f'{s.per_client} rows, T = {s.num_rounds}, E = {s.epochs}, B = {s.batch_size}, '
      f'canary norm {s.canary_norm:g} C, plant `{s.plant}`.')
  assert lines[5] == ''
  assert _cells(lines[6]) == COLUMNS
  assert lines[7] == '|' + '---|' * len(COLUMNS)
  assert len(lines) == 10
  assert _cells(lines[8]) == [
      'update_dp', 'none', 'client', 'all_iterates', '8.00', '8.50', 'client', 'replace_one',
      'server', '9.25', '9.38', 'epsilon_one_run,profile', '-', '10 (4/6)', '0.912',
      '**YES**', f'`{ta.AUDITED}`']
  assert _cells(lines[9]) == [
      'dp_sgd', 'poisson', 'gradient', 'last_iterate', '2.00', '2.00', 'record', 'add_remove',
      'server', '0.00', '0.12', 'epsilon_one_run,profile', '0.33', '10 (3/7)', '-', 'no',
      f'`{ta.AUDITED}`']
  # Without a config: no settings line; the text ends with a newline.
  bare = taf.table_markdown(stored)
  assert bare.endswith('|\n') and 'delta ' not in bare
  assert len(bare.splitlines()) == len(lines) - 2


def test_table_marks_missing_metrics():
  p = _point('central_dp', 'none', 'client', 'all_iterates', 2.0)
  for k in ('dp_unit', 'dp_relation', 'dp_adversary', 'counted_bounds', 'num_canaries',
            'n_in', 'n_out', 'privacy_violation', 'audited_pipeline'):
    del p['metrics'][k]
  row = _cells(taf.table_markdown([p]).splitlines()[-1])
  assert row[6:9] == ['-', '-', '-'] and row[11] == '-'
  assert row[13] == '- (-/-)' and row[15] == 'no' and row[16] == '`-`'


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


def test_claims_figure_plots_each_series_sorted_dodged_and_clipped(drawn):
  a, b, c = 'dp_sgd poisson gradient', 'central_dp none client', 'weak_dp none client'
  stored = [
      _point('dp_sgd', 'poisson', 'gradient', 'all_iterates', 8.0, bound=3.0, estimate=50.0),
      _point('dp_sgd', 'poisson', 'gradient', 'all_iterates', 2.0, bound=0.25, estimate=1.5),
      _point('dp_sgd', 'poisson', 'gradient', 'last_iterate', 2.0, bound=0.0, estimate=0.5),
      _point('central_dp', 'none', 'client', 'all_iterates', 2.0, audited=2.5, bound=1.0,
             estimate=2.25),
      # An unbounded claim does not set the axes.
      _point('central_dp', 'none', 'client', 'all_iterates', 4.0, audited=float('inf'),
             bound=0.5, estimate=0.75),
      # A third series, only under the last iterate, after one that is absent there.
      _point('weak_dp', 'none', 'client', 'last_iterate', 4.0, bound=2.0, estimate=3.0),
  ]
  path = taf.claims_figure(stored, '/some/run')
  assert len(drawn) == 1
  fig, workdir, name = drawn[0]
  assert (workdir, name, path) == ('/some/run', 'fig_training_audit',
                                   '/some/run/fig_training_audit.png')
  assert not plt.fignum_exists(fig.number)  # closed after saving
  top = 1.1 * 8.0
  axes = fig.axes[:2]  # then the figure's legend
  assert list(fig.get_size_inches()) == pytest.approx([10.0, 4.2])
  assert [ax.get_title() for ax in axes] == ['threat: all_iterates', 'threat: last_iterate']
  for ax in axes:
    assert ax.title.get_fontsize() == 10
    assert ax.get_xlim() == pytest.approx((0, top)) and ax.get_ylim() == pytest.approx((0, top))
    diag = _line(ax, 'empirical = claimed (y = x)')
    assert list(diag.get_xdata()) == [0, top] and list(diag.get_ydata()) == [0, top]
    assert diag.get_color() == 'k' and diag.get_linestyle() == '--'
    assert diag.get_linewidth() == 1
    assert ax.get_xlabel() == ('claimed epsilon of the training that ran (nats; series dodged '
                               'sideways)')
    assert ax.get_ylabel() == 'empirical epsilon (nats)'
  # Series i keeps the i-th colour of the style's cycle and the i-th marker in every panel.
  cycle = plt.rcParams['axes.prop_cycle'].by_key()['color']
  for ax in axes:
    for i, name in enumerate((a, b, c)):
      for kind in ('one-run bound', 'estimate'):
        for l in ax.get_lines():
          if l.get_label() == f'{name}: {kind}':
            assert l.get_color() == cycle[i] and l.get_marker() == 'osD'[i], (name, kind)
            assert l.get_linewidth() == (1 if kind == 'one-run bound' else 0)
  dodge = {a: -1 * 0.015 * top, b: 0.0, c: 0.015 * top}
  all_it, last_it = axes
  bound = _line(all_it, f'{a}: one-run bound')
  assert list(bound.get_xdata()) == pytest.approx([2.0 + dodge[a], 8.0 + dodge[a]])
  assert list(bound.get_ydata()) == pytest.approx([0.25, 3.0])
  est = _line(all_it, f'{a}: estimate')
  assert list(est.get_xdata()) == pytest.approx([2.0 + dodge[a], 8.0 + dodge[a]])
  assert list(est.get_ydata()) == pytest.approx([1.5, top])  # 50 clipped to the top
  assert est.get_linewidth() == 0 and est.get_markerfacecolor() == 'none'
  assert bound.get_linewidth() > 0 and bound.get_markerfacecolor() != 'none'
  assert est.get_color() == bound.get_color() and est.get_marker() == bound.get_marker()
  other = _line(all_it, f'{b}: one-run bound')
  assert list(other.get_xdata()) == pytest.approx([2.5 + dodge[b], math.inf])
  assert list(other.get_ydata()) == pytest.approx([1.0, 0.5])
  assert list(_line(all_it, f'{b}: estimate').get_ydata()) == pytest.approx([2.25, 0.75])
  assert other.get_color() != bound.get_color() and other.get_marker() != bound.get_marker()
  # The last-iterate panel draws only the series that ran there, with their global dodge.
  assert len(last_it.get_lines()) == 5
  assert list(_line(last_it, f'{a}: one-run bound').get_xdata()) == pytest.approx(
      [2.0 + dodge[a]])
  assert list(_line(last_it, f'{a}: estimate').get_ydata()) == pytest.approx([0.5])
  assert list(_line(last_it, f'{c}: one-run bound').get_xdata()) == pytest.approx(
      [4.0 + dodge[c]])
  assert list(_line(last_it, f'{c}: estimate').get_ydata()) == pytest.approx([3.0])
  assert fig._suptitle.get_text() == ('Training audit: one-run lower bounds (filled) and '
                                      'Gaussian-fit estimates (hollow) vs the claim')
  assert fig._suptitle.get_fontsize() == 10


def test_claims_figure_axes_reach_one_at_small_claims_and_nothing_is_drawn_empty(drawn):
  assert taf.claims_figure([], '/x') is None and not drawn
  taf.claims_figure([_point('weak_dp', 'none', 'client', 'last_iterate', 0.5)], '/x')
  (ax,) = drawn[0][0].axes
  assert ax.get_xlim() == pytest.approx((0, 1.1))
  assert list(_line(ax, 'weak_dp none client: one-run bound').get_xdata()) == [0.5]


def test_write_and_the_pipeline_hook_write_table_and_figure(tmp_path):
  config = digits.get_config()
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
