"""Tests of the progress line and the summary table."""

from __future__ import annotations

import io

import ml_collections

from fl_privacy import report
from fl_privacy.eval import runner
from fl_privacy.report import progress
from fl_privacy.report import summary


class _Clock:

  def __init__(self):
    self.t = 0.0

  def __call__(self):
    return self.t


SPEC = (summary.Table('game', (summary.param('mechanism'), summary.param('epsilon'),
                               summary.rate('adv', 'Adv'), summary.seconds()),
                      where={'part': 'game'}),
        summary.Table('dp', (summary.param('epsilon'), summary.metric('rounds', digits=0)),
                      where={'part': 'dp'}))


def _point(part, eps, **metrics):
  params = {'part': part, 'mechanism': 'bitrand', 'epsilon': eps} if part == 'game' else {
      'part': part, 'epsilon': eps}
  return {'params': params, 'metrics': metrics, 'n_trials': 10, 'elapsed_s': 2.0}


def test_line_counts_points_and_estimates_eta():
  clock, out = _Clock(), io.StringIO()
  p = progress.Progress('ami', enabled=True, stream=out, clock=clock)
  p.plan(4)
  p.point_finished(_point('game', 1.0), computed=False)  # read back: costs nothing
  p.point_started({'mechanism': 'bitrand', 'epsilon': 2.0})
  assert 'point 2/4 (bitrand, 2)' in p.line() and 'ETA' not in p.line()
  clock.t = 10.0
  p.point_finished({'params': {}, 'elapsed_s': 10.0}, computed=True)
  p.point_started({'mechanism': 'bitrand', 'epsilon': 3.0})
  p.chunk(500, 1000, 2.0)
  line = p.line()
  assert 'point 3/4' in line and '500/1,000 trials, 250 trials/s' in line
  # 2 points left at 10 s each, half of the current one done.
  assert p.eta_s() == 15.0 and 'ETA ~15.0 s' in line and 'elapsed 10.0 s' in line
  assert out.getvalue().count('\r') >= 3
  p.chunk(4, 16, 2.0, 'runs')  # a game whose trial is a whole federated run
  assert '4/16 runs, 2 runs/s' in p.line() and 'trials' not in p.line()


def test_disabled_progress_draws_nothing():
  out = io.StringIO()
  p = progress.Progress('ami', enabled=False, stream=out)
  p.plan(2)
  p.point_started({'a': 1})
  p.chunk(1, 2, 1.0)
  p.clear()
  assert out.getvalue() == ''


def test_run_point_reports_to_the_active_progress_and_runner_chunks(tmp_path):
  config = ml_collections.ConfigDict({'seed': 0})
  store = report.ResultsStore(tmp_path, 'toy', config)
  store.add({'i': 0}, {'x': 1.0}, 1, 0.5)
  p = progress.Progress('toy', enabled=False,
                        summary=summary.Table('t', (summary.metric('x'),)))
  seen = []
  with progress.activate(p):
    progress.plan(2)
    report.run_point(store, {'i': 0}, lambda: ({'x': 9.0}, 1))
    report.run_point(store, {'i': 1}, lambda: (
        seen.append(runner._CHUNK_LISTENERS[-1]) or {'x': 2.0}, 1))  # pylint: disable=protected-access
  assert p.total == 2 and p.finished == 2 and len(p.computed) == 1
  assert [r['params'] for r in p.resumed] == [{'i': 0}]
  assert seen == [p.chunk] and p.chunk not in runner._CHUNK_LISTENERS  # pylint: disable=protected-access
  assert progress.active() is None
  assert p.headline(store.get({'i': 1})) == 'x 2.000'


def test_summary_table_marks_resumed_points_and_groups_by_part():
  points = [_point('game', None, adv=0.9, adv_ci_low=0.85, adv_ci_high=0.95),
            _point('game', 2.0, adv=0.5, adv_ci_low=0.4, adv_ci_high=0.6),
            _point('dp', 4.0, rounds=17), _point('other', 1.0)]
  text = summary.render(SPEC, points, resumed=points[:1])
  lines = text.splitlines()
  assert lines[0] == 'game (2 point(s))'
  assert lines[3].startswith('*') and '0.900 [0.850, 0.950]' in lines[3]
  assert '-' in lines[3].split()  # epsilon None
  assert '0.500 [0.400, 0.600]' in lines[4] and not lines[4].startswith('*')
  assert 'dp (1 point(s))' in text and '17' in text
  assert '1 other point(s)' in text and 'read back' in text


def test_summary_formats_bounds_flags_and_missing_values():
  p = {'params': {}, 'metrics': {'eps_emp': 'inf', 'eps_emp_lower': 7.2156, 'v': 1.0}}
  assert summary.bound('eps_emp', 'eps_emp_lower').cell(p) == 'inf [7.22]'
  assert summary.flag('v', 'violation').cell(p) == 'YES'
  assert summary.metric('absent').cell(p) == '-'
  q = {'params': {}, 'metrics': {'dp_epsilon': 'nan', 'x': float('nan'), 'e': 4.0}}
  assert summary.metric('x').cell(q) == 'nan'
  assert summary.metric('dp_epsilon', nan='-').cell(q) == '-'
  assert summary.metric('e', nan='-', digits=2).cell(q) == '4.00'
  assert summary.format_duration(3725) == '1:02:05'
  assert summary.format_duration(65) == '1:05'


def test_outputs_lists_results_figures_and_folders(tmp_path):
  for name in ('results.json', 'results.csv', 'a.png', 'table2.md'):
    (tmp_path / name).write_text('x')
  (tmp_path / 'draws').mkdir()
  (tmp_path / 'draws' / 'd.npz').write_text('x')
  text = summary.outputs(str(tmp_path))
  assert 'results: results.json, results.csv' in text
  assert 'figures: a.png' in text and 'table2.md' in text and 'draws/ (1 files)' in text
