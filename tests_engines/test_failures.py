"""Failures of a real deployment: a node that replies with an error, a round that times out
(on SuperNodes with homes and working directories of their own, the job inside the run), a
SuperNode killed mid-round, and processes stopped on every exit path: an exception, SIGTERM,
and the driver killed with SIGKILL (its watchdog)."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from fl_privacy.flower.engines import deployment
from fl_privacy.flower.engines import dispatch
from fl_privacy.flower.engines import jobs
from fl_privacy.flower.parts import fedmia
from tests_engines.conftest import alive
from tests_engines.conftest import flower_processes
from tests_engines.conftest import REPO

TOY = 'tests_engines.toy_part'


def _job(num_nodes=3, *, round_timeout=None, rounds=2, **args):
  return jobs.Job(TOY, num_nodes, dict(rounds=rounds, **args), seed=7,
                  round_timeout=round_timeout)


def _models(weights_by_round):
  """FedAvg's models when node k replies w + (k + 1) with weight k + 1, by the nodes that
  answered each round."""
  w, out = np.zeros(3), [np.zeros(3)]
  for nodes in weights_by_round:
    weights = np.asarray(nodes, np.float64) + 1
    w = w + np.sum(weights * weights) / np.sum(weights)
    out.append(w)
  return out


@pytest.mark.parametrize('engine', dispatch.ENGINES)
def test_an_error_reply_is_named_and_the_audit_refuses_the_partial_run(engine, no_leftovers):
  job = _job(actions={(2, 1): 'raise'})
  out = dispatch.run_job(engine, job, no_leftovers / 'job')
  assert [(x['round'], x['partition'], x['type']) for x in out['losses']] == [(2, 1, 'train')]
  assert out['losses'][0]['reason'].startswith('error: ')
  assert 'partition 1 fails in round 2' in out['losses'][0]['reason']
  # FedAvg went on with the other nodes (Flower drops error replies) ...
  np.testing.assert_allclose(out['result']['models'], _models([[0, 1, 2], [0, 2]]), rtol=1e-6)
  # ... and the audit does not score a run that lost a reply.
  with pytest.raises(jobs.EngineError, match=r'lost 1 replies: round 2 partition 1 \(error'):
    fedmia.check_complete(out, 'the run')


def test_nodes_with_homes_of_their_own_run_the_job_and_a_late_node_is_named(no_leftovers):
  """SuperNodes with their own FLWR_HOME and working directory, sharing no folder with the
  submitter: the job reaches them inside the run (the run config file, read by `flwr run`
  only, is gone before any node trains); node 2 sleeps past the round's timeout."""
  job = _job(actions={(1, 2): 'sleep:600'}, round_timeout=45.0, rounds=1)
  submitter, nodes = no_leftovers / 'submitter', no_leftovers / 'nodes'
  with deployment.LocalDeployment(3, submitter / 'dep', node_root=nodes) as dep:
    for k, proc in enumerate(dep.supernodes):
      env = pathlib.Path(f'/proc/{proc.pid}/environ').read_bytes().split(b'\0')
      assert f'FLWR_HOME={nodes / f"node_{k}" / "home"}'.encode() in env
      assert pathlib.Path(f'/proc/{proc.pid}/cwd').resolve() == (nodes / f'node_{k}' / 'cwd')
    run_id = dep.submit_job(job, submitter / 'job')
    shutil.rmtree(submitter / 'job')
    out = dep.result(run_id, dep.wait(run_id, timeout=300))
  assert [(x['round'], x['partition'], x['reason']) for x in out['losses']] == [
      (1, 2, 'no reply within the timeout')]
  np.testing.assert_allclose(out['result']['models'], _models([[0, 1]]), rtol=1e-6)
  # (A SuperNode runs its messages one after the other: still asleep in round 1, node 2 would
  # miss a round 2 as well; docs/experiments/flower_audit.md.)


