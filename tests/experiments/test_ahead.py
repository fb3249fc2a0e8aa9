"""`pipelines.ahead`: the next jobs run in the background while the caller holds this one's
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


def test_depth_queues_that_many_jobs_and_no_more():
  started = {k: threading.Event() for k in range(6)}

  def job(k):
    def run():
      started[k].set()
      return k
    return run

  runs = ahead.Ahead([(k, job(k)) for k in range(6)], depth=3)
  assert runs.get(0) == 0
  # get(0) queued 1, 2, 3 behind 0 on the one worker; 4 waits for get(1).
  assert all(started[k].wait(10) for k in (1, 2, 3))
  assert not started[4].is_set()
  assert runs.get(1) == 1 and started[4].wait(10) and not started[5].is_set()
  assert [runs.get(k) for k in (2, 3, 4, 5)] == [2, 3, 4, 5]
  runs.close()
  with pytest.raises(ValueError, match='depth must be >= 1'):
    ahead.Ahead([(1, int)], depth=0)


def test_the_switch_is_a_depth_from_0_to_64_over_each_pipelines_default(monkeypatch):
  monkeypatch.delenv(ahead.ENV, raising=False)
  assert ahead.enabled() and ahead.depth() == 1 and ahead.depth(2) == 2
  monkeypatch.setenv(ahead.ENV, '0')
  assert not ahead.enabled() and ahead.depth(2) == 0
  monkeypatch.setenv(ahead.ENV, ' 1 ')
  assert ahead.depth(2) == 1
  monkeypatch.setenv(ahead.ENV, '64')
  assert ahead.depth() == 64
  for bad in ('yes', '-1', '65', '1.5', ''):
    monkeypatch.setenv(ahead.ENV, bad)
    with pytest.raises(ValueError, match=r'\$FL_PRIVACY_AHEAD must be an integer from 0'):
      ahead.enabled()


def test_over_reads_the_depth_and_runs_that_many_jobs_at_once(monkeypatch):
  monkeypatch.delenv(ahead.ENV, raising=False)
  runs = ahead.over([10, 20, 30, 40], lambda x: x + 1, lambda x: x != 20, default_depth=2)
  assert runs._depth == 2 and runs._order == [0, 2, 3]  # pylint: disable=protected-access
  assert runs._pool._max_workers == 2  # pylint: disable=protected-access
  assert [runs.get(i) for i in (0, 2, 3)] == [11, 31, 41]
  runs.close()
  monkeypatch.setenv(ahead.ENV, '3')
  three = ahead.over([1], lambda x: x, lambda x: True, default_depth=2)
  assert three._depth == 3  # pylint: disable=protected-access
  monkeypatch.setenv(ahead.ENV, '0')
  assert ahead.over([1], lambda x: x, lambda x: True)._pool is None  # pylint: disable=protected-access


def test_two_workers_run_two_jobs_at_the_same_time():
  both = threading.Barrier(2, timeout=10)  # broken (an error) unless two jobs wait at once
  runs = ahead.Ahead([(k, lambda k=k: (both.wait() if k else None, k)[1]) for k in range(3)],
                     depth=2)
  assert runs.get(0) == 0 and runs.get(1) == 1 and runs.get(2) == 2
  runs.close()


def test_a_bad_switch_exits_2_with_one_line_before_anything_is_written(tmp_path, monkeypatch):
  monkeypatch.setenv(ahead.ENV, 'yes')
  workdir = tmp_path / 'run'
  proc = cli.run('fedmia', workdir, timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1].endswith(
      "$FL_PRIVACY_AHEAD must be an integer from 0 (in order) to 64 (trainings ahead; "
      "unset: each pipeline's default) (got 'yes')")
  assert not workdir.exists()
