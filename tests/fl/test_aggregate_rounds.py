"""Aggregation and the round loop."""

from __future__ import annotations

import functools

import chex
import jax
from jax import flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

from fl_privacy import fl
from fl_privacy import models
from fl_privacy.fl import aggregate
from fl_privacy.fl import client
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
  # A half-precision tree stays half precision (the weights take the leaf's dtype).
  half = aggregate.weighted_mean({'h': jnp.asarray(trees['a'], jnp.float16)}, weights)
  assert half['h'].dtype == jnp.float16
  np.testing.assert_allclose(half['h'], np.average(trees['a'], 0, weights), rtol=2e-3,
                             atol=2e-3)


@pytest.fixture(scope='module')
def setup():
  model = models.MLP(hidden=(4,), num_classes=3)
  x = jax.random.normal(jax.random.key(1), (3, 6, 5))  # 3 clients x 6
  y = jax.random.randint(jax.random.key(2), (3, 6), 0, 3)
  return fl.make_loss_fn(model.apply), model.init(KEY, x[0]), x, y


def _tree_stack(trees):
  return jax.tree_util.tree_map(lambda *ls: jnp.stack(ls), *trees)


def _noise_upload(key, delta, aux):
  # Randomness from the upload key only, so the test can see which key ran.
  del aux
  leaves, tree = jax.tree_util.tree_flatten(delta)
  return jax.tree_util.tree_unflatten(
      tree, [l + jax.random.normal(jax.random.fold_in(key, i), l.shape)
             for i, l in enumerate(leaves)])


