"""`jobs`: a Job rebuilt anywhere, the partition query, the ordered grid and what it lost, the
seeded server generators (in process; the other engines: tests_engines/)."""

from __future__ import annotations

import pickle
import random

from flwr.app import Message
import numpy as np
import pytest

from fl_privacy.flower.engines import deployment
from fl_privacy.flower.engines import dispatch
from fl_privacy.flower.engines import inprocess
from fl_privacy.flower.engines import jobs

TOY = 'tests_engines.toy_part'


def _job(num_nodes=3, **args):
  return jobs.Job(TOY, num_nodes, dict(rounds=2, **args), seed=11)


def test_a_job_names_a_known_part_or_a_module():
  with pytest.raises(ValueError, match="part must be one of"):
    jobs.Job('fedmia2', 2, {}, seed=0)
  with pytest.raises(ValueError, match='num_nodes must be >= 1'):
    jobs.Job('fedmia', 0, {}, seed=0)
  job = _job()
  assert pickle.loads(pickle.dumps(job)) == job
  assert jobs.job_hash(job) == jobs.job_hash(_job()) != jobs.job_hash(_job(num_nodes=4))


def test_a_saved_job_loads_back_and_the_result_path_sits_beside_it(tmp_path):
  job = _job()
  path = jobs.save(job, tmp_path / 'a' / 'job.pkl')
  assert jobs.load(path) == job
  assert not list((tmp_path / 'a').glob('*.tmp'))
  with open(tmp_path / 'not_a_job.pkl', 'wb') as f:
    pickle.dump({'part': 'fedmia'}, f)
  with pytest.raises(TypeError, match='holds a dict, not a Job'):
    jobs.load(tmp_path / 'not_a_job.pkl')


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


def test_the_deployment_bound_is_memory_over_a_node():
  assert deployment.max_deployment_nodes(available=int(24e9)) == 32
  assert deployment.max_deployment_nodes(available=int(1e8)) == 1
