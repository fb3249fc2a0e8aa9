"""FedSGD / FedAvg local training: equivalences, vmap, keys, shuffling."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fl_privacy import fl
from fl_privacy import models
from fl_privacy.fl import local
from fl_privacy.fl import optimizers

KEY = jax.random.key(0)


@pytest.fixture(scope='module')
def setup():
  model = models.MLP(hidden=(6,), num_classes=3)
  x = jax.random.normal(jax.random.key(1), (4, 8, 5))  # 4 clients x 8 examples
  y = jax.random.randint(jax.random.key(2), (4, 8), 0, 3)
  params = model.init(KEY, x[0])
  return fl.make_loss_fn(model.apply), params, x, y


def _sgd_step(loss_fn, params, x, y, lr):
  g = jax.grad(loss_fn)(params, x, y)
  return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, g)


def test_fedavg_one_epoch_one_batch_is_fedsgd_step(setup):
  loss_fn, params, x, y = setup
  got = fl.fedavg(loss_fn, params, x[0], y[0], key=KEY,
                  optimizer=optimizers.make('sgd', 0.3), epochs=1,
                  batch_size=8)
  grads = fl.fedsgd(loss_fn, params, x[0], y[0])
  want = jax.tree_util.tree_map(lambda p, g: p - 0.3 * g, params, grads)
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(
      local.fedsgd_step(loss_fn, params, x[0], y[0], learning_rate=0.3), want,
      rtol=1e-6, atol=1e-7)


def test_fedavg_without_shuffle_is_sequential_sgd(setup):
  loss_fn, params, x, y = setup
  got = fl.fedavg(loss_fn, params, x[0], y[0], key=KEY,
                  optimizer=optimizers.make('sgd', 0.2), epochs=2,
                  batch_size=4, shuffle=False)
  want = params
  for _ in range(2):
    for j in range(2):
      want = _sgd_step(loss_fn, want, x[0, 4 * j:4 * j + 4],
                       y[0, 4 * j:4 * j + 4], 0.2)
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-6)


def test_fedavg_follows_batch_order(setup):
  loss_fn, params, x, y = setup
  got = fl.fedavg(loss_fn, params, x[0], y[0], key=KEY,
                  optimizer=optimizers.make('sgd', 0.2), epochs=2,
                  batch_size=3)
  order = local.batch_order(KEY, 8, epochs=2, batch_size=3)
  assert order.shape == (4, 3)
  want = params
  for idx in np.asarray(order):
    want = _sgd_step(loss_fn, want, x[0, idx], y[0, idx], 0.2)
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('name', ['momentum', 'adam'])
def test_vmap_over_clients_equals_loop(setup, name):
  loss_fn, params, x, y = setup
  train = functools.partial(fl.fedavg, loss_fn, optimizer=optimizers.make(
      name, 0.05), epochs=2, batch_size=4)
  keys = jax.vmap(lambda k: jax.random.fold_in(KEY, k))(jnp.arange(4))
  got = jax.jit(jax.vmap(lambda x, y, k: train(params, x, y, key=k)))(
      x, y, keys)
  one = jax.jit(lambda x, y, k: train(params, x, y, key=k))
  for k in range(4):
    want = one(x[k], y[k], jax.random.fold_in(KEY, k))
    chex.assert_trees_all_close(jax.tree_util.tree_map(lambda t: t[k], got),
                                want, rtol=1e-5, atol=1e-6)


def test_same_key_same_result_different_key_different_shuffle(setup):
  loss_fn, params, x, y = setup
  train = functools.partial(fl.fedavg, loss_fn, params, x[0], y[0],
                            optimizer=optimizers.make('sgd', 0.5), epochs=1,
                            batch_size=2)
  a = train(key=jax.random.key(7))
  chex.assert_trees_all_equal(a, train(key=jax.random.key(7)))
  b = train(key=jax.random.key(8))
  assert not np.allclose(a['params']['fc1']['kernel'],
                         b['params']['fc1']['kernel'])
  order_a = local.batch_order(jax.random.key(7), 8, epochs=1, batch_size=2)
  order_b = local.batch_order(jax.random.key(8), 8, epochs=1, batch_size=2)
  assert not np.array_equal(order_a, order_b)


def test_batch_order_is_a_permutation_per_epoch():
  order = np.asarray(local.batch_order(KEY, 10, epochs=3, batch_size=3))
  assert order.shape == (9, 3)  # J = 10 // 3 = 3 steps per epoch
  epochs = order.reshape(3, 9)
  for e in epochs:
    assert len(set(e.tolist())) == 9 and e.max() < 10
  assert not np.array_equal(epochs[0], epochs[1])
  plain = np.asarray(local.batch_order(KEY, 10, epochs=2, batch_size=5,
                                       shuffle=False))
  np.testing.assert_array_equal(plain, np.tile(np.arange(10), 2).reshape(4, 5))


def test_shuffle_is_uniform():
  # Example 0 lands in the first minibatch with probability B / N = 0.25.
  n_keys = 2000
  keys = jax.vmap(lambda i: jax.random.fold_in(KEY, i))(jnp.arange(n_keys))
  orders = jax.vmap(lambda k: local.batch_order(k, 8, epochs=1, batch_size=2))(
      keys)
  hits = int(np.sum(np.any(np.asarray(orders[:, 0, :]) == 0, axis=1)))
  assert stats.binomtest(hits, n_keys, 0.25).pvalue > 1e-3


def test_bad_batch_size_raises(setup):
  loss_fn, params, x, y = setup
  with pytest.raises(ValueError, match='batch_size'):
    fl.fedavg(loss_fn, params, x[0], y[0], key=KEY,
              optimizer=optimizers.make('sgd', 0.1), epochs=1, batch_size=9)


def test_batch_order_messages_and_bounds():
  for bad in (0, 11):
    with pytest.raises(ValueError, match=rf'^batch_size must be in \[1, 10\] \(got {bad}\)$'):
      local.batch_order(KEY, 10, epochs=1, batch_size=bad)
  with pytest.raises(ValueError, match=r'^epochs must be >= 1 \(got 0\)$'):
    local.batch_order(KEY, 10, epochs=0, batch_size=2)
  np.testing.assert_array_equal(
      local.batch_order(KEY, 3, epochs=1, batch_size=1, shuffle=False), [[0], [1], [2]])
  np.testing.assert_array_equal(
      local.batch_order(KEY, 3, epochs=1, batch_size=3, shuffle=False), [[0, 1, 2]])
