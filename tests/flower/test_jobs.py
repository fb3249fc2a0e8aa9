"""`jobs`: a Job rebuilt anywhere from the data the run carries (`codec`, no pickle), the
partition query, the ordered grid and what it lost, the seeded server generators, the
deployment's size bound (in process; the other engines: tests_engines/)."""

from __future__ import annotations

import base64
import dataclasses
import json
import random
import zlib

from flwr.app import Message
import ml_collections
import numpy as np
import pytest

from fl_privacy.flower.engines import app
from fl_privacy.flower.engines import codec
from fl_privacy.flower.engines import deployment
from fl_privacy.flower.engines import dispatch
from fl_privacy.flower.engines import inprocess
from fl_privacy.flower.engines import jobs
from fl_privacy.flower.engines import sizes

TOY = 'tests_engines.toy_part'


def _job(num_nodes=3, **args):
  return jobs.Job(TOY, num_nodes, dict(rounds=2, **args), seed=11)


def test_a_job_names_a_known_part_or_a_module_of_this_repository():
  with pytest.raises(ValueError, match="part must be one of"):
    jobs.Job('fedmia2', 2, {}, seed=0)
  with pytest.raises(ValueError, match="part must be one of .* a module of "):
    jobs.Job('os.path', 2, {}, seed=0)  # importable, but not ours
  with pytest.raises(ValueError, match='num_nodes must be >= 1'):
    jobs.Job('fedmia', 0, {}, seed=0)
  job = _job()
  assert jobs.loads(jobs.dumps(job)) == job
  assert jobs.job_hash(job) == jobs.job_hash(_job()) != jobs.job_hash(_job(num_nodes=4))


@dataclasses.dataclass(frozen=True)
class _Point:
  """A dataclass of this repository's (tests) packages? No: `tests.` is not trusted."""
  x: int


def test_the_codec_rebuilds_what_jobs_and_results_hold_bit_for_bit():
  config = ml_collections.ConfigDict({'a': 1, 'b': (2, 'c'), 'd': {'e': None, 'f': 0.1}})
  value = {'ints': [1, -2**70], 'nan': float('nan'), 'inf': -float('inf'), 'text': 'é',
           'tuple': (1, (2.5, None)), 'bytes': b'\x00\xff', 'flag': True,
           'keys': {(2, 1): 'raise', 7: 'seven', codec._TAG: 'a tag as a key'},  # pylint: disable=protected-access
           'f32': np.float32(1.1), 'u64': np.uint64(2**64 - 1),
           'array': np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
           'bools': np.array([True, False]), 'empty': np.zeros((0, 3), np.int8),
           'config': config, 'job': _job(actions={(1, 0): 'raise'})}
  back = codec.loads(codec.dumps(value))
  assert back['ints'] == [1, -2**70] and np.isnan(back['nan']) and back['inf'] == -np.inf
  assert back['tuple'] == (1, (2.5, None)) and isinstance(back['tuple'][1], tuple)
  assert back['bytes'] == b'\x00\xff' and back['flag'] is True and back['text'] == 'é'
  assert back['keys'] == value['keys']
  for name in ('f32', 'u64'):
    assert type(back[name]) is type(value[name]) and back[name] == value[name]
  for name in ('array', 'bools', 'empty'):
    assert back[name].dtype == value[name].dtype
    np.testing.assert_array_equal(back[name], value[name])
  assert isinstance(back['config'], ml_collections.ConfigDict)
  assert back['config'].to_dict() == config.to_dict() and back['config'].b == (2, 'c')
  assert back['job'] == value['job'] and isinstance(back['job'], jobs.Job)


def _payload(tree) -> str:
  return base64.b64encode(zlib.compress(json.dumps(tree).encode())).decode()


