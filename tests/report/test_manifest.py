"""Tests of the run manifest: command line, git revision with a dirty flag, versions, resume."""

from __future__ import annotations

import subprocess
import sys

import ml_collections
import pytest

from fl_privacy import report
from fl_privacy.report import manifest


def _git(repo, *args):
  subprocess.run(['git', *args], cwd=repo, check=True, capture_output=True)


def test_git_revision_and_dirty_flag(tmp_path):
  try:
    _git(tmp_path, 'init', '-q')
  except (OSError, subprocess.CalledProcessError):
    pytest.skip('git is not available')
  _git(tmp_path, '-c', 'user.email=t@t', '-c', 'user.name=t', 'commit', '-q',
       '--allow-empty', '-m', 'x')
  (tmp_path / 'f.txt').write_text('a')
  assert manifest.git_dirty(str(tmp_path)) is False  # untracked files do not count
  _git(tmp_path, 'add', 'f.txt')
  _git(tmp_path, '-c', 'user.email=t@t', '-c', 'user.name=t', 'commit', '-q', '-m', 'f')
  assert manifest.git_dirty(str(tmp_path)) is False
  (tmp_path / 'f.txt').write_text('b')
  assert manifest.git_dirty(str(tmp_path)) is True
  assert len(manifest.git_revision(str(tmp_path))) == 40
  assert manifest.git_dirty(str(tmp_path / 'nowhere')) is None


def test_manifest_has_command_versions_and_earlier_runs(tmp_path, monkeypatch):
  monkeypatch.setattr(sys, 'orig_argv', ['/usr/bin/python3', '-m', 'experiments.ami',
                                         '--config=configs/digits.py:smoke'], raising=False)
  config = ml_collections.ConfigDict({'seed': 0})
  first = report.ResultsStore(tmp_path, 'toy', config)
  m = first.manifest
  assert m['command'] == "python3 -m experiments.ami --config=configs/digits.py:smoke"
  for package in ('fl_privacy', 'jax', 'jaxlib', 'flax', 'optax', 'numpy'):
    assert m['versions'][package]
  assert set(m) >= {'git_revision', 'git_dirty', 'python', 'devices', 'start_time',
                    'end_time', 'earlier_runs', 'cwd'}
  assert m['earlier_runs'] == []
  first.finish()
  monkeypatch.setattr(sys, 'orig_argv', ['python', '-m', 'experiments.ami', '--quiet'],
                      raising=False)
  again = report.ResultsStore(tmp_path, 'toy', config).manifest
  assert again['command'].endswith('--quiet') and again['start_time'] == m['start_time']
  assert [r['command'] for r in again['earlier_runs']] == [m['command']]
  assert again['earlier_runs'][0]['end_time'] is not None
