"""FedSGD / FedAvg local training: equivalences, vmap, keys, shuffling."""

from __future__ import annotations

import functools

import chex
import jax
from jax import flatten_util
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


# ----------------------------------------------------------------------------------------------
# The per-step trace (`local.Step`): an instrument that changes nothing.

from fl_privacy.fl import client  # pylint: disable=g-import-not-at-top,wrong-import-position
from fl_privacy.fl import sampling  # pylint: disable=g-import-not-at-top,wrong-import-position

MASK = jnp.asarray([1, 0, 1, 1, 1, 0, 1, 0], jnp.float32)  # 5 real rows of 8


def _everything(step):
  return step._replace(key=jax.random.key_data(step.key))


def _noisy_mean(key, per_example, mask):
  # A grad hook whose output differs from the plain mean (noise from its key), so a trace that
  # showed the default gradient instead of the hook's would fail.
  mean = jax.tree_util.tree_map(
      lambda g: jnp.tensordot(mask, g, axes=1) / jnp.maximum(jnp.sum(mask), 1.0), per_example)
  return jax.tree_util.tree_map(
      lambda g: g + 0.01 * jax.random.normal(key, g.shape), mean)


def _leaf(tree, i):
  return jax.tree_util.tree_map(lambda a: a[i], tree)


