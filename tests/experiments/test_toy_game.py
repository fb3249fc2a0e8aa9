"""End-to-end test of the toy Bernoulli game (subprocess, as a user runs it)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))


def _run(*flags, cwd=REPO):
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  return subprocess.run([sys.executable, '-m', 'experiments.toy_game', *flags],
                        env=env, cwd=cwd, capture_output=True, text=True,
                        timeout=120)


def _load(workdir):
  with open(os.path.join(workdir, 'results.json')) as f:
    return json.load(f)


def test_100k_trials_rates_with_intervals(tmp_path):
  workdir = tmp_path / 'toy'
  proc = _run('--config=configs/toy.py', f'--workdir={workdir}')
  assert proc.returncode == 0, proc.stderr[-2000:]
  data = _load(workdir)
  assert data['experiment'] == 'toy_game'
  assert len(data['points']) == len(data['config']['toy']['p'])
  for point in data['points']:
    p, m, n = point['params']['p'], point['metrics'], point['n_trials']
    assert n == 100_000
    assert m['rate_ci_low'] <= m['rate'] <= m['rate_ci_high']
    # Within 5 standard errors of the truth (fixed seed; fails w.p. < 1e-6).
    assert abs(m['rate'] - p) <= 5 * math.sqrt(p * (1 - p) / n)
    half = (m['rate_ci_high'] - m['rate_ci_low']) / 2
    assert half == pytest.approx(
        1.96 * math.sqrt(p * (1 - p) / n), rel=0.15)
  assert (workdir / 'results.csv').exists()


def test_chunk_size_does_not_change_results_and_resume_skips(tmp_path):
  a, b = tmp_path / 'a', tmp_path / 'b'
  assert _run('--config=configs/toy.py:smoke', f'--workdir={a}').returncode == 0
  proc = _run('--config=configs/toy.py:smoke', '--config.game.chunk_size=77',
              f'--workdir={b}')
  assert proc.returncode == 0, proc.stderr[-2000:]
  metrics = lambda d: [p['metrics'] for p in _load(d)['points']]
  assert metrics(a) == metrics(b)
  proc = _run('--config=configs/toy.py:smoke', f'--workdir={a}')
  assert proc.returncode == 0 and proc.stderr.count('skipping') == 3


def test_bad_p_exits_2_without_writing(tmp_path):
  workdir = tmp_path / 'never'
  proc = _run('--config=configs/toy.py:smoke', '--config.toy.p=1.5',
              f'--workdir={workdir}')
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1].startswith('error: config.toy.p')
  assert not workdir.exists()


def test_runs_from_another_folder(tmp_path):
  workdir = tmp_path / 'w'
  proc = _run('--config=configs/toy.py:smoke', f'--workdir={workdir}',
              cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert len(_load(workdir)['points']) == 3
