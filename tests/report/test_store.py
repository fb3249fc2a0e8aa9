"""Tests of the results store: schema, atomic writes, resume, config checks."""

from __future__ import annotations

import csv
import json
import os

import ml_collections
import numpy as np
import pytest

from fl_privacy.eval import stats
from fl_privacy import report
from fl_privacy.report import atomic
from fl_privacy.report import figures
from fl_privacy.report import store as store_lib

SWEEP = [{'epsilon': e, 'mechanism': m} for e in (0.5, 1.0, 2.0)
         for m in ('bitrand', 'ome')]


def _config(chunk_size=100, p=0.1):
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.game = ml_collections.ConfigDict({'chunk_size': chunk_size})
  c.toy = ml_collections.ConfigDict({'p': p, 'sizes': (1, 2)})
  return c


def _metrics(params):
  k = int(params['epsilon'] * 100) + len(params['mechanism'])
  return {**stats.rate('tpr', k, 1000), 'auc': np.float32(0.75), 'count': k}


def _sweep(workdir, config, stop_after=None):
  s = report.ResultsStore(workdir, 'toy', config)
  for i, params in enumerate(SWEEP):
    if stop_after is not None and i == stop_after:
      raise KeyboardInterrupt
    if s.get(params) is None:
      s.add(params, _metrics(params), n_trials=1000, elapsed_s=0.01 * i)
  s.finish()
  return s


def _without_times(path):
  with open(path) as f:
    data = json.load(f)
  # A resumed run's manifest also lists the earlier invocations (`earlier_runs`).
  for key in ('start_time', 'end_time', 'earlier_runs'):
    data['manifest'].pop(key)
  for p in data['points']:
    p.pop('elapsed_s')
  return data


def _csv_rows(path, drop=('elapsed_s',)):
  with open(path) as f:
    return [{k: v for k, v in row.items() if k not in drop}
            for row in csv.DictReader(f)]


def test_schema(tmp_path):
  _sweep(tmp_path, _config())
  with open(tmp_path / 'results.json') as f:
    data = json.load(f)
  assert set(data) == {'experiment', 'config', 'manifest', 'points'}
  assert data['experiment'] == 'toy'
  assert data['config']['toy']['sizes'] == [1, 2]
  m = data['manifest']
  assert {'versions', 'python', 'git_revision', 'devices', 'start_time',
          'end_time'} <= set(m)
  assert {'jax', 'flax', 'optax', 'numpy'} <= set(m['versions'])
  assert m['end_time'] is not None
  assert len(data['points']) == len(SWEEP)
  point = data['points'][0]
  assert set(point) == {'params', 'metrics', 'n_trials', 'elapsed_s'}
  assert set(point['metrics']) == {'tpr', 'tpr_ci_low', 'tpr_ci_high', 'auc',
                                   'count'}
  rows = _csv_rows(tmp_path / 'results.csv', drop=())
  assert len(rows) == len(SWEEP)
  assert list(rows[0])[:2] == ['epsilon', 'mechanism']
  assert list(rows[0])[-2:] == ['n_trials', 'elapsed_s']
  assert float(rows[1]['tpr']) == pytest.approx(point_tpr(data, 1))


def point_tpr(data, i):
  return data['points'][i]['metrics']['tpr']


def test_resume_after_interrupt_gives_same_files(tmp_path):
  full, resumed = tmp_path / 'full', tmp_path / 'resumed'
  _sweep(full, _config())
  with pytest.raises(KeyboardInterrupt):
    _sweep(resumed, _config(), stop_after=4)
  partial = report.ResultsStore(resumed, 'toy', _config())
  assert len(partial.points) == 4
  # A resumed run may change chunk_size: it does not change results.
  _sweep(resumed, _config(chunk_size=7))
  a, b = _without_times(full / 'results.json'), _without_times(
      resumed / 'results.json')
  a['config']['game'].pop('chunk_size')
  b['config']['game'].pop('chunk_size')
  assert a == b
  assert _csv_rows(full / 'results.csv') == _csv_rows(resumed / 'results.csv')