def test_one_round_of_full_batch_sgd_is_fedsgd(setup):
  loss_fn, params, x, y = setup
  observe = lambda key, t, k, g, upload: upload  # noqa: E731
  init = jax.tree_util.tree_map(lambda a: jnp.zeros((3,) + a.shape, a.dtype), params)
  final, log = rounds.run(loss_fn, params, rounds.ClientData(x, y), key=KEY, num_rounds=1,
                          optimizer=optimizers.make('sgd', 0.5), epochs=1, batch_size=6,
                          observe=observe, init=init)
  grads = fl.client_grads(loss_fn, params, x, y)
  chex.assert_trees_all_close(
      log.observed, jax.tree_util.tree_map(lambda g: 0.5 * g, grads), rtol=1e-5, atol=1e-6)
  want = jax.tree_util.tree_map(lambda p, g: p - 0.5 * g.mean(0), params, grads)
  chex.assert_trees_all_close(final, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(log.participants, np.ones((1, 3), bool))


def test_loop_against_python_reference_with_unequal_clients_and_upload_hook(setup):
  """Keys, size weights, uploads (not local params) aggregated, over 3 rounds."""
  loss_fn, params, x, y = setup
  sizes = [6, 3, 5]
  xs = [np.asarray(x[k][:n]) for k, n in enumerate(sizes)]
  ys = [np.asarray(y[k][:n]) for k, n in enumerate(sizes)]
  data = rounds.pad_clients(xs, ys)
  hooks = client.ClientHooks(upload=_noise_upload)
  opt = optimizers.make('momentum', 0.1)
  final, _ = rounds.run(loss_fn, params, data, key=KEY, num_rounds=3, optimizer=opt,
                        epochs=2, batch_size=2, hooks=hooks)
  w = params
  for t in range(3):
    ups = []
    for k in range(3):
      up, _ = local.client_update(loss_fn, w, xs[k], ys[k], key=rounds.client_key(KEY, t, k),
                                  hooks=hooks, mask=jnp.ones(sizes[k]), optimizer=opt,
                                  epochs=2, batch_size=2)
      ups.append(up)
    mean = aggregate.weighted_mean(_tree_stack(ups), jnp.asarray(sizes, jnp.float32))
    w = jax.tree_util.tree_map(jnp.subtract, w, mean)
  chex.assert_trees_all_close(final, w, rtol=1e-5, atol=1e-5)


def test_split_run_equals_whole_run(setup):
  loss_fn, params, x, y = setup
  run = functools.partial(rounds.run, loss_fn, clients=rounds.ClientData(x, y), key=KEY,
                          optimizer=optimizers.make('sgd', 0.1), epochs=1, batch_size=3,
                          evaluate=lambda p: loss_fn(p, x[0], y[0]))
  whole, log = run(params, num_rounds=2)
  half, first = run(params, num_rounds=1)
  rest, second = run(half, num_rounds=1, first_round=1)
  chex.assert_trees_all_close(whole, rest, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(log.evaluations,
                             np.concatenate([first.evaluations, second.evaluations]),
                             rtol=1e-6)


def test_observe_reduce_keeps_a_running_statistic_not_the_stack(setup):
  loss_fn, params, x, y = setup
  norm = lambda key, t, k, g, up: jnp.sqrt(sum(  # noqa: E731
      jnp.sum(l ** 2) for l in jax.tree_util.tree_leaves(up)))
  total = lambda s, t, seen, part: s + seen  # noqa: E731
  last = lambda s, t, seen, part: seen  # noqa: E731
  kw = dict(clients=rounds.ClientData(x, y), key=KEY, optimizer=optimizers.make('sgd', 0.2),
            epochs=1, batch_size=2, observe=norm)
  final, log = rounds.run(loss_fn, params, num_rounds=3, reduce=total, init=jnp.zeros(3),
                          **kw)
  assert log.observed.shape == (3,)
  w, want = params, np.zeros(3)
  for t in range(3):
    w, one = rounds.run(loss_fn, w, num_rounds=1, first_round=t, reduce=last,
                        init=jnp.zeros(3), **kw)
    want += np.asarray(one.observed)
  np.testing.assert_allclose(log.observed, want, rtol=1e-5)
  chex.assert_trees_all_close(final, w, rtol=1e-6, atol=1e-6)


def test_per_round_optimizer_schedule(setup):
  loss_fn, params, x, y = setup
  lrs = jnp.array([0.0, 0.5])
  final, _ = rounds.run(loss_fn, params, rounds.ClientData(x, y), key=KEY, num_rounds=2,
                        optimizer=lambda t: optimizers.make('sgd', lrs[t]), epochs=1,
                        batch_size=6)
  grads = fl.client_grads(loss_fn, params, x, y)
  want = jax.tree_util.tree_map(lambda p, g: p - 0.5 * g.mean(0), params, grads)
  chex.assert_trees_all_close(final, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('fraction', [0.25, 0.5, 1.0])
def test_participation_draws_exactly_the_fraction_and_is_uniform(fraction):
  num_clients, num_rounds = 8, 2000
  parts = np.asarray(jax.vmap(lambda t: rounds.participants(KEY, t, num_clients, fraction))(
      jnp.arange(num_rounds)))
  m = max(1, round(fraction * num_clients))
  np.testing.assert_array_equal(parts.sum(1), m)
  # Each client takes part with probability m / K; binomial 5-sigma band per client.
  p = m / num_clients
  tol = 5 * np.sqrt(p * (1 - p) / num_rounds)
  np.testing.assert_allclose(parts.mean(0), p, atol=tol)


def test_non_participants_do_not_move_the_model(setup):
  loss_fn, params, x, y = setup
  opt = optimizers.make('sgd', 0.3)
  final, log = rounds.run(loss_fn, params, rounds.ClientData(x, y), key=KEY, num_rounds=1,
                          optimizer=opt, epochs=1, batch_size=3, participation=0.34)
  part = np.asarray(log.participants[0])
  assert part.sum() == 1
  k = int(np.argmax(part))
  up, _ = local.client_update(loss_fn, params, x[k], y[k], key=rounds.client_key(KEY, 0, k),
                              optimizer=opt, epochs=1, batch_size=3)
  chex.assert_trees_all_close(final, jax.tree_util.tree_map(jnp.subtract, params, up),
                              rtol=1e-6, atol=1e-6)


def test_aggregate_hook_replaces_the_weighted_mean(setup):
  loss_fn, params, x, y = setup
  zero = lambda key, uploads, weights: jax.tree_util.tree_map(  # noqa: E731
      lambda u: jnp.zeros(u.shape[1:], u.dtype), uploads)
  final, _ = rounds.run(loss_fn, params, rounds.ClientData(x, y), key=KEY, num_rounds=2,
                        optimizer=optimizers.make('sgd', 0.3), epochs=1, batch_size=3,
                        hooks=client.ClientHooks(aggregate=zero))
  chex.assert_trees_all_equal(final, params)


def test_pad_clients_rejects_bad_shapes():
  with pytest.raises(ValueError, match='labels'):
    rounds.pad_clients([np.zeros((3, 2))], [np.zeros(2)])
  with pytest.raises(ValueError, match='capacity'):
    rounds.pad_clients([np.zeros((3, 2))], [np.zeros(3)], capacity=2)
  data = rounds.pad_clients([np.ones((3, 2)), np.ones((1, 2))], [np.zeros(3), np.zeros(1)])
  np.testing.assert_array_equal(data.mask, [[1, 1, 1], [1, 0, 0]])
  np.testing.assert_array_equal(data.sizes(), [3, 1])
  assert rounds.pad_clients([np.ones((2, 2))], [np.zeros(2)]).mask is None


def test_pad_clients_messages_capacity_and_aux():
  with pytest.raises(ValueError, match=r'^2 input shards but 1 label shards$'):
    rounds.pad_clients([np.zeros((3, 2)), np.zeros((3, 2))], [np.zeros(3)])
  with pytest.raises(ValueError, match=r'^every shard needs as many labels as inputs$'):
    rounds.pad_clients([np.zeros((3, 2))], [np.zeros(2)])
  with pytest.raises(ValueError,
                     match=r'^every client needs at least one example \(sizes \[2, 0\]\)$'):
    rounds.pad_clients([np.zeros((2, 2)), np.zeros((0, 2))], [np.zeros(2), np.zeros(0)])
  with pytest.raises(ValueError, match=r'^capacity 2 is below the largest shard \(3\)$'):
    rounds.pad_clients([np.zeros((3, 2))], [np.zeros(3)], capacity=2)
  aux = {'held_out': np.arange(2.0)}
  data = rounds.pad_clients([np.ones((1, 2)), np.ones((2, 2))], [np.ones(1), np.ones(2)],
                            aux=aux, capacity=3)
  assert data.aux is aux
  np.testing.assert_array_equal(data.mask, [[1, 0, 0], [1, 1, 0]])
  np.testing.assert_array_equal(data.x[:, :, 0], [[1, 0, 0], [1, 1, 0]])
  np.testing.assert_array_equal(data.y, [[1, 0, 0], [1, 1, 0]])
  assert data.x.dtype == np.float64 and data.y.dtype == np.float64
  full = rounds.pad_clients([np.ones((2, 2))], [np.zeros(2)], aux=aux, capacity=2)
  assert full.mask is None and full.aux is aux
  np.testing.assert_array_equal(full.x, np.ones((1, 2, 2)))
  np.testing.assert_array_equal(full.y, np.zeros((1, 2)))
  assert data.mask.dtype == np.float32
  # sizes() are float32 weights whatever the mask's dtype (or without a mask).
  for mask, want in ((None, [4, 4]), (np.asarray([[1, 1, 0, 0], [1, 0, 0, 0]], bool), [2, 1]),
                     (np.asarray([[1, 1, 1, 0], [0, 1, 0, 0]], np.int32), [3, 1])):
    sizes = rounds.ClientData(np.ones((2, 4, 1)), np.ones((2, 4)), mask=mask).sizes()
    assert sizes.dtype == jnp.float32 and sizes.shape == (2,)
    np.testing.assert_array_equal(sizes, want)


def test_participation_fraction_outside_0_1_is_rejected():
  for bad in (0.0, -0.5, 1.5):
    with pytest.raises(ValueError,
                       match=rf'^participation fraction must be in \(0, 1\] \(got {bad}\)$'):
      rounds.participants(KEY, 0, 4, bad)
  # `run` rejects them too, above 1 included (it draws participants only below 1).
  for bad in (0.0, 1.5):
    with pytest.raises(ValueError,
                       match=rf'^participation fraction must be in \(0, 1\] \(got {bad}\)$'):
      rounds.run(lambda p, x, y, mask=None: 0.0, {}, rounds.ClientData(np.ones((2, 3, 1)),
                 np.ones((2, 3))), key=KEY, num_rounds=1, optimizer=optimizers.make('sgd', 0.1),
                 epochs=1, batch_size=3, participation=bad)
  # Everyone takes part at fraction 1, as a bool mask like the drawn ones.
  for fraction in (1.0, 0.5):
    parts = rounds.participants(KEY, 0, 4, fraction)
    assert parts.dtype == jnp.bool_ and parts.shape == (4,)
  # A tenth of 4 clients rounds to 0: still one participant.
  np.testing.assert_array_equal(
      jax.vmap(lambda t: rounds.participants(KEY, t, 4, 0.1).sum())(jnp.arange(20)), 1)


def test_run_checks_its_arguments(setup):
  loss_fn, params, x, y = setup
  kw = dict(key=KEY, num_rounds=1, optimizer=optimizers.make('sgd', 0.1), epochs=1,
            batch_size=3)
  with pytest.raises(ValueError, match=r'^clients.x has 3 clients, clients.y 2$'):
    rounds.run(loss_fn, params, rounds.ClientData(x, y[:2]), **kw)
  with pytest.raises(ValueError, match=r'^observe without reduce needs `init` shaped like one '
                     r'round of observations$'):
    rounds.run(loss_fn, params, rounds.ClientData(x, y), observe=lambda *a: 0.0, **kw)


def test_server_and_observe_hooks_get_their_keys_rounds_and_weights(setup):
  """The aggregate hook's key and weights, observe's key, round and client, reduce's part."""
  loss_fn, params, x, y = setup
  sizes = [6, 3, 5]
  data = rounds.pad_clients([np.asarray(x[k][:n]) for k, n in enumerate(sizes)],
                            [np.asarray(y[k][:n]) for k, n in enumerate(sizes)])

  def noisy_sum(key, uploads, weights):
    shift = jax.random.uniform(key) + jnp.sum(weights * jnp.arange(3))
    return jax.tree_util.tree_map(lambda u: jnp.zeros(u.shape[1:], u.dtype) + shift, uploads)

  def observe(key, t, k, global_params, upload):
    del upload
    return jax.random.key_data(key), t, k, global_params

  def reduce(state, t, seen, part):
    del state
    return seen, t, part

  stacked = jax.tree_util.tree_map(lambda a: jnp.zeros((3,) + a.shape, a.dtype), params)
  init = (jnp.zeros((3, 2), jnp.uint32), jnp.zeros(3, jnp.int32), jnp.zeros(3, jnp.int32),
          stacked), jnp.int32(0), jnp.zeros(3, bool)
  final, log = rounds.run(loss_fn, params, data, key=KEY, num_rounds=1, first_round=4,
                          optimizer=optimizers.make('sgd', 0.1), epochs=1, batch_size=2,
                          hooks=client.ClientHooks(aggregate=noisy_sum), observe=observe,
                          reduce=reduce, init=init, evaluate=lambda p: p)
  server_key = jax.random.fold_in(jax.random.fold_in(KEY, 4), rounds.SERVER_SALT)
  shift = jax.random.uniform(server_key) + 0 * 6 + 1 * 3 + 2 * 5
  chex.assert_trees_all_close(final, jax.tree_util.tree_map(lambda p: p - shift, params),
                              rtol=1e-6, atol=1e-6)
  (keys, ts, ks, seen_params), t, part = log.observed
  # observe sees the round's global model w_4 (here the start), every client the same.
  chex.assert_trees_all_equal(seen_params, jax.tree_util.tree_map(
      lambda a: jnp.broadcast_to(a, (3,) + a.shape), params))
  for k in range(3):
    want = jax.random.fold_in(rounds.client_key(KEY, 4, k), rounds.OBSERVE_SALT)
    np.testing.assert_array_equal(keys[k], jax.random.key_data(want))
  np.testing.assert_array_equal(ts, 4)
  np.testing.assert_array_equal(ks, [0, 1, 2])
  assert int(t) == 4
  np.testing.assert_array_equal(part, True)
  np.testing.assert_array_equal(log.participants, [[True, True, True]])
  # evaluate gets the new global model w_5, stacked over the one round.
  chex.assert_trees_all_equal(log.evaluations,
                              jax.tree_util.tree_map(lambda a: a[None], final))
  # Without observe there is no observation, even when an init state is given.
  _, plain = rounds.run(loss_fn, params, data, key=KEY, num_rounds=1, epochs=1, batch_size=2,
                        optimizer=optimizers.make('sgd', 0.1), init=jnp.zeros(3))
  assert plain.observed is None and plain.evaluations is None


def test_aux_reaches_every_client_with_its_own_row(setup):
  loss_fn, params, x, y = setup

  def scale_batch(key, xb, yb, mb, aux):
    del key
    return xb * aux, yb, mb

  hooks = client.ClientHooks(batch=scale_batch)
  aux = jnp.asarray([0.5, 2.0, 3.0])
  kw = dict(key=KEY, optimizer=optimizers.make('sgd', 0.3), epochs=1, batch_size=3)
  observe = lambda key, t, k, g, upload: upload  # noqa: E731
  init = jax.tree_util.tree_map(lambda a: jnp.zeros((3,) + a.shape, a.dtype), params)
  _, log = rounds.run(loss_fn, params, rounds.ClientData(x, y, aux=aux), num_rounds=1,
                      hooks=hooks, observe=observe, init=init, **kw)
  for k in range(3):
    want, _ = local.client_update(loss_fn, params, x[k], y[k], hooks=hooks, aux=aux[k],
                                  **dict(kw, key=rounds.client_key(KEY, 0, k)))
    chex.assert_trees_all_close(jax.tree_util.tree_map(lambda u: u[k], log.observed), want,
                                rtol=1e-5, atol=1e-6)


def test_run_passes_shuffle_to_the_clients(setup):
  loss_fn, params, x, y = setup
  opt = optimizers.make('sgd', 0.3)
  observe = lambda key, t, k, g, upload: upload  # noqa: E731
  init = jax.tree_util.tree_map(lambda a: jnp.zeros((3,) + a.shape, a.dtype), params)
  _, log = rounds.run(loss_fn, params, rounds.ClientData(x, y), key=KEY, num_rounds=1,
                      optimizer=opt, epochs=1, batch_size=3, shuffle=False, observe=observe,
                      init=init)
  for k in range(3):
    want, _ = local.client_update(loss_fn, params, x[k], y[k], key=rounds.client_key(KEY, 0, k),
                                  optimizer=opt, epochs=1, batch_size=3, shuffle=False)
    chex.assert_trees_all_close(jax.tree_util.tree_map(lambda u: u[k], log.observed), want,
                                rtol=1e-5, atol=1e-6)


def test_no_two_round_client_pairs_share_a_key(setup):
  """Every (round, client) of a run draws from its own key, fold_in(fold_in(key, t), k).

  The upload hook turns its key into the upload, so the observed uploads show which key each
  (t, k) used. A loop that folded in `t + k` (or only one of them) would repeat a key across
  pairs; the expected keys are computed here with jax.random, not with `rounds.client_key`.
  """
  loss_fn, params, x, y = setup
  num_rounds, num_clients = 4, 3

  def key_upload(key, delta, aux):
    del aux
    return jax.tree_util.tree_map(lambda d: jnp.zeros_like(d) + jax.random.uniform(key), delta)

  def observe(key, t, k, global_params, upload):
    del key, t, k, global_params
    return jax.tree_util.tree_leaves(upload)[0].ravel()[0]

  def reduce(state, t, seen, part):
    del part
    return state.at[t].set(seen)

  _, log = rounds.run(loss_fn, params, rounds.ClientData(x=x, y=y), key=KEY,
                      num_rounds=num_rounds, optimizer=optimizers.make('sgd', 0.1), epochs=1,
                      batch_size=2, hooks=client.ClientHooks(upload=key_upload),
                      observe=observe, reduce=reduce,
                      init=jnp.zeros((num_rounds, num_clients)))
  seen = np.asarray(log.observed)
  assert len(np.unique(seen)) == num_rounds * num_clients
  for t in range(num_rounds):
    for k in range(num_clients):
      pair_key = jax.random.fold_in(jax.random.fold_in(KEY, t), k)
      want = jax.random.uniform(jax.random.fold_in(pair_key, client.UPLOAD_SALT))
      assert seen[t, k] == pytest.approx(float(want), abs=0), (t, k)


# ----------------------------------------------------------------------------------------------
# Partial participation: only the drawn clients train, upload and are weighed.

SIZES = (6, 2, 5, 3, 4)


@pytest.fixture(scope='module')
def shards(setup):
  """Five unequal shards (SIZES) of the setup's model, padded to 6 rows."""
  loss_fn, params, _, _ = setup
  rng = np.random.default_rng(7)
  xs = [rng.normal(size=(n, 5)).astype(np.float32) for n in SIZES]
  ys = [rng.integers(0, 3, n).astype(np.int32) for n in SIZES]
  return loss_fn, params, rounds.pad_clients(xs, ys)


def _stacked_zeros(params, *lead):
  return jax.tree_util.tree_map(lambda a: jnp.zeros(lead + a.shape, a.dtype), params)


def _at(tree, *index):
  return jax.tree_util.tree_map(lambda a: a[index], tree)


def _set_round(state, t, seen, part):
  del part
  return jax.tree_util.tree_map(lambda s, v: s.at[t].set(v), state, seen)


def _reference_run(loss_fn, params, data, *, hooks, num_rounds, participation, weights, kw):
  """The round loop by hand: draw `participant_indices`, train each drawn client alone with
  `local.client_update` and its `client_key`, w <- w - weighted mean of their uploads (weights:
  the reported counts given). Returns (final params, {(t, k): upload})."""
  train = jax.jit(lambda w, x, y, m, k: local.client_update(
      loss_fn, w, x, y, key=k, hooks=hooks, mask=m, **kw)[0])
  w, uploads = params, {}
  for t in range(num_rounds):
    idx = np.asarray(rounds.participant_indices(KEY, t, data.num_clients, participation))
    ups = []
    for k in idx:
      uploads[t, int(k)] = train(w, data.x[k], data.y[k], data.mask[k],
                                 rounds.client_key(KEY, t, int(k)))
      ups.append(uploads[t, int(k)])
    mean = aggregate.weighted_mean(_tree_stack(ups), jnp.asarray(weights)[idx])
    w = jax.tree_util.tree_map(jnp.subtract, w, mean)
  return w, uploads


@pytest.mark.parametrize('report', [None, 1.0])
def test_partial_participation_equals_a_hand_built_round_loop(shards, report):
  """With participation 3/5: the result is the loop that gathers the drawn clients, trains
  them, and steps by the mean of their uploads weighted by their *reported* counts (the real
  row counts, or a public 1.0 each); `observe` sees each participant's upload, equal to what
  `client_update` gives that client with its round key, and zeros for the others."""
  loss_fn, params, data = shards
  hooks = client.ClientHooks(upload=_noise_upload,
                             report=None if report is None else client.report_public(report))
  kw = dict(optimizer=optimizers.make('sgd', 0.2), epochs=2, batch_size=2)
  num_rounds, num_clients = 3, len(SIZES)
  final, log = rounds.run(loss_fn, params, data, key=KEY, num_rounds=num_rounds,
                          hooks=hooks, participation=0.6,
                          observe=lambda key, t, k, g, upload: upload, reduce=_set_round,
                          init=_stacked_zeros(params, num_rounds, num_clients), **kw)
  weights = np.asarray(SIZES, np.float32) if report is None else np.ones(num_clients)
  want, uploads = _reference_run(loss_fn, params, data, hooks=hooks, num_rounds=num_rounds,
                                 participation=0.6, weights=weights, kw=kw)
  chex.assert_trees_all_close(final, want, rtol=1e-5, atol=1e-5)
  for t in range(num_rounds):
    drawn = np.asarray(rounds.participant_indices(KEY, t, num_clients, 0.6))
    assert len(drawn) == 3
    np.testing.assert_array_equal(np.flatnonzero(log.participants[t]), drawn)
    for k in range(num_clients):
      seen = _at(log.observed, t, k)
      if k in drawn:
        chex.assert_trees_all_close(seen, uploads[t, k], rtol=1e-5, atol=1e-5)
      else:
        chex.assert_trees_all_equal(seen, _stacked_zeros(params))


def test_a_client_that_is_not_drawn_does_not_train(shards):
  """A client whose shard is NaN poisons the model in a round it takes part in, and leaves
  it finite (and equal to the other participants' reference round) in one it does not: it
  neither trains nor enters the mean, even with weight 0 (0 * NaN is NaN). Its observation
  is exactly 0."""
  loss_fn, params, data = shards
  poisoned = data._replace(x=np.asarray(data.x).copy())
  poisoned.x[4] = np.nan
  kw = dict(optimizer=optimizers.make('sgd', 0.2), epochs=1, batch_size=2)
  drawn = [np.asarray(rounds.participant_indices(KEY, t, 5, 0.4)) for t in range(20)]
  t_out = next(t for t in range(20) if 4 not in drawn[t])
  t_in = next(t for t in range(20) if 4 in drawn[t])
  norm = lambda key, t, k, g, upload: sum(  # noqa: E731
      jnp.sum(u ** 2) for u in jax.tree_util.tree_leaves(upload))
  run = functools.partial(rounds.run, loss_fn, params, poisoned, key=KEY, num_rounds=1,
                          participation=0.4, observe=norm, init=jnp.zeros(5), **kw)
  out, log = run(first_round=t_out)
  assert all(np.isfinite(a).all() for a in jax.tree_util.tree_leaves(out))
  assert float(log.observed[4]) == 0.0
  train = lambda k: local.client_update(loss_fn, params, data.x[k], data.y[k],  # noqa: E731
                                        key=rounds.client_key(KEY, t_out, k),
                                        mask=data.mask[k], **kw)[0]
  ks = drawn[t_out]
  mean = aggregate.weighted_mean(_tree_stack([train(k) for k in ks]),
                                 jnp.asarray(SIZES, jnp.float32)[ks])
  chex.assert_trees_all_close(out, jax.tree_util.tree_map(jnp.subtract, params, mean),
                              rtol=1e-5, atol=1e-6)
  hit, _ = run(first_round=t_in)
  assert any(np.isnan(a).any() for a in jax.tree_util.tree_leaves(hit))


def test_only_the_participants_run_local_training(shards):
  """A `data` hook records which client (its aux) trains in which round: with participation
  2/5 exactly the drawn clients train, once each, every round."""
  loss_fn, params, data = shards
  trained = []

  def record(key, x, y, mask, aux):
    del key
    jax.debug.callback(lambda k: trained.append(int(k)), aux)
    return x, y, mask

  num_rounds = 4
  rounds.run(loss_fn, params, data._replace(aux=jnp.arange(5)), key=KEY,
             num_rounds=num_rounds, optimizer=optimizers.make('sgd', 0.1), epochs=1,
             batch_size=2, hooks=client.ClientHooks(data=record), participation=0.4)
  want = [int(k) for t in range(num_rounds)
          for k in np.asarray(rounds.participant_indices(KEY, t, 5, 0.4))]
  assert len(trained) == 2 * num_rounds
  assert sorted(trained) == sorted(want)


# ----------------------------------------------------------------------------------------------
# Reported sizes: the server weighs by what clients report.


def test_the_server_weighs_by_reported_sizes_real_counts_by_default():
  """Unequal shards (6, 2, 5 rows): without a `report` hook the uploads are averaged with
  weights 6:2:5; with `report_public(1.0)` with equal weights. The uploads themselves do not
  change (the hook acts only on the server's weights)."""
  model = models.MLP(hidden=(), num_classes=3)
  rng = np.random.default_rng(3)
  sizes = (6, 2, 5)
  data = rounds.pad_clients([rng.normal(size=(n, 4)).astype(np.float32) for n in sizes],
                            [rng.integers(0, 3, n).astype(np.int32) for n in sizes])
  loss_fn = fl.make_loss_fn(model.apply)
  params = model.init(KEY, data.x[0])
  finals, uploads = [], []
  for hooks in (None, client.ClientHooks(report=client.report_public(1.0))):
    final, log = rounds.run(loss_fn, params, data, key=KEY, num_rounds=1, hooks=hooks,
                            optimizer=optimizers.make('sgd', 0.5), epochs=1, batch_size=3,
                            observe=lambda key, t, k, g, upload: upload,
                            init=_stacked_zeros(params, 3))
    finals.append(final)
    uploads.append(log.observed)
  chex.assert_trees_all_equal(uploads[0], uploads[1])
  by_rows = jax.tree_util.tree_map(
      lambda p, u: p - np.tensordot(np.asarray(sizes, np.float32) / 13, u, axes=1), params,
      uploads[0])
  equal = jax.tree_util.tree_map(lambda p, u: p - u.mean(0), params, uploads[0])
  chex.assert_trees_all_close(finals[0], by_rows, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(finals[1], equal, rtol=1e-5, atol=1e-6)
  gap = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree_util.tree_leaves(by_rows),
                                                           jax.tree_util.tree_leaves(equal)))
  assert gap > 1e-3  # the two weightings are told apart


def test_a_client_without_rows_reports_zero_and_stays_out_of_the_mean():
  """A client whose mask is all zero trains no step (its update is 0) but uploads 1 (the
  upload hook adds 1): `report_public(1.0)` gives it weight 0, so the mean is over the other
  two with equal weights (were it weighed 1, every coordinate would move by 1/3)."""
  model = models.MLP(hidden=(), num_classes=3)
  x = jax.random.normal(jax.random.key(4), (3, 4, 4))
  y = jax.random.randint(jax.random.key(5), (3, 4), 0, 3)
  mask = np.asarray([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], np.float32)
  loss_fn = fl.make_loss_fn(model.apply)
  params = model.init(KEY, x[0])
  plus_one = lambda key, delta, aux: jax.tree_util.tree_map(  # noqa: E731
      lambda d: d + 1.0, delta)
  hooks = client.ClientHooks(upload=plus_one, report=client.report_public(1.0))
  final, log = rounds.run(loss_fn, params, rounds.ClientData(x, y, mask), key=KEY,
                          num_rounds=1, optimizer=optimizers.make('sgd', 0.5), epochs=1,
                          batch_size=2, hooks=hooks, observe=lambda key, t, k, g, u: u,
                          init=_stacked_zeros(params, 3))
  np.testing.assert_array_equal(client.reported_sizes(hooks, rounds.ClientData(
      x, y, mask).sizes()), [1.0, 1.0, 0.0])
  chex.assert_trees_all_equal(jax.tree_util.tree_map(lambda u: u[2], log.observed),
                              jax.tree_util.tree_map(jnp.ones_like, params))
  want = jax.tree_util.tree_map(lambda p, u: p - u[:2].mean(0), params, log.observed)
  chex.assert_trees_all_close(final, want, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# Traces: every real client's local steps, handed to observe.


def test_run_hands_every_participants_traces_to_observe(shards):
  """`run(trace=...)` gives observe each participant's stacked traces, equal to the third
  output of its own `client_update` with its round key; an injected (canary) participant's
  traces and every non-participant's observation are zeros. Participation 1/2 of 5 real + 1
  injected clients (the mixed draw), 4 rounds."""
  loss_fn, params, data = shards
  flat, unravel = flatten_util.ravel_pytree(params)
  inj = rounds.Injected(deltas=jax.vmap(unravel)(0.01 * jnp.ones((1, flat.shape[0]))),
                        sizes=jnp.ones(1))
  trace = lambda step: (step.live, step.grad)  # noqa: E731
  kw = dict(optimizer=optimizers.make('sgd', 0.2), epochs=2, batch_size=2)
  num_rounds, total, steps = 4, 6, 2 * 3  # E x ceil(6 / 2) steps
  one = (jnp.zeros(steps), _stacked_zeros(params, steps))
  init = jax.tree_util.tree_map(lambda a: jnp.zeros((num_rounds, total) + a.shape, a.dtype),
                                one)
  _, log = rounds.run(loss_fn, params, data, key=KEY, num_rounds=num_rounds, participation=0.5,
                      injected=inj, trace=trace, reduce=_set_round, init=init,
                      observe=lambda key, t, k, g, upload, traces: traces,
                      evaluate=lambda p: p, **kw)
  parts = np.asarray(log.participants)
  assert parts[:, 5].any()  # some round draws the canary
  zero = jax.tree_util.tree_map(jnp.zeros_like, one)
  for t in range(num_rounds):
    # Round t starts from w_t: the initial params, then the previous round's evaluate input.
    w = params if t == 0 else _at(log.evaluations, t - 1)
    for k in range(total):
      seen = _at(log.observed, t, k)
      if not parts[t, k] or k == 5:
        chex.assert_trees_all_equal(seen, zero)
        continue
      _, _, want = local.client_update(loss_fn, w, data.x[k], data.y[k], mask=data.mask[k],
                                       key=rounds.client_key(KEY, t, k), trace=trace, **kw)
      chex.assert_trees_all_close(seen, want, rtol=1e-5, atol=1e-6)
      # The live flags count the client's real steps: E x ceil(n_k / B).
      assert float(jnp.sum(seen[0])) == 2 * -(-SIZES[k] // 2)


# ----------------------------------------------------------------------------------------------
# Injected (canary) clients train through `client_update` with `local.canary_loss`.


def _ulp_bound(params, deltas):
  """Two float32 ulps of the largest |w| or |d|: `client_update` returns w - fl(w - d), which
  is d up to the rounding of w - d (exactly d when that difference is exact)."""
  big = max(float(jnp.max(jnp.abs(a))) for a in jax.tree_util.tree_leaves((params, deltas)))
  return 2 * float(np.spacing(np.float32(big)))


@pytest.mark.parametrize('hook', ['identity', 'update_dp', 'noise'])
def test_an_injected_clients_upload_is_the_upload_hook_of_its_delta(setup, hook):
  """For hooks with only an `upload` hook, canary j's upload in round t is
  `hooks.upload(upload_key(client_key(key, t, K + j)), delta_j, None)` (and delta_j itself
  with identity hooks), up to the rounding of its one SGD step; 2 rounds, full participation."""
  from fl_privacy.defenses import dp  # pylint: disable=g-import-not-at-top
  loss_fn, params, x, y = setup
  hooks = {'identity': client.IDENTITY,
           'update_dp': client.ClientHooks(upload=dp.update_dp_hook(0.05, 0.5)),
           'noise': client.ClientHooks(upload=_noise_upload)}[hook]
  flat, unravel = flatten_util.ravel_pytree(params)
  rows = 0.03 * jax.random.normal(jax.random.key(8), (2, flat.shape[0]))
  inj = rounds.Injected(deltas=jax.vmap(unravel)(rows), sizes=jnp.asarray([6.0, 2.0]))
  num_rounds = 2
  _, log = rounds.run(loss_fn, params, rounds.ClientData(x, y), key=KEY, num_rounds=num_rounds,
                      optimizer=optimizers.make('sgd', 0.2), epochs=1, batch_size=3,
                      hooks=hooks, injected=inj, reduce=_set_round,
                      observe=lambda key, t, k, g, upload: upload,
                      init=_stacked_zeros(params, num_rounds, 5), evaluate=lambda p: p)
  np.testing.assert_array_equal(log.participants, True)
  for t in range(num_rounds):
    w = params if t == 0 else _at(log.evaluations, t - 1)
    for j in range(2):
      delta = unravel(rows[j])
      want = hooks.upload(client.upload_key(rounds.client_key(KEY, t, 3 + j)), delta, None)
      seen = _at(log.observed, t, 3 + j)
      chex.assert_trees_all_close(seen, want, rtol=0, atol=3 * _ulp_bound(w, delta))
      if hook != 'identity':  # the hook acted: the plain delta is far
        assert not np.allclose(flatten_util.ravel_pytree(seen)[0], rows[j], atol=1e-3)


def test_injected_clients_trained_from_dyadic_weights_upload_exactly_their_delta(setup):
  """When w - d is exact in float32 (w and d multiples of 2^-10, small), a canary client's
  upload under identity hooks is delta_j bit for bit, and the server steps by the size-weighted
  mean of the real uploads and the deltas (real clients at learning rate 0 upload 0)."""
  loss_fn, params, x, y = setup
  params = jax.tree_util.tree_map(lambda a: jnp.round(a * 1024) / 1024, params)
  flat, unravel = flatten_util.ravel_pytree(params)
  rows = jnp.round(jax.random.normal(jax.random.key(9), (2, flat.shape[0])) * 64) / 1024
  inj = rounds.Injected(deltas=jax.vmap(unravel)(rows), sizes=jnp.asarray([6.0, 12.0]))
  final, log = rounds.run(loss_fn, params, rounds.ClientData(x, y), key=KEY, num_rounds=1,
                          optimizer=optimizers.make('sgd', 0.0), epochs=1, batch_size=3,
                          injected=inj, observe=lambda key, t, k, g, upload: upload,
                          init=_stacked_zeros(params, 5))
  got = jax.vmap(lambda u: flatten_util.ravel_pytree(u)[0])(log.observed)
  np.testing.assert_array_equal(got[3:], rows)
  np.testing.assert_array_equal(got[:3], 0.0)
  # Weights 6, 6, 6 (real, zero uploads), 6 and 12 (canaries): w - (6 d_0 + 12 d_1) / 36.
  np.testing.assert_allclose(flatten_util.ravel_pytree(final)[0],
                             flat - (6 * rows[0] + 12 * rows[1]) / 36, rtol=0, atol=1e-6)


def test_always_injected_canaries_take_part_in_every_round(shards):
  """`Injected(always=True)`: both canaries take part in every round, the fraction draws
  round(0.4 x 5) = 2 of the real clients only (`participant_indices` over K), and the server
  steps by the weighted mean of those 4 uploads (canaries weighed by their sizes)."""
  loss_fn, params, data = shards
  flat, unravel = flatten_util.ravel_pytree(params)
  rows = jnp.stack([jnp.full(flat.shape, 0.25), jnp.full(flat.shape, -0.5)])
  inj = rounds.Injected(deltas=jax.vmap(unravel)(rows), sizes=jnp.asarray([3.0, 1.0]),
                        always=True)
  kw = dict(optimizer=optimizers.make('sgd', 0.2), epochs=1, batch_size=2)
  num_rounds = 3
  final, log = rounds.run(loss_fn, params, data, key=KEY, num_rounds=num_rounds,
                          participation=0.4, injected=inj, reduce=_set_round,
                          observe=lambda key, t, k, g, upload: upload,
                          init=_stacked_zeros(params, num_rounds, 7), **kw)
  parts = np.asarray(log.participants)
  assert parts.shape == (num_rounds, 7)
  np.testing.assert_array_equal(parts[:, 5:], True)
  w = params
  for t in range(num_rounds):
    drawn = np.asarray(rounds.participant_indices(KEY, t, 5, 0.4))
    np.testing.assert_array_equal(np.flatnonzero(parts[t, :5]), drawn)
    ups = [local.client_update(loss_fn, w, data.x[k], data.y[k], mask=data.mask[k],
                               key=rounds.client_key(KEY, t, int(k)), **kw)[0] for k in drawn]
    ups += [unravel(rows[0]), unravel(rows[1])]
    weights = jnp.asarray([SIZES[k] for k in drawn] + [3.0, 1.0], jnp.float32)
    mean = aggregate.weighted_mean(_tree_stack(ups), weights)
    w = jax.tree_util.tree_map(jnp.subtract, w, mean)
  chex.assert_trees_all_close(final, w, rtol=1e-5, atol=1e-5)
