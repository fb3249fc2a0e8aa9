"""`pipelines.ahead`: the next job runs in the background while the caller holds this one's
result; results, errors and order are those of running the jobs in order."""

from __future__ import annotations

import threading

import pytest

from fl_privacy.pipelines import ahead
from tests.experiments import cli


def test_the_next_job_runs_while_the_caller_holds_this_one():
  started = {k: threading.Event() for k in 'abc'}
  threads = {}

  def job(k):
    def run():
      threads[k] = threading.get_ident()
      started[k].set()
      return k * 2
    return run

  runs = ahead.Ahead([(k, job(k)) for k in 'abc'])
  assert runs.get('a') == 'aa'
  # Job b was started by get('a') and finishes without another call.
  assert started['b'].wait(10) and not started['c'].is_set()
  assert runs.get('b') == 'bb' and started['c'].wait(10)
  assert runs.get('c') == 'cc'
  assert threading.get_ident() not in threads.values()
  runs.close()


def test_errors_reach_the_caller_and_disabled_runs_in_order_in_the_callers_thread():
  def boom():
    raise RuntimeError('job b failed')

  runs = ahead.Ahead([('a', lambda: 1), ('b', boom)])
  assert runs.get('a') == 1
  with pytest.raises(RuntimeError, match='job b failed'):
    runs.get('b')
  runs.close()
  calls = []
  seq = ahead.Ahead([(k, lambda k=k: calls.append((k, threading.get_ident())) or k)
                     for k in (1, 2, 3)], enabled=False)
  assert [seq.get(k) for k in (1, 2, 3)] == [1, 2, 3]
  assert calls == [(k, threading.get_ident()) for k in (1, 2, 3)]  # nothing ran ahead
  with pytest.raises(ValueError, match='distinct'):
    ahead.Ahead([(1, int), (1, int)])


def test_the_switch_is_0_or_1(monkeypatch):
  monkeypatch.delenv(ahead.ENV, raising=False)
  assert ahead.enabled()
  monkeypatch.setenv(ahead.ENV, '0')
  assert not ahead.enabled()
  monkeypatch.setenv(ahead.ENV, 'yes')
  with pytest.raises(ValueError, match=r'\$FL_PRIVACY_AHEAD must be 0 or 1'):
    ahead.enabled()


def test_a_bad_switch_exits_2_with_one_line_before_anything_is_written(tmp_path, monkeypatch):
  monkeypatch.setenv(ahead.ENV, 'yes')
  workdir = tmp_path / 'run'
  proc = cli.run('fedmia', workdir, timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1].endswith(
      "$FL_PRIVACY_AHEAD must be 0 or 1 (got 'yes')")
  assert not workdir.exists()
