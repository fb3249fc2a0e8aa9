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


def test_runs_without_config_and_prints_a_summary(tmp_path):
  proc = _run(f'--workdir={tmp_path / "toy"}')
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert _load(tmp_path / 'toy')['config']['dataset'] == 'toy'
  # Not a terminal: no progress line on stderr; the table and the outputs on stdout.
  assert '\r' not in proc.stderr and 'point 1/3' not in proc.stderr
  assert 'rate [95% CI]' in proc.stdout and 'results: results.json' in proc.stdout
  assert len([l for l in proc.stdout.splitlines() if l.startswith(('0.01', '0.3', '0.5'))]) == 3


def test_progress_line_on_a_terminal(tmp_path):
  import pty  # pylint: disable=g-import-not-at-top
  master, slave = pty.openpty()
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  proc = subprocess.Popen([sys.executable, '-m', 'experiments.toy_game',
                           '--config=configs/toy.py:smoke', f'--workdir={tmp_path / "toy"}'],
                          env=env, cwd=REPO,
                          stdout=slave, stderr=slave, stdin=subprocess.DEVNULL)
  os.close(slave)
  chunks = []
  while True:
    try:
      data = os.read(master, 4096)
    except OSError:  # the terminal closed: the process has exited
      break
    if not data:
      break
    chunks.append(data)
  assert proc.wait(timeout=120) == 0
  os.close(master)
  text = b''.join(chunks).decode(errors='replace')
  assert 'point 1/3' in text and 'point 3/3' in text and 'ETA' in text
  assert 'trials/s' in text and 'elapsed' in text


def test_quiet_prints_no_table(tmp_path):
  proc = _run('--quiet', f'--workdir={tmp_path / "toy"}', '--config=configs/toy.py:smoke')
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout == ''