def test_a_supernode_killed_mid_round_is_named_and_its_processes_are_gone(no_leftovers):
  markers = no_leftovers / 'markers'
  markers.mkdir()
  # The survivors must reply within the round's timeout even on a loaded 2-core CI machine
  # (a ClientApp process starts in seconds there, not milliseconds): 15 s lost node 0 too.
  job = _job(actions={(1, 1): 'sleep:600'}, markers=str(markers), min_nodes=2,
             round_timeout=60.0, rounds=1)
  box = {}
  with deployment.LocalDeployment(3, no_leftovers / 'dep') as dep:
    def run():
      try:
        box['out'] = dispatch.run_job('deployment', job, no_leftovers / 'job', deployment=dep,
                                      run_timeout=240)
      except Exception as e:  # pylint: disable=broad-except
        box['error'] = e
    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 120
    while not (markers / 'r1_p1').exists():  # node 1 is inside round 1's training
      assert time.monotonic() < deadline and thread.is_alive(), box
      time.sleep(0.2)
    victim = dep.supernodes[1].pid
    dep.kill_node(1)
    assert not alive(victim)
    thread.join(300)
  assert 'error' not in box, box.get('error')
  losses = box['out']['losses']
  assert (1, 1) in [(x['round'], x['partition']) for x in losses]
  assert {x['partition'] for x in losses} == {1}  # nothing else was lost
  with pytest.raises(jobs.EngineError, match=r'round 1 partition 1 \(no reply'):
    fedmia.check_complete(box['out'], 'the run')


def test_processes_stop_when_the_run_is_terminated(no_leftovers):
  """SIGTERM to the process holding a deployment (what `timeout` or a scheduler sends)."""
  pid_file = no_leftovers / 'pids'
  code = ('import sys, time\n'
          'from fl_privacy.flower.engines import deployment\n'
          f'with deployment.LocalDeployment(2, {str(no_leftovers / "dep")!r}) as dep:\n'
          f'  open({str(pid_file)!r}, "w").write(" ".join(map(str, dep.pids())))\n'
          '  time.sleep(600)\n')
  proc = subprocess.Popen([sys.executable, '-c', code], cwd=REPO, env=dict(os.environ),
                          stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 120
  while not pid_file.exists() or not pid_file.read_text():
    assert proc.poll() is None and time.monotonic() < deadline
    time.sleep(0.2)
  pids = [int(p) for p in pid_file.read_text().split()]
  assert len(pids) == 3 and all(map(alive, pids))
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=60) == 128 + signal.SIGTERM
  assert proc.stderr.read().strip().splitlines()[-1].startswith(
      'error: terminated (SIGTERM) during a Flower deployment: its processes are stopped')
  assert not any(map(alive, pids))
  assert not flower_processes(str(no_leftovers))


def test_the_driver_killed_with_sigkill_leaves_no_flower_process(no_leftovers):
  """SIGKILL runs no `finally`: the deployment's watchdog (a session of its own) sees the
  driver gone and kills the SuperLink, the SuperNodes, their superexecs and the ClientApp
  process still training."""
  markers = no_leftovers / 'markers'
  markers.mkdir()
  code = ('from fl_privacy.flower.engines import dispatch, jobs\n'
          f'job = jobs.Job({TOY!r}, 2, dict(rounds=1, markers={str(markers)!r}, '
          'actions={(1, 0): "sleep:600"}), seed=1)\n'
          f'dispatch.run_job("deployment", job, {str(no_leftovers / "job")!r})\n')
  proc = subprocess.Popen([sys.executable, '-c', code], cwd=REPO, env=dict(os.environ))
  deadline = time.monotonic() + 240
  while not (markers / 'r1_p0').exists():  # node 0's ClientApp is inside round 1
    assert proc.poll() is None and time.monotonic() < deadline
    time.sleep(0.2)
  running = flower_processes(str(no_leftovers))
  assert len(running) >= 6  # SuperLink, 2 SuperNodes, 3 superexecs, a ClientApp, watchdog
  proc.kill()
  proc.wait()
  deadline = time.monotonic() + 10
  while flower_processes(str(no_leftovers)) and time.monotonic() < deadline:
    time.sleep(0.2)
  assert not flower_processes(str(no_leftovers))
  assert not any(map(alive, running))


def test_a_run_without_a_job_fails_and_a_block_that_raises_stops_every_process(no_leftovers):
  with pytest.raises(ValueError, match='the deployment has 1 SuperNodes, the job needs 3'):
    with deployment.LocalDeployment(1, no_leftovers / 'dep') as dep:
      pids = dep.pids()
      assert len(pids) == 2 and all(map(alive, pids))
      entry = dep.wait(dep.submit({}), timeout=120)
      assert entry['status'] == 'finished:failed'
      assert "the run config has no 'job'" in entry['status-details']
      dispatch.run_job('deployment', _job(), no_leftovers / 'job', deployment=dep)
  assert not any(map(alive, pids))


def test_the_app_folder_names_our_server_and_client_apps():
  text = (pathlib.Path(deployment.APP_DIR) / 'pyproject.toml').read_text()
  assert 'serverapp = "fl_privacy.flower.engines.app:server_app"' in text
  assert 'clientapp = "fl_privacy.flower.engines.app:client_app"' in text