def test_a_payload_names_no_callable_outside_this_repository_and_no_pickle():
  tag = codec._TAG  # pylint: disable=protected-access
  for name in ('os:system', 'subprocess:Popen', 'builtins:eval',
               f'{__name__}:_Point'):  # a dataclass, but of the tests' package
    with pytest.raises(ValueError, match='only dataclasses of'):
      codec.loads(_payload({tag: 'dataclass', 'type': name, 'v': {}}))
  with pytest.raises(ValueError, match='is not a dataclass'):
    codec.loads(_payload({tag: 'dataclass', 'type': 'fl_privacy.flower.engines.jobs:serve',
                          'v': {}}))
  pickled = np.array([{'a': 1}], dtype=object)
  with pytest.raises(TypeError, match=r"job\['x'\]: object arrays are not encoded"):
    codec.dumps({'x': pickled})
  with pytest.raises(TypeError, match=r'job\.y: a _thread\.lock cannot be encoded'):
    import threading  # pylint: disable=import-outside-toplevel
    codec.encode(ml_collections.ConfigDict({'y': threading.Lock()}))
  with pytest.raises(ValueError, match='not a payload'):
    codec.loads('not base64 at all!')
  with pytest.raises(ValueError, match="holds a dict, not a Job"):
    jobs.loads(codec.dumps({'part': 'fedmia'}))


def test_the_flower_apps_client_reads_its_job_from_the_run_config():
  """What a SuperNode's ClientApp process gets: the run config, no file."""
  job = _job(actions={(2, 1): 'raise'})
  want = dispatch.run_job('inprocess', job)
  grid = inprocess.InProcessGrid([jobs.client_app_for()] * 3,
                                 run_config={'job': jobs.dumps(job)})
  with inprocess.task_identity(grid.run.run_id, inprocess.SUPERLINK_NODE_ID):
    got = jobs.serve(job, grid)
  np.testing.assert_array_equal(np.stack(got['result']['models']),
                                np.stack(want['result']['models']))
  assert [(x['round'], x['partition']) for x in got['losses']] == [(2, 1)]
  bare = inprocess.InProcessGrid([jobs.client_app_for()] * 3, raise_client_errors=True)
  with inprocess.task_identity(bare.run.run_id, inprocess.SUPERLINK_NODE_ID):
    with pytest.raises(ValueError, match="the run config has no 'job'"):
      jobs.serve(job, bare)


def _grid(job, node_ids=None, node_configs=None):
  return inprocess.InProcessGrid([jobs.client_app_for(job)] * job.num_nodes, node_ids=node_ids,
                                 node_configs=node_configs)


def test_the_partition_query_maps_every_node_and_refuses_a_partition_twice():
  job = _job()
  grid = _grid(job, node_ids=[77, 5, 900])
  with inprocess.task_identity(grid.run.run_id, inprocess.SUPERLINK_NODE_ID):
    assert jobs.partition_map(grid, 3, timeout=5) == {77: 0, 5: 1, 900: 2}
    with pytest.raises(jobs.EngineError, match=r'2 of 3 nodes connected after 1 s'):
      jobs.partition_map(_grid(_job(2)), 3, timeout=1)
    twice = _grid(job, node_configs=[{}, {'partition-id': 0}, {}])
    with pytest.raises(jobs.EngineError, match=r"partitions are \[0, 0, 2\], not 0..2"):
      jobs.partition_map(twice, 3, timeout=5)


class _Shuffled(inprocess.InProcessGrid):
  """Replies in reverse order, node `drop`'s training replies lost (what a real grid may do:
  a node gone after it said its partition)."""

  def __init__(self, *args, drop=None, **kw):
    super().__init__(*args, **kw)
    self.drop = drop

  def send_and_receive(self, messages, *, timeout=None):
    replies = super().send_and_receive(messages, timeout=timeout)
    return [r for r in reversed(list(replies)) if r.metadata.src_node_id != self.drop or
            r.metadata.message_type != 'train']


