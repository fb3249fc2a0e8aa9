"""RecordingStrategy and DishonestStrategy fed replies directly (no grid traffic, no network).

As Flower's own strategy tests do: a stand-in grid that only lists node ids, the strategy's
configure_train messages, and reply Messages built with `Message(content, reply_to=...)`.
"""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg, FedMedian

from fl_privacy.attacks import dishonest
from fl_privacy.fl import queries
from fl_privacy.flower import bridge
from fl_privacy.flower.strategies import dishonest as dishonest_lib
from fl_privacy.flower.strategies import recording
from tests.flower import common

NODES = (11, 22, 33)


class NodeList:
  """The part of a Grid that FedAvg.configure_train uses."""

  def __init__(self, nodes=NODES):
    self.nodes = list(nodes)

  def get_node_ids(self):
    return list(self.nodes)


def _perturbed(tree, seed):
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
      lambda a: (np.asarray(a) + rng.normal(size=np.shape(a)).astype(np.float32) * 0.01), tree)


def _replies(messages, variables, *, error_node=None):
  """One reply per message: node-specific local params, weight 10 * (index + 1)."""
  replies, sent = [], {}
  for i, msg in enumerate(sorted(messages, key=lambda m: m.metadata.dst_node_id)):
    node = msg.metadata.dst_node_id
    if node == error_node:
      replies.append(Message(Error(code=2, reason='boom'), reply_to=msg))
      continue
    local = _perturbed(variables, node)
    sent[node] = (local, 10 * (i + 1))
    content = RecordDict({'arrays': bridge.to_array_record(local),
                          'metrics': MetricRecord({'num-examples': 10 * (i + 1),
                                                   'train_loss': 0.5 + i})})
    replies.append(Message(content, reply_to=msg))
  return replies, sent


def _fedavg():
  return FedAvg(min_train_nodes=3, min_available_nodes=3, min_evaluate_nodes=3)


def _bits_equal(a, b):
  a, b = np.asarray(a), np.asarray(b)
  return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _tree_bits_equal(a, b):
  return all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(_bits_equal, a, b)))


def _record_bytes(record: ArrayRecord):
  return [(k, v.dtype, tuple(v.shape), v.data) for k, v in record.items()]


def test_recorded_uploads_equal_what_the_clients_sent():
  variables = common.init(common.mlp())
  log = recording.UploadLog()
  strategy = recording.RecordingStrategy(_fedavg(), variables, observer=log)
  arrays = bridge.to_array_record(variables)
  messages = strategy.configure_train(1, arrays, ConfigRecord(), NodeList())
  replies, sent = _replies(messages, variables, error_node=22)
  strategy.aggregate_train(1, replies)
  (r,) = log.rounds
  assert r.server_round == 1
  assert sorted(r.node_ids.tolist()) == [11, 33] and r.failures.tolist() == [22]
  assert _tree_bits_equal(r.global_params, variables)
  assert r.sent == {}  # FedAvg sends w_t to everyone
  for node, upload, weight in zip(r.node_ids, r.uploads, r.num_examples):
    local, n = sent[int(node)]
    assert _tree_bits_equal(upload, local) and weight == n
    delta = r.update(int(node))
    assert _tree_bits_equal(delta, jax.tree_util.tree_map(np.subtract, variables, local))
  with pytest.raises(KeyError, match='node 22 uploaded nothing'):
    r.update(22)


def test_the_inner_aggregate_is_bit_identical_to_the_unwrapped_strategy():
  variables = common.init(common.mlp())
  arrays = bridge.to_array_record(variables)
  for make in (_fedavg, lambda: FedMedian(min_train_nodes=3, min_available_nodes=3)):
    plain = make()
    wrapped = recording.RecordingStrategy(make(), variables, observer=recording.UploadLog())
    config = ConfigRecord({'lr': 0.1})
    plain_msgs = list(plain.configure_train(1, arrays, ConfigRecord({'lr': 0.1}), NodeList()))
    wrapped_msgs = wrapped.configure_train(1, arrays, config, NodeList())
    assert sorted(m.metadata.dst_node_id for m in wrapped_msgs) == list(NODES)
    for m in wrapped_msgs:  # the messages are the inner strategy's: same content
      assert m.content['arrays'] is arrays and m.content['config']['server-round'] == 1
    replies, _ = _replies(plain_msgs, variables)
    # FedMedian pops the arrays out of the replies: each strategy gets its own copy.
    want_arrays, want_metrics = plain.aggregate_train(1, copy.deepcopy(replies))
    got_arrays, got_metrics = wrapped.aggregate_train(1, replies)
    assert _record_bytes(got_arrays) == _record_bytes(want_arrays)
    assert dict(got_metrics) == dict(want_metrics)
    assert wrapped.aggregate_evaluate(1, []) == plain.aggregate_evaluate(1, [])


