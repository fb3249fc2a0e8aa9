"""End to end: `python -m experiments.duplicates` on digits, checked against a direct search."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from fl_privacy import data as data_lib
from tests.experiments import cli

REPO = pathlib.Path(__file__).resolve().parents[2]


def _run(workdir, *overrides):
  return subprocess.run(
      [sys.executable, '-m', 'experiments.duplicates', '--config=configs/digits.py:smoke',
       f'--workdir={workdir}', *overrides],
      cwd=REPO, env=cli.env(), capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope='module')
def listing(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('duplicates') / 'run'
  proc = _run(workdir, '--config.dishonest.near_threshold=0.5')
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads((workdir / 'results.json').read_text())
  return workdir, results, json.loads((workdir / 'duplicates.json').read_text())


def test_points_and_files(listing):
  workdir, results, groups = listing
  scopes = {(p['params']['scope'], p['params']['kind']) for p in results['points']}
  assert scopes == {(s, k) for s in ('train', 'test', 'test_in_train')
                    for k in ('exact', 'near')}
  for p in results['points']:
    m = p['metrics']
    assert m['groups'] == len(groups[p['params']['scope']][p['params']['kind']])
    assert 0 <= m['label_mismatch'] <= m['groups'] and m['examples'] >= 2 * m['groups']
  assert (workdir / 'duplicates.txt').read_text().startswith('Duplicates in digits')


def test_near_groups_are_really_close(listing):
  """Every listed near pair lies within the threshold (independent numpy check)."""
  _, _, groups = listing
  train = data_lib.load(dict(name='digits'))['train']
  x = data_lib.to_float(train.x).reshape(len(train), -1).astype(np.float64)
  for g in groups['train']['near']:
    idx = np.asarray(g['indices'])
    d = np.linalg.norm(x[idx][:, None] - x[idx][None], axis=-1)
    np.fill_diagonal(d, np.inf)
    assert np.all(d.min(axis=1) <= 0.5)
    np.testing.assert_array_equal(g['labels'], train.y[idx])
  exact = {tuple(g['indices']) for g in groups['train']['exact']}
  rows = {}
  for i, row in enumerate(train.x.reshape(len(train), -1)):
    rows.setdefault(row.tobytes(), []).append(i)
  assert exact == {tuple(v) for v in rows.values() if len(v) > 1}


def test_bad_split_exits_2(tmp_path):
  workdir = tmp_path / 'never'
  proc = _run(workdir, "--config.dishonest.duplicate_splits=('train', 'holdout')")
  assert proc.returncode == 2
  assert 'config.dishonest.duplicate_splits' in proc.stderr
  assert not os.path.exists(workdir)


def test_the_progress_line_knows_every_point_and_counts_examples(tmp_path):
  # In process, on small synthetic images: the sweep plans its N points (the line shows
  # "point k/N" and an ETA) and the log says what a point counts: examples, not trials.
  import logging  # pylint: disable=g-import-not-at-top
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy import report  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import base  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import duplicates as pipeline  # pylint: disable=g-import-not-at-top
  from fl_privacy.report import progress  # pylint: disable=g-import-not-at-top
  config = digits.get_config('smoke')
  config.data = dict(name='synthetic', num_examples=40, num_classes=2, shape=(4, 4, 1),
                     seed=0, data_dir=None, image_size=None, max_examples=None)
  state = pipeline.prepare(config)
  store = report.ResultsStore(str(tmp_path / 'run'), 'duplicates', config)
  tracker = progress.Progress('duplicates', enabled=False)
  # A handler on absl's own logger: caplog's root handler misses these records once an earlier
  # test in the same process has stopped absl's logger from propagating.
  records = []
  handler = logging.Handler(logging.INFO)
  handler.emit = records.append
  absl_logger = logging.getLogger('absl')
  absl_logger.addHandler(handler)
  level = absl_logger.level
  absl_logger.setLevel(logging.INFO)
  try:
    with progress.activate(tracker):
      base.sweep(pipeline, config, state, store, None)
  finally:
    absl_logger.removeHandler(handler)
    absl_logger.setLevel(level)
  assert tracker.total == len(store.points) == 6 and tracker.finished == 6
  saved = [r.getMessage() for r in records if r.getMessage().startswith('saved ')]
  assert len(saved) == 6 and all(' examples, ' in m and 'trials' not in m for m in saved)
