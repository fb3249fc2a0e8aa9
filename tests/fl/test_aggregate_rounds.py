"""Aggregation and the round loop."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl_privacy import fl
from fl_privacy import models
from fl_privacy.fl import aggregate
from fl_privacy.fl import local
from fl_privacy.fl import optimizers
from fl_privacy.fl import rounds

KEY = jax.random.key(0)


def test_mean_and_weighted_mean_match_numpy():
  rng = np.random.default_rng(0)
  trees = {'a': rng.normal(size=(4, 3)).astype(np.float32),
           'b': {'c': rng.normal(size=(4, 2, 2)).astype(np.float32)}}
  weights = np.array([1.0, 3.0, 0.0, 6.0])
  got = aggregate.weighted_mean(trees, weights)
  np.testing.assert_allclose(got['a'], np.average(trees['a'], 0, weights),
                             rtol=1e-5)
  np.testing.assert_allclose(got['b']['c'],
                             np.average(trees['b']['c'], 0, weights), rtol=1e-5)
  chex.assert_trees_all_close(aggregate.mean(trees),
                              aggregate.weighted_mean(trees, np.ones(4)),
                              rtol=1e-6)
  np.testing.assert_allclose(aggregate.mean(trees)['a'], trees['a'].mean(0),
                             rtol=1e-6)


@pytest.fixture(scope='module')
def setup():
  model = models.MLP(hidden=(4,), num_classes=3)
  x = jax.random.normal(jax.random.key(1), (3, 6, 5))  # 3 clients x 6
  y = jax.random.randint(jax.random.key(2), (3, 6), 0, 3)
  return fl.make_loss_fn(model.apply), model.init(KEY, x[0]), x, y


def test_one_round_of_fedsgd(setup):
  loss_fn, params, x, y = setup
  step = functools.partial(local.fedsgd_step, learning_rate=0.5)
  final, updates = rounds.run(loss_fn, params, x, y, key=KEY, num_rounds=1,
                              local_fn=step)
  grads = fl.client_grads(loss_fn, params, x, y)
  chex.assert_trees_all_close(
      updates, jax.tree_util.tree_map(lambda g: 0.5 * g[None], grads),
      rtol=1e-5, atol=1e-6)
  want = jax.tree_util.tree_map(lambda p, g: p - 0.5 * g.mean(0), params,
                                grads)
  chex.assert_trees_all_close(final, want, rtol=1e-5, atol=1e-6)


def _noisy_local(loss_fn, params, x, y, *, key, scale=1.0):
  # Randomness from the client key only, so the test can see which key ran.
  del loss_fn, x, y
  leaves, tree = jax.tree_util.tree_flatten(params)
  noise = [scale * jax.random.normal(jax.random.fold_in(key, i), l.shape)
           for i, l in enumerate(leaves)]
  return jax.tree_util.tree_unflatten(tree, [l + n for l, n in
                                             zip(leaves, noise)])


def test_client_keys_and_loop_against_python_reference(setup):
  loss_fn, params, x, y = setup
  weights = jnp.array([1.0, 2.0, 3.0])
  agg = functools.partial(aggregate.weighted_mean, weights=weights)
  final, seen = rounds.run(loss_fn, params, x, y, key=KEY, num_rounds=3,
                           local_fn=_noisy_local, aggregate_fn=agg)
  chex.assert_tree_shape_prefix(seen, (3, 3))
  w = params
  for t in range(3):
    locals_ = [_noisy_local(loss_fn, w, x[k], y[k],
                            key=jax.random.fold_in(jax.random.fold_in(KEY, t),
                                                   k)) for k in range(3)]
    for k in range(3):
      chex.assert_trees_all_close(
          jax.tree_util.tree_map(lambda s: s[t, k], seen),
          jax.tree_util.tree_map(jnp.subtract, w, locals_[k]),
          rtol=1e-5, atol=1e-5)
    w = agg(jax.tree_util.tree_map(lambda *ls: jnp.stack(ls), *locals_))
  chex.assert_trees_all_close(final, w, rtol=1e-5, atol=1e-5)


def test_split_run_equals_whole_run(setup):
  loss_fn, params, x, y = setup
  train = functools.partial(local.fedavg, optimizer=optimizers.make('sgd', 0.1),
                            epochs=1, batch_size=3)
  run = functools.partial(rounds.run, loss_fn, client_x=x, client_y=y,
                          key=KEY, local_fn=train)
  whole, seen = run(params, num_rounds=2)
  half, first = run(params, num_rounds=1)
  rest, second = run(half, num_rounds=1, first_round=1)
  chex.assert_trees_all_close(whole, rest, rtol=1e-6, atol=1e-6)
  chex.assert_trees_all_close(
      seen, jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]),
                                   first, second), rtol=1e-6, atol=1e-6)


def test_round_kwargs_and_custom_observe(setup):
  loss_fn, params, x, y = setup
  lrs = jnp.array([0.0, 0.5])
  observe = lambda g, l, t: (t, jnp.linalg.norm(  # noqa: E731
      g['params']['fc1']['kernel'] - l['params']['fc1']['kernel']))
  final, (ts, norms) = rounds.run(
      loss_fn, params, x, y, key=KEY, num_rounds=2, local_fn=local.fedsgd_step,
      observe=observe, round_kwargs=lambda t: {'learning_rate': lrs[t]})
  np.testing.assert_array_equal(ts, [[0, 0, 0], [1, 1, 1]])
  np.testing.assert_array_equal(norms[0], np.zeros(3))
  assert np.all(np.asarray(norms[1]) > 0)
  grads = fl.client_grads(loss_fn, params, x, y)
  want = jax.tree_util.tree_map(lambda p, g: p - 0.5 * g.mean(0), params,
                                grads)
  chex.assert_trees_all_close(final, want, rtol=1e-5, atol=1e-6)
