"""The client protocol: identity hooks, padded shards, partial batches, hook keys."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fl_privacy import fl
from fl_privacy import models
from fl_privacy.fl import client
from fl_privacy.fl import local
from fl_privacy.fl import optimizers

KEY = jax.random.key(0)


@pytest.fixture(scope='module')
def setup():
  model = models.MLP(hidden=(6,), num_classes=3)
  x = jax.random.normal(jax.random.key(1), (7, 5))
  y = jax.random.randint(jax.random.key(2), (7,), 0, 3)
  params = model.init(KEY, x)
  return fl.make_loss_fn(model.apply), params, x, y


def _upload_only(key, delta, aux):
  del key, aux
  return jax.tree_util.tree_map(lambda d: 2.0 * d, delta)


@pytest.mark.parametrize('name', ['sgd', 'momentum', 'adam', 'adagrad'])
def test_identity_and_upload_only_hooks_train_bit_for_bit_as_plain_fedavg(setup, name):
  loss_fn, params, x, y = setup
  kw = dict(key=KEY, optimizer=optimizers.make(name, 0.05), epochs=3, batch_size=2)
  plain = local.fedavg(loss_fn, params, x, y, **kw)
  identity = local.fedavg(loss_fn, params, x, y, hooks=client.ClientHooks(), **kw)
  # A non-identity upload hook sends fedavg down the hooked code path; training must not move.
  hooked = local.fedavg(loss_fn, params, x, y, hooks=client.ClientHooks(upload=_upload_only),
                        **kw)
  chex.assert_trees_all_equal(plain, identity)
  chex.assert_trees_all_equal(plain, hooked)
  upload, trained = local.client_update(loss_fn, params, x, y,
                                        hooks=client.ClientHooks(upload=_upload_only), **kw)
  chex.assert_trees_all_equal(trained, plain)
  chex.assert_trees_all_close(upload, jax.tree_util.tree_map(
      lambda g, l: 2.0 * (g - l), params, plain), rtol=1e-6)


def _noisy_grad(key, per_example, mask):
  # Sum of per-example gradients over real rows, plus noise from the step's grad key.
  def one(i, g):
    s = jnp.tensordot(mask, g, axes=1)
    return s / jnp.maximum(jnp.sum(mask), 1.0) + 0.01 * jax.random.normal(
        jax.random.fold_in(key, i), s.shape)
  leaves, tree = jax.tree_util.tree_flatten(per_example)
  return jax.tree_util.tree_unflatten(tree, [one(i, g) for i, g in enumerate(leaves)])


@pytest.mark.parametrize('name', ['sgd', 'adam'])
@pytest.mark.parametrize('capacity', [7, 8, 12])
def test_padded_client_trains_exactly_as_the_unpadded_one(setup, name, capacity):
  loss_fn, params, x, y = setup
  hooks = client.ClientHooks(grad=_noisy_grad)
  kw = dict(key=KEY, optimizer=optimizers.make(name, 0.05), epochs=2, batch_size=3,
            hooks=hooks)
  unpadded = local.fedavg(loss_fn, params, x, y, mask=jnp.ones(7), **kw)
  pad = capacity - 7
  # Padding rows are put first here, to show real rows need not lead.
  xp = jnp.concatenate([jnp.zeros((pad, 5)), x])
  yp = jnp.concatenate([jnp.zeros(pad, y.dtype), y])
  mp = jnp.concatenate([jnp.zeros(pad), jnp.ones(7)])
  order_u, _ = local.masked_batch_order(KEY, jnp.ones(7), epochs=2, batch_size=3)
  order_p, valid_p = local.masked_batch_order(KEY, mp, epochs=2, batch_size=3)
  real_u = np.asarray(order_u)[:, :3].reshape(2, -1)[:, :7]
  real_p = np.asarray(order_p).reshape(2, -1)[:, :7] - pad
  np.testing.assert_array_equal(real_u, real_p)
  assert float(np.asarray(valid_p).sum()) == 14
  padded = local.fedavg(loss_fn, params, xp, yp, mask=mp, **kw)
  chex.assert_trees_all_equal(unpadded, padded)


def test_masked_order_walks_every_real_row_once_per_epoch_with_a_partial_last_batch():
  mask = jnp.asarray([1, 1, 0, 1, 1, 1, 0, 1], jnp.float32)  # 6 real rows, B = 4
  order, valid = local.masked_batch_order(KEY, mask, epochs=3, batch_size=4)
  assert order.shape == (3, 2, 4)
  for e in range(3):
    real = np.asarray(order[e])[np.asarray(valid[e]) > 0]
    np.testing.assert_array_equal(np.sort(real), [0, 1, 3, 4, 5, 7])
    np.testing.assert_array_equal(np.asarray(valid[e]).sum(1), [4, 2])
  assert not np.array_equal(order[0], order[1])


def test_partial_last_batch_trains_like_a_hand_written_loop(setup):
  loss_fn, params, x, y = setup
  got = local.fedavg(loss_fn, params, x, y, key=KEY, optimizer=optimizers.make('sgd', 0.1),
                     epochs=1, batch_size=3, shuffle=False, mask=jnp.ones(7))
  w = params
  for rows in ([0, 1, 2], [3, 4, 5], [6]):
    g = jax.grad(loss_fn)(w, x[jnp.asarray(rows)], y[jnp.asarray(rows)])
    w = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, w, g)
  chex.assert_trees_all_close(got, w, rtol=1e-5, atol=1e-6)


def test_shuffled_padded_shard_trains_in_the_masked_order_and_skips_empty_steps(setup):
  """A padded shard with shuffling: the steps follow `masked_batch_order` (same key)."""
  loss_fn, params, x, y = setup
  mask = jnp.asarray([1, 0, 1, 1, 0, 1, 1], jnp.float32)  # 5 real rows, B = 2: 4 steps
  opt = optimizers.make('momentum', 0.1)
  got = local.fedavg(loss_fn, params, x, y, key=KEY, optimizer=opt, epochs=2, batch_size=2,
                     mask=mask)
  order, valid = local.masked_batch_order(KEY, mask, epochs=2, batch_size=2)

  @jax.jit
  def step(w, state, rows, real):  # the mean loss over the batch's real rows
    updates, state = opt.update(jax.grad(loss_fn)(w, x[rows], y[rows], real), state, w)
    return optax.apply_updates(w, updates), state

  w, state = params, opt.init(params)
  for e in range(2):
    for j in range(order.shape[1]):
      if valid[e, j].any():  # the empty last step leaves parameters and momentum alone
        w, state = step(w, state, order[e, j], valid[e, j])
  chex.assert_trees_all_close(got, w, rtol=1e-5, atol=1e-6)


def test_per_example_mean_grad_hook_matches_the_default(setup):
  loss_fn, params, x, y = setup
  mean = lambda key, g, mask: jax.tree_util.tree_map(  # noqa: E731
      lambda a: jnp.tensordot(mask, a, axes=1) / jnp.sum(mask), g)
  kw = dict(key=KEY, optimizer=optimizers.make('sgd', 0.1), epochs=2, batch_size=3,
            mask=jnp.ones(7))
  default = local.fedavg(loss_fn, params, x, y, **kw)
  hooked = local.fedavg(loss_fn, params, x, y, hooks=client.ClientHooks(grad=mean), **kw)
  chex.assert_trees_all_close(default, hooked, rtol=1e-5, atol=1e-6)


def test_per_example_losses_get_the_loss_key_and_their_row_mask(setup):
  """The grad hook's per-example gradients are those of the hooked loss (its key, the row's
  mask): on a padded shard a padding row's gradient is 0, so a hook that ignores the mask
  trains as the default batch gradient does."""
  loss_fn, params, x, y = setup
  mask = jnp.asarray([1, 0, 1, 1, 0, 1, 1], jnp.float32)  # 5 real rows, B = 3: 3, 2, 0 real

  def scaled_loss(key, fn, p, xb, yb, mb, aux):
    return (1.0 + jax.random.uniform(key)) * client.IDENTITY.loss(key, fn, p, xb, yb, mb, aux)

  def unmasked_mean(key, per_example, mb):
    del key
    return jax.tree_util.tree_map(lambda g: g.sum(0) / jnp.maximum(jnp.sum(mb), 1.0),
                                  per_example)

  kw = dict(key=KEY, optimizer=optimizers.make('sgd', 0.1), epochs=2, batch_size=3, mask=mask)
  default = local.fedavg(loss_fn, params, x, y, hooks=client.ClientHooks(loss=scaled_loss),
                         **kw)
  hooked = local.fedavg(loss_fn, params, x, y, hooks=client.ClientHooks(
      loss=scaled_loss, grad=unmasked_mean), **kw)
  chex.assert_trees_all_close(default, hooked, rtol=1e-5, atol=1e-6)


def test_every_step_hook_gets_its_own_key(setup):
  loss_fn, params, x, y = setup
  seen = []

  def record_batch(key, xb, yb, mb, aux):
    del aux
    jax.debug.callback(lambda k: seen.append(np.asarray(k).tobytes()),
                       jax.random.key_data(key))
    return xb, yb, mb

  for k in range(2):
    local.fedavg(loss_fn, params, x, y, key=jax.random.fold_in(KEY, k),
                 optimizer=optimizers.make('sgd', 0.1), epochs=2, batch_size=3,
                 hooks=client.ClientHooks(batch=record_batch))
  assert len(seen) == 2 * 2 * 2  # clients x epochs x (7 // 3) steps
  assert len(set(seen)) == len(seen)


def test_data_hook_mask_restricts_training_to_the_kept_rows(setup):
  loss_fn, params, x, y = setup

  def keep_first_four(key, xs, ys, mask, aux):
    del key, aux
    return xs, ys, mask * (jnp.arange(xs.shape[0]) < 4)

  kw = dict(key=KEY, optimizer=optimizers.make('sgd', 0.1), epochs=1, batch_size=2,
            shuffle=False)
  got = local.fedavg(loss_fn, params, x, y, hooks=client.ClientHooks(data=keep_first_four),
                     **kw)
  want = local.fedavg(loss_fn, params, x[:4], y[:4], mask=jnp.ones(4), **kw)
  chex.assert_trees_all_close(got, want, rtol=1e-6, atol=1e-7)


def test_client_update_passes_hooks_mask_and_aux_to_fedavg(setup):
  loss_fn, params, x, y = setup
  kw = dict(key=KEY, optimizer=optimizers.make('sgd', 0.1), epochs=2, batch_size=3)
  # No hooks: Delta = w_t - w_local of plain FedAvg.
  upload, trained = local.client_update(loss_fn, params, x, y, **kw)
  plain = local.fedavg(loss_fn, params, x, y, **kw)
  chex.assert_trees_all_equal(trained, plain)
  chex.assert_trees_all_equal(upload, client.update(params, plain))

  def scale_batch(key, xb, yb, mb, aux):
    del key
    return xb * aux, yb, mb

  def scaled_noisy_upload(key, delta, aux):
    return jax.tree_util.tree_map(lambda d: aux * d + jax.random.uniform(key), delta)

  hooks = client.ClientHooks(batch=scale_batch, upload=scaled_noisy_upload)
  mask = jnp.asarray([1, 1, 0, 1, 1, 1, 1], jnp.float32)
  aux = jnp.float32(3.0)
  upload, trained = local.client_update(loss_fn, params, x, y, hooks=hooks, mask=mask, aux=aux,
                                        **kw)
  want = local.fedavg(loss_fn, params, x, y, hooks=hooks, mask=mask, aux=aux, **kw)
  chex.assert_trees_all_equal(trained, want)
  noise = jax.random.uniform(client.upload_key(KEY))
  chex.assert_trees_all_close(upload, jax.tree_util.tree_map(
      lambda g, l: 3.0 * (g - l) + noise, params, want), rtol=1e-6, atol=1e-7)
  # The hooks and the mask change training, so dropping either would show.
  for other in (plain, local.fedavg(loss_fn, params, x, y, hooks=hooks, aux=aux, **kw),
                local.fedavg(loss_fn, params, x, y, mask=mask, **kw)):
    assert not np.allclose(want['params']['fc1']['kernel'], other['params']['fc1']['kernel'])


def test_masked_order_checks_and_batches_of_one():
  mask = jnp.asarray([1, 0, 1, 1], jnp.float32)
  with pytest.raises(ValueError, match=r'^batch_size must be >= 1 \(got 0\)$'):
    local.masked_batch_order(KEY, mask, epochs=1, batch_size=0)
  with pytest.raises(ValueError, match=r'^epochs must be >= 1 \(got 0\)$'):
    local.masked_batch_order(KEY, mask, epochs=0, batch_size=2)
  order, valid = local.masked_batch_order(KEY, mask, epochs=1, batch_size=1, shuffle=False)
  np.testing.assert_array_equal(order, [[[0], [2], [3], [1]]])
  np.testing.assert_array_equal(valid, [[[1], [1], [1], [0]]])
  assert order.dtype == jnp.int32 and valid.dtype == jnp.float32


def test_masked_order_is_the_documented_sort_of_real_rows():
  """Epoch e sorts the real rows by bits(fold_in(fold_in(key, e), rank)), ties by index."""
  mask = np.asarray([0, 1, 1, 0, 1, 1, 1, 0, 1], np.float32)  # 6 real rows, capacity 9
  key = jax.random.key(4)
  order, valid = local.masked_batch_order(key, jnp.asarray(mask), epochs=2, batch_size=4)
  assert order.shape == (2, 3, 4) and valid.shape == (2, 3, 4)
  real_rows = np.flatnonzero(mask)
  for e in range(2):
    epoch_key = jax.random.fold_in(key, e)
    u = [int(jax.random.bits(jax.random.fold_in(epoch_key, r), (), jnp.uint32))
         for r in range(len(real_rows))]
    want = real_rows[np.lexsort((real_rows, u))]
    np.testing.assert_array_equal(np.asarray(order[e]).reshape(-1)[:6], want)
    np.testing.assert_array_equal(np.asarray(valid[e]).reshape(-1), [1] * 6 + [0] * 6)


def test_hooks_get_the_documented_keys(setup):
  """data: data_key; step (e, j): batch fold_in(step_key, 0), loss 1, grad 2."""
  loss_fn, params, x, y = setup
  seen = {'data': [], 'batch': [], 'loss': [], 'grad': []}

  def record(name, key):
    jax.debug.callback(lambda k: seen[name].append(np.asarray(k)), jax.random.key_data(key))

  # Each hook also multiplies by aux (1.0), so a hook that did not get aux would fail.
  def data(key, xs, ys, mask, aux):
    record('data', key)
    return xs * aux, ys, mask

  def batch(key, xb, yb, mb, aux):
    record('batch', key)
    return xb * aux, yb, mb

  def loss(key, fn, p, xb, yb, mb, aux):
    record('loss', key)
    return aux * client.IDENTITY.loss(key, fn, p, xb, yb, mb, None)

  def grad(key, per_example, mask):
    record('grad', key)
    return jax.tree_util.tree_map(lambda g: jnp.tensordot(mask, g, axes=1), per_example)

  def want(key, steps, salt):
    return [jax.random.key_data(jax.random.fold_in(client.step_key(key, e, j), salt))
            for e in range(2) for j in range(steps)]

  kw = dict(optimizer=optimizers.make('sgd', 0.1), epochs=2, batch_size=3)
  key = jax.random.key(9)
  # Data hook: the shard gets a mask, so 3 steps per epoch (the last one partial).
  local.fedavg(loss_fn, params, x, y, key=key, hooks=client.ClientHooks(
      data=data, batch=batch, loss=loss), aux=jnp.float32(1.0), **kw)
  np.testing.assert_array_equal(seen['data'], [jax.random.key_data(client.data_key(key))])
  np.testing.assert_array_equal(seen['batch'], want(key, 3, 0))
  np.testing.assert_array_equal(seen['loss'], want(key, 3, 1))
  # Unpadded shard, grad hook: 7 // 3 = 2 steps per epoch.
  seen = {name: [] for name in seen}
  local.fedavg(loss_fn, params, x, y, key=key, hooks=client.ClientHooks(grad=grad), **kw)
  np.testing.assert_array_equal(seen['grad'], want(key, 2, 2))


def test_a_bool_mask_reaches_the_data_hook_as_float32(setup):
  loss_fn, params, x, y = setup
  dtypes = []

  def data(key, xs, ys, mask, aux):
    del key, aux
    dtypes.append(mask.dtype)
    return xs, ys, mask

  kw = dict(key=KEY, optimizer=optimizers.make('sgd', 0.1), epochs=1, batch_size=3)
  got = local.fedavg(loss_fn, params, x, y, mask=[True] * 6 + [False],
                     hooks=client.ClientHooks(data=data), **kw)
  assert dtypes == [jnp.float32]
  want = local.fedavg(loss_fn, params, x, y, mask=jnp.asarray([1.0] * 6 + [0.0]), **kw)
  chex.assert_trees_all_equal(got, want)


def test_hooked_unpadded_path_keeps_shuffle_false(setup):
  loss_fn, params, x, y = setup
  kw = dict(key=KEY, optimizer=optimizers.make('sgd', 0.1), epochs=2, batch_size=3)
  hooks = client.ClientHooks(upload=_upload_only)
  plain = local.fedavg(loss_fn, params, x, y, shuffle=False, **kw)
  hooked = local.fedavg(loss_fn, params, x, y, shuffle=False, hooks=hooks, **kw)
  chex.assert_trees_all_equal(hooked, plain)
  shuffled = local.fedavg(loss_fn, params, x, y, hooks=hooks, **kw)
  assert not np.allclose(shuffled['params']['fc1']['kernel'], plain['params']['fc1']['kernel'])


def test_identity_loss_calls_a_three_argument_loss_without_a_mask(setup):
  loss_fn, params, x, y = setup
  # Without a mask the default `loss` hook calls loss_fn(params, x, y): a loss that takes no
  # mask argument works on the unpadded path.
  three = lambda p, xb, yb: loss_fn(p, xb, yb)  # noqa: E731
  np.testing.assert_array_equal(client.IDENTITY.loss(KEY, three, params, x, y, None, None),
                                loss_fn(params, x, y))
  mask = jnp.asarray([1.0] * 4 + [0.0] * 3)
  np.testing.assert_array_equal(client.IDENTITY.loss(KEY, loss_fn, params, x, y, mask, None),
                                loss_fn(params, x, y, mask))


def test_update_and_apply_update_subtract():
  w = {'a': jnp.asarray([1.0, 2.0]), 'b': jnp.asarray(3.0)}
  local_w = {'a': jnp.asarray([0.5, 4.0]), 'b': jnp.asarray(1.0)}
  delta = client.update(w, local_w)
  chex.assert_trees_all_equal(delta, {'a': jnp.asarray([0.5, -2.0]), 'b': jnp.asarray(2.0)})
  # The server step w - mean Delta with a single client's Delta gives back its local model.
  chex.assert_trees_all_equal(client.apply_update(w, delta), local_w)
  chex.assert_trees_all_equal(client.apply_update(w, {'a': jnp.asarray([1.0, 1.0]),
                                                      'b': jnp.asarray(-1.0)}),
                              {'a': jnp.asarray([0.0, 1.0]), 'b': jnp.asarray(4.0)})


# ----------------------------------------------------------------------------------------------
# report: what a client tells the server its size is.


def test_reported_sizes_are_the_real_counts_without_a_report_hook():
  n = jnp.asarray([6.0, 0.0, 2.5, 1.0], jnp.float32)
  got = client.reported_sizes(client.IDENTITY, n)
  assert got.dtype == jnp.float32
  np.testing.assert_array_equal(got, n)
  np.testing.assert_array_equal(client.reported_sizes(client.ClientHooks(), [3, 1]), [3, 1])


@pytest.mark.parametrize('value', [1.0, 64.0, 0.5])
def test_report_public_gives_the_value_to_clients_with_rows_and_zero_to_the_others(value):
  """Every client with rows reports `value` whatever its count; one without rows 0; the
  dtype of the counts is kept (float32 weights stay float32)."""
  n = jnp.asarray([6.0, 0.0, 2.0, 1.0, 1000.0], jnp.float32)
  hooks = client.ClientHooks(report=client.report_public(value))
  got = client.reported_sizes(hooks, n)
  assert got.dtype == jnp.float32 and got.shape == (5,)
  np.testing.assert_array_equal(got, [value, 0.0, value, value, value])
  np.testing.assert_array_equal(hooks.report(n), got)
  assert not client.is_identity(hooks)


def test_report_public_is_an_operand_one_compilation_serves_every_value():
  """`report_public` is a `jax.tree_util.Partial` whose value is a leaf: a jitted function
  that takes it as an argument traces once for 1.0 and for 64.0 and gives each its value."""
  assert isinstance(client.report_public(1.0), jax.tree_util.Partial)
  traces = []

  @jax.jit
  def weigh(report, n):
    traces.append(1)
    return client.reported_sizes(client.ClientHooks(report=report), n)

  n = jnp.asarray([3.0, 0.0, 5.0])
  np.testing.assert_array_equal(weigh(client.report_public(1.0), n), [1.0, 0.0, 1.0])
  np.testing.assert_array_equal(weigh(client.report_public(64.0), n), [64.0, 0.0, 64.0])
  assert len(traces) == 1