def test_resume_keeps_points_and_skips_them(tmp_path):
  first = _sweep(tmp_path, _config())
  again = report.ResultsStore(tmp_path, 'toy', _config())
  assert again.points == first.points
  for params in SWEEP:
    assert again.get(params) is not None


def test_get_matches_after_json_round_trip(tmp_path):
  s = report.ResultsStore(tmp_path, 'toy', _config())
  s.add({'eps': np.float64(0.1), 'dims': (2, 3), 'flag': np.bool_(True)},
        {'x': 1.0}, 10, 0.0)
  again = report.ResultsStore(tmp_path, 'toy', _config())
  assert again.get({'eps': 0.1, 'dims': [2, 3], 'flag': True}) is not None
  assert again.get({'eps': 0.1, 'dims': (2, 3), 'flag': True}) is not None
  assert again.get({'eps': 0.2, 'dims': [2, 3], 'flag': True}) is None
  assert again.get({'eps': 0.1}) is None


def test_add_replaces_point_with_same_params(tmp_path):
  s = report.ResultsStore(tmp_path, 'toy', _config())
  s.add({'a': 1}, {'x': 1.0}, 10, 0.0)
  s.add({'a': 1}, {'x': 2.0}, 20, 0.0)
  assert len(s.points) == 1 and s.get({'a': 1})['metrics']['x'] == 2.0


def test_config_change_refused_and_file_untouched(tmp_path):
  _sweep(tmp_path, _config())
  before = (tmp_path / 'results.json').read_text()
  with pytest.raises(report.ResumeError, match='toy.p'):
    report.ResultsStore(tmp_path, 'toy', _config(p=0.2))
  with pytest.raises(report.ResumeError, match='experiment'):
    report.ResultsStore(tmp_path, 'other', _config())
  assert (tmp_path / 'results.json').read_text() == before


def test_config_differences_ignores_only_resume_safe_fields():
  old = {'game': {'chunk_size': 1}, 'data': {'data_dir': '/a', 'name': 'x'},
         'seed': 0}
  new = {'game': {'chunk_size': 9}, 'data': {'data_dir': '/b', 'name': 'x'},
         'seed': 1}
  assert store_lib.config_differences(old, new) == ['seed']


def test_non_finite_metrics_are_strict_json(tmp_path):
  s = report.ResultsStore(tmp_path, 'toy', _config())
  s.add({'a': 1}, {'eps': float('inf'), 'r': float('nan')}, 10, 0.0)
  text = (tmp_path / 'results.json').read_text()
  data = json.loads(text, parse_constant=lambda c: pytest.fail(c))
  metrics = data['points'][0]['metrics']
  assert metrics == {'eps': 'inf', 'r': 'nan'}
  assert float(metrics['eps']) == float('inf')


def test_nested_params_rejected(tmp_path):
  s = report.ResultsStore(tmp_path, 'toy', _config())
  with pytest.raises(TypeError):
    s.add({'a': {'b': 1}}, {}, 1, 0.0)


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
  path = tmp_path / 'f.txt'
  atomic.atomic_write_text(path, 'old')

  def boom(*args):
    raise OSError('disk full')

  monkeypatch.setattr(os, 'replace', boom)
  with pytest.raises(OSError):
    atomic.atomic_write_text(path, 'new')
  monkeypatch.undo()
  assert path.read_text() == 'old'
  assert os.listdir(tmp_path) == ['f.txt']  # no temp file left behind
  atomic.atomic_write_text(path, 'new')
  assert path.read_text() == 'new'


def test_figure_saved_as_png(tmp_path):
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots()
  ax.plot([0, 1], [0, 1])
  path = figures.save(fig, tmp_path / 'figs', 'roc curve')
  plt.close(fig)
  assert path.endswith('roc_curve.png')
  with open(path, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  assert os.listdir(tmp_path / 'figs') == ['roc_curve.png']