def test_the_ordered_grid_lists_and_returns_by_partition_and_names_what_it_lost():
  job = _job(actions={(1, 0): 'raise'})
  grid = _Shuffled([jobs.client_app_for(job)] * 3, node_ids=[30, 20, 10], drop=20)
  ordered = jobs.OrderedGrid(grid, {30: 0, 20: 1, 10: 2})
  assert ordered.get_node_ids() == [30, 20, 10]
  with inprocess.task_identity(grid.run.run_id, inprocess.SUPERLINK_NODE_ID):
    out = jobs.serve(job, grid)
  # Round 1: node 30 (partition 0) raised, node 20 (partition 1) never answers.
  lost = [(x['round'], x['partition'], x['reason'].split(':')[0]) for x in out['losses']]
  assert lost == [(1, 0, 'error'), (1, 1, 'no reply within the timeout'),
                  (2, 1, 'no reply within the timeout')]
  # The error's reason is its last line (the exception under the ClientApp's traceback).
  assert out['losses'][0]['reason'].endswith('RuntimeError: partition 0 fails in round 1')
  assert jobs.last_line('Traceback\n  at x\n\n  ValueError: y  \n\n') == 'ValueError: y'
  assert jobs.last_line('a\nb\nc') == 'c' and jobs.last_line('') == ''
  assert out['node_ids'] == [30, 20, 10] and out['partitions'] == {30: 0, 20: 1, 10: 2}


def test_replies_reach_the_strategy_in_partition_order_whatever_their_order():
  """FedAvg sums in the order it gets the replies; in float32 that order shows."""
  seen = []

  class Spy(inprocess.InProcessGrid):
    def send_and_receive(self, messages, *, timeout=None):
      return list(reversed(list(super().send_and_receive(messages, timeout=timeout))))

  grid = Spy([jobs.client_app_for(_job())] * 3, node_ids=[5, 6, 7])
  ordered = jobs.OrderedGrid(grid, {5: 2, 6: 0, 7: 1})
  with inprocess.task_identity(grid.run.run_id, inprocess.SUPERLINK_NODE_ID):
    messages = [Message(jobs.RecordDict(), dst_node_id=n, message_type='query')
                for n in (5, 6, 7)]
    for reply in ordered.send_and_receive(messages, timeout=5):
      seen.append(reply.metadata.src_node_id)
  assert seen == [6, 7, 5]


def test_the_server_generators_are_seeded_for_the_job_and_restored_after():
  random.seed(1)
  np.random.seed(1)
  before = random.random(), np.random.random()
  random.seed(1)
  np.random.seed(1)
  with jobs.seeded(123):
    inside = random.random(), np.random.random()
  with jobs.seeded(123):
    assert (random.random(), np.random.random()) == inside
  assert (random.random(), np.random.random()) == before


def test_the_in_process_engine_runs_the_job_with_the_seeded_sampling():
  """FedAvg samples with Python's `random`: the job's seed fixes which nodes train."""
  job = jobs.Job(TOY, 6, dict(rounds=3, fraction=0.5, min_nodes=6), seed=4)
  a, b = dispatch.run_job('inprocess', job), dispatch.run_job('inprocess', job)
  np.testing.assert_array_equal(np.stack(a['result']['models']),
                                np.stack(b['result']['models']))
  other = dispatch.run_job('inprocess', jobs.Job(TOY, 6, job.args, seed=5))
  assert not np.array_equal(np.stack(a['result']['models']),
                            np.stack(other['result']['models']))


def test_an_unknown_engine_is_refused():
  with pytest.raises(ValueError, match=r"engine must be one of \('inprocess', 'simulation', "
                     r"'deployment'\)"):
    dispatch.run_job('ray', _job())