def test_rounds_stream_to_npz_files_that_load_back_identically(tmp_path):
  variables = common.init(common.mlp())
  log = recording.UploadLog()
  strategy = recording.RecordingStrategy(_fedavg(), variables, directory=tmp_path,
                                         observer=log)
  arrays = bridge.to_array_record(variables)
  for t in (1, 2):
    messages = strategy.configure_train(t, arrays, ConfigRecord(), NodeList())
    strategy.aggregate_train(t, _replies(messages, variables, error_node=33 * (t == 2))[0])
  assert sorted(p.name for p in tmp_path.iterdir()) == ['round_00001.npz', 'round_00002.npz']
  loaded = recording.load_rounds(tmp_path, variables)
  for mem, disk in zip(log.rounds, loaded):
    assert disk.server_round == mem.server_round
    np.testing.assert_array_equal(disk.node_ids, mem.node_ids)
    np.testing.assert_array_equal(disk.num_examples, mem.num_examples)
    np.testing.assert_array_equal(disk.failures, mem.failures)
    assert _tree_bits_equal(disk.global_params, mem.global_params)
    assert len(disk.uploads) == len(mem.uploads)
    assert all(_tree_bits_equal(a, b) for a, b in zip(disk.uploads, mem.uploads))
  with pytest.raises(bridge.RecordMismatchError, match="'global/params/fc1/bias'"):
    recording.load_round(tmp_path / 'round_00001.npz', common.init(common.mlp((5, 4))))


def test_recording_from_uploads_is_queries_measure_of_the_updates():
  model = common.mlp()
  variables = common.init(model)
  log = recording.UploadLog()
  strategy = recording.RecordingStrategy(_fedavg(), variables, observer=log)
  globals_ = [variables, _perturbed(variables, 99)]
  for t, w in enumerate(globals_, start=1):
    messages = strategy.configure_train(t, bridge.to_array_record(w), ConfigRecord(),
                                        NodeList())
    strategy.aggregate_train(t, _replies(messages, w)[0])
  qx, qy = common.synthetic(5, 7)
  rec = recording.recording_from_uploads(model.apply, log.rounds, qx, qy, chunk_size=3)
  assert rec['loss'].shape == rec['cos'].shape == rec['diff'].shape == (2, 3, 7)
  assert rec['grad_sq'].shape == (2, 7) and rec['loss'].dtype == np.float32
  np.testing.assert_array_equal(rec['rounds'], [0, 1])
  np.testing.assert_array_equal(rec['node_ids'], sorted(NODES))
  np.testing.assert_array_equal(rec['num_examples'], [[10, 20, 30]] * 2)
  for i, r in enumerate(log.rounds):
    deltas = jax.tree_util.tree_map(lambda *d: jnp.stack(d),
                                    *[r.update(n) for n in sorted(NODES)])
    want = queries.measure_numpy(model.apply, jax.tree_util.tree_map(jnp.asarray,
                                                                     r.global_params),
                                 deltas, qx, qy, chunk_size=3)
    for name in ('loss', 'cos', 'diff', 'grad_sq'):
      np.testing.assert_array_equal(rec[name][i], getattr(want, name))
  # A node missing from a round cannot fill the [R, K, Q] layout.
  messages = strategy.configure_train(3, bridge.to_array_record(variables), ConfigRecord(),
                                      NodeList())
  strategy.aggregate_train(3, _replies(messages, variables, error_node=22)[0])
  with pytest.raises(ValueError, match=r'round 3 has no upload of node\(s\) \[22\]'):
    recording.recording_from_uploads(model.apply, log.rounds, qx, qy)
  sub = recording.recording_from_uploads(model.apply, log.rounds, qx, qy, chunk_size=3,
                                         node_ids=[33, 11])
  np.testing.assert_array_equal(sub['node_ids'], [33, 11])
  # Same measurements up to float rounding (XLA's programs differ with K).
  np.testing.assert_allclose(sub['loss'][:2], rec['loss'][:, [2, 0]], rtol=1e-6, atol=1e-6)


