"""ReconstructionStrategy in a Flower deployment on the in-process grid, and its bad inputs."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from flwr.serverapp.strategy import FedAvg

from fl_privacy.attacks.reconstruction import imprint
from fl_privacy.attacks.reconstruction import metrics
from fl_privacy.flower import bridge
from fl_privacy.flower import client
from fl_privacy.flower.engines import inprocess
from fl_privacy.flower.strategies import reconstruction
from tests.flower import common

NODES, PER_NODE, BINS = 2, 4, 8


def _deployment():
  """Two nodes of 4 inputs in [0, 1], cuts placing each of the 8 alone in its bin."""
  rng = np.random.default_rng(3)
  x = rng.uniform(0, 1, (NODES * PER_NODE, common.DIM)).astype(np.float32)
  x += np.linspace(-0.3, 0.3, len(x), dtype=np.float32)[rng.permutation(len(x)), None]
  x = np.clip(x, 0, 1)
  y = rng.integers(0, common.NUM_CLASSES, len(x)).astype(np.int32)
  means = np.sort(x.mean(axis=1))
  cuts = np.concatenate([[means[0] - 0.01], (means[:-1] + means[1:]) / 2])
  shards = [(x[i * PER_NODE:(i + 1) * PER_NODE], y[i * PER_NODE:(i + 1) * PER_NODE])
            for i in range(NODES)]
  return shards, cuts


def _fedavg():
  return FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=NODES,
                min_available_nodes=NODES)


def test_strategy_recovers_a_one_step_batch_alone_in_its_bins_exactly():
  shards, cuts = _deployment()
  model = imprint.inject(common.mlp(), BINS)
  variables = model.init(jax.random.key(0), shards[0][0][:1])
  app = client.make_client_app(model, shards, key=jax.random.key(1), optimizer=common.SGD,
                               epochs=1, batch_size=PER_NODE, matmul_precision='highest')
  grid = inprocess.InProcessGrid([app] * NODES)
  strategy = reconstruction.ReconstructionStrategy(
      _fedavg(), variables, cuts, key=jax.random.key(2), nodes=grid.get_node_ids(),
      aggregate_targets=True)
  inprocess.run(strategy, grid, bridge.to_array_record(variables), num_rounds=1)
  assert sorted(r.node_id for r in strategy.recoveries) == grid.get_node_ids()
  for rec in strategy.recoveries:
    x_true = shards[grid.get_node_ids().index(rec.node_id)][0]
    assert rec.num_examples == PER_NODE and rec.valid.all()
    rows, cols = metrics.match(rec.inputs, x_true)
    err = np.abs(rec.inputs[rows] - x_true[cols]).max()
    assert err < metrics.EXACT, err
    assert sorted(rec.bins.tolist()) == sorted(
        np.searchsorted(cuts, x_true.mean(axis=1), side='right') - 1)


def test_nodes_get_models_crafted_with_their_own_keys():
  shards, cuts = _deployment()
  model = imprint.inject(common.mlp(), BINS)
  variables = model.init(jax.random.key(0), shards[0][0][:1])
  strategy = reconstruction.ReconstructionStrategy(
      _fedavg(), variables, cuts, key=jax.random.key(2), nodes=[1, 2])
  a, b = strategy.craft(variables, 1, 1), strategy.craft(variables, 1, 2)
  c = strategy.craft(variables, 2, 1)
  restore = lambda v: v['params'][imprint.RESTORE]['kernel']  # noqa: E731
  assert not np.allclose(restore(a), restore(b)) and not np.allclose(restore(a), restore(c))
  np.testing.assert_array_equal(a['params'][imprint.BASE]['fc1']['kernel'],
                                variables['params'][imprint.BASE]['fc1']['kernel'])


def test_bad_inputs_are_refused_naming_what_is_wrong():
  variables = common.init(common.mlp())
  with pytest.raises(ValueError, match='imprint.inject'):
    reconstruction.ReconstructionStrategy(_fedavg(), variables, np.zeros(BINS),
                                          key=jax.random.key(0), nodes=[1])
  imprinted = imprint.inject(common.mlp(), BINS).init(
      jax.random.key(0), np.zeros((1, common.DIM), np.float32))
  with pytest.raises(ValueError, match='8 thresholds'):
    reconstruction.ReconstructionStrategy(_fedavg(), imprinted, np.zeros(BINS - 1),
                                          key=jax.random.key(0), nodes=[1])
  with pytest.raises(ValueError, match='at least one target'):
    reconstruction.ReconstructionStrategy(_fedavg(), imprinted, np.zeros(BINS),
                                          key=jax.random.key(0), nodes=[])


def test_a_node_whose_client_app_fails_yields_an_empty_recovery_and_leaves_the_aggregate():
  shards, cuts = _deployment()
  model = imprint.inject(common.mlp(), BINS)
  variables = model.init(jax.random.key(0), shards[0][0][:1])
  # One shard for two nodes: the second node's ClientApp raises (partition-id out of range).
  app = client.make_client_app(model, shards[:1], key=jax.random.key(1), optimizer=common.SGD,
                               epochs=1, batch_size=PER_NODE, template=variables)
  grid = inprocess.InProcessGrid([app] * NODES)
  first, second = grid.get_node_ids()
  strategy = reconstruction.ReconstructionStrategy(
      _fedavg(), variables, cuts, key=jax.random.key(2), nodes=[second])
  inprocess.run(strategy, grid, bridge.to_array_record(variables), num_rounds=1)
  (rec,) = strategy.recoveries
  assert rec.node_id == second and rec.num_examples == -1 and rec.inputs.shape == (0, common.DIM)
  assert first not in {n for _, n in strategy.sent}