def test_the_deployment_bound_is_total_memory_over_every_process_of_a_node():
  node = sizes.SUPERNODE_BYTES + sizes.SUPEREXEC_BYTES + sizes.CLIENTAPP_BYTES
  assert sizes.NODE_BYTES == node
  for total in (int(8e9), int(25.3e9), int(64e9)):
    want = max(1, int((0.8 * total - sizes.BASE_BYTES) // node))
    assert sizes.max_deployment_nodes(total) == want
  assert sizes.max_deployment_nodes(int(25_276_182_528)) == 24  # this machine (MemTotal)
  assert sizes.max_deployment_nodes(int(1e8)) == 1
  # The default reads the machine's total, not what is free now: one verdict, busy or idle.
  assert sizes.max_deployment_nodes() == sizes.max_deployment_nodes(sizes.total_memory())
  with open('/proc/meminfo', encoding='utf-8') as f:
    mem_total = int(next(line for line in f if line.startswith('MemTotal:')).split()[1]) * 1024
  assert sizes.total_memory() <= mem_total


# ------------------------------------------- the driver's side of a run: wait and result ---

class _Proc:
  """A stand-in for the SuperLink's Popen: alive until `code` is set."""

  def __init__(self, code=None):
    self.code = code

  def poll(self):
    return self.code


def _deployment(tmp_path, statuses, superlink_code=None):
  dep = deployment.LocalDeployment(3, tmp_path / 'dep')
  dep.superlink = _Proc(superlink_code)
  seq = iter(statuses)
  dep.status = lambda run_id: next(seq)
  dep.cli_error = 'flwr ls exited 1: connection refused'
  return dep


def test_wait_returns_the_finished_entry_and_bears_fewer_failed_calls_than_the_limit(tmp_path):
  running, done = {'status': 'running'}, {'status': 'finished:completed'}
  few = [None] * (deployment.CLI_FAILURES - 1)
  dep = _deployment(tmp_path, [running] + few + [running] + few + [done])
  assert dep.wait(5, timeout=1e6, poll=0) is done
  dep = _deployment(tmp_path, [running] + few + [None, done])
  with pytest.raises(jobs.EngineError, match=rf'`flwr ls --run-id 5` failed '
                     rf'{deployment.CLI_FAILURES} times in a row: flwr ls exited 1: '
                     'connection refused'):
    dep.wait(5, timeout=1e6, poll=0)


def test_wait_stops_a_run_past_its_timeout_and_notices_a_dead_superlink(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(deployment.subprocess, 'run', lambda args, **kw: calls.append(args))
  dep = _deployment(tmp_path, [{'status': 'running'}] * 3)
  with pytest.raises(jobs.EngineError, match=r'run 5 did not finish within 0 s \(stopped\)'):
    dep.wait(5, timeout=0, poll=0)
  assert [a[1:3] for a in calls] == [['stop', '5']]
  dep = _deployment(tmp_path, [{'status': 'running'}], superlink_code=-9)
  with pytest.raises(jobs.EngineError, match='the SuperLink exited during run 5'):
    dep.wait(5, timeout=1e6, poll=0)


def test_the_result_is_read_back_as_data_and_a_failed_run_is_one_line(tmp_path):
  dep = deployment.LocalDeployment(3, tmp_path / 'dep')
  done = {'status': 'finished:completed'}
  out = {'result': {'models': [np.arange(3, dtype=np.float32)]}, 'partitions': {17: 0}}
  app.write_result(app.result_path(5, dep.home), {'result': out})
  got = dep.result(5, done)
  assert got['partitions'] == {17: 0} and got['result']['models'][0].dtype == np.float32
  with pytest.raises(jobs.EngineError, match=r"run 5 finished:failed: ValueError: boom"):
    dep.result(5, {'status': 'finished:failed', 'status-details': 'Traceback\nValueError: boom'})
  app.write_result(app.result_path(6, dep.home), {'error': 'the ServerApp raised KeyError: x'})
  with pytest.raises(jobs.EngineError, match=r'^run 6: the ServerApp raised KeyError: x$'):
    dep.result(6, done)
  with pytest.raises(jobs.EngineError, match=r'run 7 finished:failed: no result written'):
    dep.result(7, {'status': 'finished:failed'})
  with pytest.raises(ValueError, match='the deployment has 3 SuperNodes, the job needs 4'):
    dep.submit_job(_job(num_nodes=4))


def test_status_picks_the_run_of_flwr_ls_and_none_when_the_call_fails(tmp_path, monkeypatch):
  dep = deployment.LocalDeployment(3, tmp_path / 'dep')
  payload = {'runs': [{'run-id': '4', 'status': 'running'}, {'run-id': '5', 'status': 'x'}]}
  monkeypatch.setattr(dep, '_cli_json', lambda *args, **kw: payload)
  assert dep.status(5) == {'run-id': '5', 'status': 'x'} and dep.status(6) is None
  monkeypatch.setattr(dep, '_cli_json', lambda *args, **kw: None)
  assert dep.status(5) is None