def test_wrong_inner_type_is_refused():
  variables = common.init(common.mlp())
  from flwr.server.strategy import FedAvg as LegacyFedAvg  # pylint: disable=import-outside-toplevel
  for inner in (object(), LegacyFedAvg()):
    with pytest.raises(TypeError, match=r'flwr\.serverapp\.strategy\.Strategy'):
      recording.RecordingStrategy(inner, variables, observer=recording.UploadLog())
  with pytest.raises(TypeError, match='legacy'):
    dishonest_lib.DishonestStrategy(LegacyFedAvg(), common.mlp(), (np.zeros(8), 0), nodes=[1],
                                    num_components=1, optimizer=common.SGD, batch_size=4)

  class OwnLoop(FedAvg):
    def start(self, *args, **kwargs):  # pylint: disable=signature-differs
      raise AssertionError

  with pytest.raises(TypeError, match='overrides start'):
    recording.RecordingStrategy(OwnLoop(), variables, observer=recording.UploadLog())
  with pytest.raises(ValueError, match='records nothing'):
    recording.RecordingStrategy(FedAvg(), variables)


def test_aggregate_without_configure_is_refused():
  variables = common.init(common.mlp())
  strategy = recording.RecordingStrategy(_fedavg(), variables, observer=recording.UploadLog())
  with pytest.raises(RuntimeError, match='without its configure_train'):
    strategy.aggregate_train(4, [])


# --- DishonestStrategy ----------------------------------------------------------------------

M = 2


def _dishonest(target, inner=None, **kw):
  model = common.mlp(hidden=(2 * M, 2))
  kw = dict(dict(nodes=[22], num_components=M, optimizer=common.SGD, batch_size=4), **kw)
  return model, dishonest_lib.DishonestStrategy(inner or _fedavg(), model, target, **kw)


def test_crafted_model_goes_to_the_target_node_only():
  x, y = common.synthetic(1, 5)
  model, strategy = _dishonest((x[0], y[0]))
  variables = common.init(model)
  arrays = bridge.to_array_record(variables)
  messages = strategy.configure_train(1, arrays, ConfigRecord({'lr': 0.1}), NodeList())
  by_node = {m.metadata.dst_node_id: m for m in messages}
  assert sorted(by_node) == list(NODES)
  for node in (11, 33):
    assert by_node[node].content['arrays'] is arrays
  target = by_node[22]
  assert target.content['arrays'] is not arrays
  assert target.content['config']['server-round'] == 1 and target.content['config']['lr'] == 0.1
  assert target.metadata.message_type == by_node[11].metadata.message_type
  crafted = bridge.from_array_record(target.content['arrays'], variables)
  h_t = model.apply(variables, x[:1], method='embed')[0]
  want, _ = dishonest.craft(variables, h_t, y[0], M, 1e-3)
  assert _tree_bits_equal(crafted, jax.tree_util.tree_map(np.asarray, want))
  assert float(dishonest.detector_bias(crafted)) == pytest.approx(1e-3)
  # Evaluation is honest for everyone.
  evals = strategy.configure_evaluate(1, arrays, ConfigRecord(), NodeList())
  assert all(m.content['arrays'] is arrays for m in evals)


def test_unattacked_rounds_and_unsampled_targets_pass_through():
  x, y = common.synthetic(1, 5)
  # (FedAvg waits for min_available_nodes: two nodes must do.)
  inner = FedAvg(min_train_nodes=2, min_available_nodes=2, min_evaluate_nodes=2)
  _, strategy = _dishonest((x[0], y[0]), inner, rounds=[2])
  variables = common.init(common.mlp(hidden=(2 * M, 2)))
  arrays = bridge.to_array_record(variables)
  assert all(m.content['arrays'] is arrays
             for m in strategy.configure_train(1, arrays, ConfigRecord(), NodeList()))
  assert all(m.content['arrays'] is arrays
             for m in strategy.configure_train(2, arrays, ConfigRecord(), NodeList((11, 33))))