@pytest.mark.parametrize('name', ['sgd', 'adam'])
@pytest.mark.parametrize('mask', [None, 'padded'])
@pytest.mark.parametrize('grad', [None, 'hook'])
def test_a_trace_leaves_training_bit_for_bit_unchanged(setup, name, mask, grad):
  """`fedavg(trace=...)` returns the parameters `fedavg` returns without one, bit for bit (with
  identity hooks the traced run takes the hooked path, documented to equal plain FedAvg), and
  `client_update(trace=...)` returns the same traces as its third output."""
  loss_fn, params, x, y = setup
  hooks = None if grad is None else client.ClientHooks(grad=_noisy_mean)
  kw = dict(key=KEY, optimizer=optimizers.make(name, 0.05), epochs=2, batch_size=3,
            hooks=hooks, mask=None if mask is None else MASK)
  plain = local.fedavg(loss_fn, params, x[0], y[0], **kw)
  traced, traces = local.fedavg(loss_fn, params, x[0], y[0], trace=_everything, **kw)
  chex.assert_trees_all_equal(traced, plain)
  upload, trained, again = local.client_update(loss_fn, params, x[0], y[0], trace=_everything,
                                               **kw)
  chex.assert_trees_all_equal(trained, plain)
  chex.assert_trees_all_equal(upload, client.update(params, plain))
  chex.assert_trees_all_equal(again, traces)
  steps = 2 * (8 // 3 if mask is None else -(-8 // 3))  # E x S
  assert traces.live.shape == (steps,)


def test_live_flags_count_the_steps_that_ran_and_skipped_steps_keep_the_params(setup):
  """Shuffled unpadded shard: all E x floor(N / B) steps run. Padded shard (5 real rows of 8,
  B = 2: S = 4 steps an epoch): E x ceil(5 / 2) = 6 of the 8 steps run, a step runs exactly
  when its batch has a real row, and a step with live 0 leaves the parameters where they were
  (a live one moves them)."""
  loss_fn, params, x, y = setup
  kw = dict(key=KEY, optimizer=optimizers.make('sgd', 0.3), epochs=2, batch_size=2)
  _, plain = local.fedavg(loss_fn, params, x[0], y[0], trace=lambda s: s.live, **kw)
  np.testing.assert_array_equal(plain, np.ones(2 * 4))
  final, traces = local.fedavg(loss_fn, params, x[0], y[0], mask=MASK, trace=_everything, **kw)
  live = np.asarray(traces.live)
  assert live.shape == (8,) and live.sum() == 6
  np.testing.assert_array_equal(live, np.asarray(traces.row_mask).any(1))
  after = [_leaf(traces.params, i + 1) for i in range(7)] + [final]
  for i in range(8):
    moved = not all(np.array_equal(a, b) for a, b in zip(
        jax.tree_util.tree_leaves(after[i]), jax.tree_util.tree_leaves(_leaf(traces.params, i))))
    assert moved == bool(live[i]), i


def test_poisson_steps_with_empty_batches_are_live(setup):
  """Under a Poisson sampler (public schedule N = 8, B = 1: q = 1/8, S = 8 steps an epoch)
  every step of the schedule runs, empty batches included: the live flags sum to E x S = 16
  though some steps select no row, and with a noising grad hook such a step moves the model."""
  loss_fn, params, x, y = setup
  hooks = client.ClientHooks(grad=_noisy_mean, batches=sampling.poisson_sampler(
      8, num_examples=8, batch_size=1))
  final, traces = local.fedavg(loss_fn, params, x[0], y[0], key=KEY, hooks=hooks, epochs=2,
                               batch_size=1, optimizer=optimizers.make('sgd', 0.3),
                               trace=_everything)
  live, rows = np.asarray(traces.live), np.asarray(traces.row_mask)
  assert live.shape == (16,) and live.sum() == 16
  empty = np.flatnonzero(rows.sum(1) == 0)
  assert 0 < len(empty) < 16  # P[empty] = (7/8)^8 ~ 0.34 a step: some, not all
  after = [_leaf(traces.params, i + 1) for i in range(15)] + [final]
  for i in empty:
    assert not np.array_equal(after[i]['params']['fc1']['kernel'],
                              traces.params['params']['fc1']['kernel'][i])


def test_traced_grad_is_the_steps_gradient_and_per_example_none_without_a_grad_hook(setup):
  """Without a grad hook `per_example` is None and `grad` is the gradient of the batch's mean
  loss at the step's params, over its rows and row mask; the step's key is
  `step_key(key, e, j)`; SGD then steps by -lr grad."""
  loss_fn, params, x, y = setup
  kw = dict(key=KEY, optimizer=optimizers.make('sgd', 0.3), epochs=2, batch_size=3)
  _, per_example = local.fedavg(loss_fn, params, x[0], y[0], mask=MASK,
                                trace=lambda s: s.per_example, **kw)
  assert per_example is None
  final, tr = local.fedavg(loss_fn, params, x[0], y[0], mask=MASK, trace=_everything, **kw)
  steps = 2 * 3
  for i in range(steps):
    e, j = divmod(i, 3)
    np.testing.assert_array_equal(tr.key[i], jax.random.key_data(client.step_key(KEY, e, j)))
    p, idx, m = _leaf(tr.params, i), tr.indices[i], tr.row_mask[i]
    chex.assert_trees_all_close(_leaf(tr.grad, i), jax.grad(loss_fn)(p, x[0][idx], y[0][idx], m),
                                rtol=1e-5, atol=1e-6)
    nxt = final if i == steps - 1 else _leaf(tr.params, i + 1)
    if tr.live[i]:
      chex.assert_trees_all_close(nxt, jax.tree_util.tree_map(
          lambda a, g: a - 0.3 * g, p, _leaf(tr.grad, i)), rtol=1e-5, atol=1e-6)


def test_traced_per_example_gradients_are_each_rows_and_grad_the_hooks_output(setup):
  """With a grad hook, `per_example[r]` is jax.grad of the loss on row r alone (its row mask),
  and `grad` is the hook's output on them with the step's grad key fold_in(step_key, 2)."""
  loss_fn, params, x, y = setup
  _, tr = local.fedavg(loss_fn, params, x[0], y[0], key=KEY, mask=MASK,
                       hooks=client.ClientHooks(grad=_noisy_mean), trace=_everything,
                       optimizer=optimizers.make('sgd', 0.3), epochs=1, batch_size=3)
  one = jax.jit(lambda p, xi, yi, mi: jax.grad(loss_fn)(p, xi[None], yi[None], mi[None]))
  for i in range(3):
    p, idx, m = _leaf(tr.params, i), tr.indices[i], tr.row_mask[i]
    pe = _leaf(tr.per_example, i)
    for r in range(3):
      chex.assert_trees_all_close(_leaf(pe, r), one(p, x[0][idx[r]], y[0][idx[r]], m[r]),
                                  rtol=1e-5, atol=1e-6)
    k_grad = jax.random.fold_in(jax.random.wrap_key_data(tr.key[i]), 2)
    chex.assert_trees_all_close(_leaf(tr.grad, i), _noisy_mean(k_grad, pe, m),
                                rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------------------------
# canary_loss: a canary client's local training.


def test_canary_loss_gradient_is_its_row_and_one_sgd_step_gives_the_update(setup):
  """grad <d, w> = d exactly, whatever w, y and mask; one step of CANARY_OPTIMIZER at
  CANARY_EPOCHS / CANARY_BATCH on the one-row shard d gives the update w - fl(w - d): d bit for
  bit when w - d is exact (dyadic w and d), and within two ulps of max|w| otherwise. The same
  eagerly, under jit and vmapped over canaries."""
  _, params, _, _ = setup
  flat, unravel = flatten_util.ravel_pytree(params)
  rows = jax.random.normal(jax.random.key(5), (3, flat.shape[0])) * 0.1
  g = jax.grad(local.canary_loss)(params, rows[:1], jnp.zeros(1, jnp.int32), jnp.zeros(1))
  chex.assert_trees_all_equal(g, unravel(rows[0]))

  def update(p, row, key):
    return local.client_update(local.canary_loss, p, row[None], jnp.zeros((1,), jnp.int32),
                               key=key, optimizer=local.CANARY_OPTIMIZER,
                               epochs=local.CANARY_EPOCHS, batch_size=local.CANARY_BATCH)[0]

  keys = jax.random.split(KEY, 3)
  ravel = lambda t: flatten_util.ravel_pytree(t)[0]  # noqa: E731
  dyadic = jax.tree_util.tree_map(lambda a: jnp.round(a * 1024) / 1024, params)
  exact_rows = jnp.round(rows * 1024) / 1024
  for p, d, exact in ((dyadic, exact_rows, True), (params, rows, False)):
    eager = jnp.stack([ravel(update(p, d[i], keys[i])) for i in range(3)])
    jitted = jnp.stack([ravel(jax.jit(update)(p, d[i], keys[i])) for i in range(3)])
    vmapped = jax.vmap(lambda r, k, p=p: ravel(update(p, r, k)))(d, keys)
    np.testing.assert_array_equal(jitted, eager)
    np.testing.assert_array_equal(vmapped, eager)
    if exact:
      np.testing.assert_array_equal(eager, d)
    else:
      big = float(jnp.maximum(jnp.max(jnp.abs(flat)), jnp.max(jnp.abs(d))))
      np.testing.assert_allclose(eager, d, rtol=0, atol=2 * float(np.spacing(np.float32(big))))
  assert local.CANARY_EPOCHS == 1 and local.CANARY_BATCH == 1
