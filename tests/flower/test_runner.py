"""The in-process runner: Flower's FedAvg and our JAX ClientApp, 3 nodes, no network."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode, SUPERLINK_NODE_ID
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.task_identity import TaskIdentity

from fl_privacy.fl import losses
from fl_privacy.fl import rounds
from fl_privacy.flower import bridge
from fl_privacy.flower import client
from fl_privacy.flower.engines import inprocess
from fl_privacy.flower.strategies import dishonest
from fl_privacy.flower.strategies import recording
from tests.flower import common

EPOCHS, BATCH = 2, 4


def _fedavg():
  return FedAvg(min_train_nodes=3, min_available_nodes=3, min_evaluate_nodes=3)


@pytest.fixture(scope='module')
def federation():
  """Two rounds of FedAvg with 3 nodes, recorded; and the same training by `fl.rounds.run`."""
  model = common.mlp()
  variables = common.init(model)
  data = common.shards(3, per_node=12)
  key = jax.random.key(7)
  app = client.make_client_app(model, data, key=key, optimizer=common.SGD, epochs=EPOCHS,
                               batch_size=BATCH)
  grid = inprocess.InProcessGrid([app] * 3, raise_client_errors=True, keep_delivered=True)
  log = recording.UploadLog()
  strategy = recording.RecordingStrategy(_fedavg(), variables, observer=log)
  result = inprocess.run(strategy, grid, bridge.to_array_record(variables), num_rounds=2)
  clients = rounds.pad_clients([x for x, _ in data], [y for _, y in data])
  reference, _ = rounds.run(losses.make_loss_fn(model.apply), variables, clients, key=key,
                            num_rounds=2, optimizer=common.SGD, epochs=EPOCHS,
                            batch_size=BATCH)
  return dict(model=model, variables=variables, data=data, grid=grid, log=log, result=result,
              reference=reference, key=key)


def test_two_rounds_of_fedavg_with_three_nodes(federation):
  result, log, grid = federation['result'], federation['log'], federation['grid']
  assert sorted(result.train_metrics_clientapp) == [1, 2]
  assert sorted(result.evaluate_metrics_clientapp) == [1, 2]
  assert set(result.evaluate_metrics_clientapp[2]) == {'eval_loss', 'eval_acc'}
  assert [r.server_round for r in log.rounds] == [1, 2]
  for r in log.rounds:
    assert sorted(r.node_ids.tolist()) == grid.get_node_ids() == [1001, 1002, 1003]
    np.testing.assert_array_equal(r.num_examples, [12.0] * 3)
    assert r.failures.size == 0
  # Round 2 starts from round 1's aggregate, and the final model is round 2's aggregate.
  final = bridge.from_array_record(result.arrays, federation['variables'])
  assert not np.array_equal(final['params']['fc1']['kernel'],
                            federation['variables']['params']['fc1']['kernel'])
  round1 = jax.tree_util.tree_map(np.asarray, log.rounds[1].global_params)
  weights = log.rounds[0].num_examples / log.rounds[0].num_examples.sum()
  for name in ('fc1', 'fc2', 'fc3'):
    mean = sum(w * u['params'][name]['kernel'] for w, u in zip(weights, log.rounds[0].uploads))
    np.testing.assert_allclose(round1['params'][name]['kernel'], mean, rtol=1e-6, atol=1e-7)
  # Each node got its own copy of the round's model: 3 train + 3 evaluate messages per round.
  assert len(grid.delivered) == 12
  assert len({id(m.content) for m in grid.delivered}) == 12
  assert {m.metadata.src_node_id for m in grid.delivered} == {SUPERLINK_NODE_ID}


def test_the_uploads_are_what_the_client_app_computes(federation):
  """Node k in round r trains with rounds.client_key(key, r - 1, k): recompute one upload."""
  model, data, log = federation['model'], federation['data'], federation['log']
  r = log.rounds[1]
  k = 2
  node = inprocess.FIRST_NODE_ID + k
  from fl_privacy.fl import local  # pylint: disable=import-outside-toplevel
  params = jax.tree_util.tree_map(jnp.asarray, r.global_params)
  want = jax.jit(lambda p, x, y, kk: local.fedavg(
      losses.make_loss_fn(model.apply), p, x, y, key=kk, optimizer=common.SGD, epochs=EPOCHS,
      batch_size=BATCH))(params, *data[k], rounds.client_key(federation['key'], 1, k))
  got = r.uploads[int(np.flatnonzero(r.node_ids == node)[0])]
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_array_equal(a, np.asarray(b))


def test_flower_fedavg_matches_fl_rounds_run(federation):
  """Same keys, data and optimizer: Flower's FedAvg reproduces `fl.rounds.run` (float
  rounding of the weighted mean aside)."""
  final = bridge.from_array_record(federation['result'].arrays, federation['variables'])
  for a, b in zip(jax.tree_util.tree_leaves(final),
                  jax.tree_util.tree_leaves(federation['reference'])):
    np.testing.assert_allclose(a, np.asarray(b), rtol=1e-5, atol=1e-6)


def test_recording_from_a_flower_run_has_the_recording_layout(federation):
  qx, qy = common.synthetic(9, 5)
  rec = recording.recording_from_uploads(federation['model'].apply, federation['log'].rounds,
                                         qx, qy, chunk_size=5)
  assert {k: v.shape for k, v in rec.items()} == {
      'loss': (2, 3, 5), 'cos': (2, 3, 5), 'diff': (2, 3, 5), 'margin': (2, 3, 5),
      'grad_sq': (2, 5), 'rounds': (2,), 'node_ids': (3,), 'num_examples': (2, 3)}
  assert np.all(np.isfinite(rec['loss'])) and np.all(np.abs(rec['cos']) <= 1 + 1e-6)


def _echo_app(fail_node=None):
  app = ClientApp()

  @app.train()
  def train(msg, context):
    if context.node_id == fail_node:
      raise RuntimeError('client exploded')
    assert TaskIdentity.node_id == context.node_id  # the node's identity inside its app
    msg.content['config']['touched'] = context.node_id  # must not leak to other nodes
    return Message(RecordDict({'config': msg.content['config']}), reply_to=msg)

  return app


def test_client_errors_become_error_replies_and_content_is_isolated():
  grid = inprocess.InProcessGrid([_echo_app(fail_node=1002)] * 3)
  shared = RecordDict({'config': ConfigRecord({'x': 1})})
  with inprocess.task_identity(5, SUPERLINK_NODE_ID):
    messages = [Message(shared, n, MessageType.TRAIN) for n in grid.get_node_ids()]
  replies = grid.send_and_receive(messages)
  assert [m.metadata.src_node_id for m in replies] == [1001, 1002, 1003]
  assert replies[1].has_error()
  assert replies[1].error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
  assert 'client exploded' in replies[1].error.reason
  assert replies[0].content['config']['touched'] == 1001
  assert replies[2].content['config']['touched'] == 1003
  assert 'touched' not in shared['config']
  assert grid.pull_messages([replies[0].metadata.reply_to_message_id]) == []  # pulled once
  raising = inprocess.InProcessGrid([_echo_app(fail_node=1001)], raise_client_errors=True)
  with inprocess.task_identity(5, SUPERLINK_NODE_ID):
    message = Message(RecordDict({'config': ConfigRecord()}), 1001, MessageType.TRAIN)
  with pytest.raises(RuntimeError, match='client exploded'):
    raising.push_messages([message])


def test_grid_refuses_unknown_nodes_and_bad_setups():
  grid = inprocess.InProcessGrid([_echo_app()] * 2, node_ids=[7, 8])
  with inprocess.task_identity(1, SUPERLINK_NODE_ID):
    message = Message(RecordDict(), 9, MessageType.TRAIN)
  with pytest.raises(ValueError, match='node 9, which is not in the grid'):
    grid.push_messages([message])
  with pytest.raises(ValueError, match='distinct and not 1'):
    inprocess.InProcessGrid([_echo_app()] * 2, node_ids=[1, 2])
  with pytest.raises(ValueError, match='2 node ids for 3'):
    inprocess.InProcessGrid([_echo_app()] * 3, node_ids=[4, 5])
  from flwr.supercore.run import Run  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match='run 5: .*run_id=5'):
    grid.set_run(Run.create_empty(5))
  with pytest.raises(TypeError, match='Message-API strategy'):
    inprocess.run(object(), grid, bridge.to_array_record({'w': np.zeros(2)}), num_rounds=1)


def test_task_identity_is_restored():
  saved = (TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id)
  with inprocess.task_identity(42, 43, 44):
    assert (TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id) == (42, 43, 44)
  assert (TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id) == saved


def test_dishonest_server_in_a_running_federation():
  """Only the target node trains from the crafted model; the others get the honest one, and
  the server decides membership from the target's upload."""
  m = 2
  model = common.mlp(hidden=(2 * m, 2))
  variables = common.init(model)
  data = common.shards(3, per_node=8, seed=4)
  target = (data[1][0][3], data[1][1][3])  # inside node 1002's data
  app = client.make_client_app(model, data, key=jax.random.key(0), optimizer=common.SGD,
                               epochs=1, batch_size=BATCH, matmul_precision='highest')
  grid = inprocess.InProcessGrid([app] * 3, raise_client_errors=True, keep_delivered=True)
  strategy = dishonest.DishonestStrategy(_fedavg(), model, target, nodes=[1002, 1003],
                                         num_components=m, optimizer=common.SGD,
                                         batch_size=BATCH)
  honest = bridge.to_array_record(variables)
  inprocess.run(strategy, grid, honest, num_rounds=1)
  train = {msg.metadata.dst_node_id: msg for msg in grid.delivered
           if msg.metadata.message_type == MessageType.TRAIN}
  honest_bytes = [(k, v.data) for k, v in honest.items()]
  assert [(k, v.data) for k, v in train[1001].content['arrays'].items()] == honest_bytes
  for node in (1002, 1003):
    crafted = bridge.from_array_record(train[node].content['arrays'], variables)
    assert float(crafted['params']['fc2']['bias'][0]) == pytest.approx(1e-3)
    assert [(k, v.data) for k, v in train[node].content['arrays'].items()] != honest_bytes
  decisions = {d.node_id: d for d in strategy.decisions}
  assert decisions[1002].member and not decisions[1003].member
  assert decisions[1003].delta == 0.0