def _client_reply(model, msg, x, y, *, epochs=1):
  """What an honest client does with the message: local FedAvg, reply with the new params."""
  from fl_privacy.fl import local, losses  # pylint: disable=import-outside-toplevel
  variables = jax.tree_util.tree_map(jnp.asarray, bridge.from_array_record(
      msg.content['arrays'], common.init(model)))
  with jax.default_matmul_precision('highest'):
    trained = local.fedavg(losses.make_loss_fn(model.apply), variables, x, y,
                           key=jax.random.key(msg.metadata.dst_node_id),
                           optimizer=common.SGD, epochs=epochs, batch_size=4)
  content = RecordDict({'arrays': bridge.to_array_record(trained),
                        'metrics': MetricRecord({'num-examples': len(x)})})
  return Message(content, reply_to=msg)


@pytest.mark.parametrize('member', [True, False])
def test_decision_from_the_target_upload(member):
  x, y = common.synthetic(2, 40)
  target = (x[0], y[0])
  model, strategy = _dishonest(target, aggregate_targets=False)
  variables = common.init(model)
  arrays = bridge.to_array_record(variables)
  messages = strategy.configure_train(1, arrays, ConfigRecord(), NodeList())
  data = {11: (x[8:16], y[8:16]), 22: (x[0:8], y[0:8]) if member else (x[16:24], y[16:24]),
          33: (x[24:32], y[24:32])}
  replies = [_client_reply(model, m, *data[m.metadata.dst_node_id]) for m in messages]
  got, _ = strategy.aggregate_train(1, replies)
  (decision,) = strategy.decisions
  assert decision.node_id == 22 and decision.server_round == 1
  assert decision.member is member
  if member:  # the target in one batch of B of one epoch: Delta about 1 (Eq. (9))
    assert decision.delta == pytest.approx(1.0, rel=0.05)
  else:
    assert decision.delta == 0.0 and decision.eps_client == decision.epsilon
  # The target's reply is left out of the aggregate.
  honest = [r for r in replies if r.metadata.src_node_id != 22]
  want, _ = _fedavg().aggregate_train(1, honest)
  assert _record_bytes(got) == _record_bytes(want)


def test_dishonest_argument_checks():
  x, y = common.synthetic(1, 2)
  with pytest.raises(ValueError, match='at least one target node'):
    _dishonest((x[0], y[0]), nodes=[])
  with pytest.raises(ValueError, match='num_components must be a positive integer'):
    _dishonest((x[0], y[0]), num_components=0)
  with pytest.raises(ValueError, match='target label must be a scalar'):
    _dishonest((x[0], y[:1]))
  with pytest.raises(ValueError, match=r'M=3 needs M <= 8 features and 2M <= 4 units of fc1'):
    _dishonest((x[0], y[0]), num_components=3)
  with pytest.raises(ValueError, match=r"no dense layer\(s\) \['fc4'\]"):
    _dishonest((x[0], y[0]), layers=('fc1', 'fc2', 'fc4'))


def test_recording_around_the_dishonest_server_keeps_what_each_node_received():
  x, y = common.synthetic(1, 5)
  model, dishonest_server = _dishonest((x[0], y[0]))
  variables = common.init(model)
  log = recording.UploadLog()
  strategy = recording.RecordingStrategy(dishonest_server, variables, observer=log)
  arrays = bridge.to_array_record(variables)
  messages = strategy.configure_train(1, arrays, ConfigRecord(), NodeList())
  strategy.aggregate_train(1, _replies(messages, variables)[0])
  (r,) = log.rounds
  assert sorted(r.sent) == [22]
  target_msg = next(m for m in messages if m.metadata.dst_node_id == 22)
  assert _tree_bits_equal(r.received(22), bridge.from_array_record(target_msg.content['arrays'],
                                                                   variables))
  assert _tree_bits_equal(r.received(11), variables)
  assert len(dishonest_server.decisions) == 1


def test_unusable_target_replies_give_no_decision():
  x, y = common.synthetic(1, 5)
  model, strategy = _dishonest((x[0], y[0]))
  variables = common.init(model)
  messages = strategy.configure_train(1, bridge.to_array_record(variables), ConfigRecord(),
                                      NodeList())
  replies, _ = _replies(messages, variables, error_node=22)
  strategy.aggregate_train(1, replies)
  messages = strategy.configure_train(2, bridge.to_array_record(variables), ConfigRecord(),
                                      NodeList())
  replies, _ = _replies(messages, variables)
  for r in replies:
    if r.metadata.src_node_id == 22:
      r.content['arrays'].pop('params/fc2/bias')
  strategy.aggregate_train(2, replies)
  assert [(d.server_round, d.member) for d in strategy.decisions] == [(1, False), (2, False)]
  assert all(np.isnan(d.delta) for d in strategy.decisions)
