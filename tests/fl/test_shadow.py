"""`fl.shadow`: the server's IN models re-run the protocol; `train_recorded`'s `loss_in`."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fl_privacy import models
from fl_privacy.fl import client
from fl_privacy.fl import losses
from fl_privacy.fl import recording
from fl_privacy.fl import rounds
from fl_privacy.fl import shadow

MODEL = models.MLP(hidden=(8,), num_classes=3)


def _per_round(t):
  # A per-round learning rate, as FedMIA's cosine schedule: round t's must be the one re-run.
  return optax.sgd(0.3 / (1.0 + t), momentum=0.9)


def _noisy_upload(key, delta, aux):
  # A client-side defense with its own key: the re-run must draw it as the client does.
  del aux
  leaves, tree = jax.tree_util.tree_flatten(delta)
  keys = jax.random.split(key, len(leaves))
  return jax.tree_util.tree_unflatten(
      tree, [a + 0.01 * jax.random.normal(k, a.shape) for a, k in zip(leaves, keys)])


def _data(sizes=(8, 8, 8), dim=4, pool=12):
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(n, dim)).astype(np.float32) for n in sizes]
  ys = [rng.integers(0, 3, n).astype(np.int32) for n in sizes]
  px = rng.normal(size=(pool, dim)).astype(np.float32)
  py = rng.integers(0, 3, pool).astype(np.int32)
  params = MODEL.init(jax.random.key(1), px[:1])
  return xs, ys, px, py, params


def _record(xs, ys, px, py, params, *, hooks=None, **kw):
  clients = rounds.pad_clients(xs, ys)
  # Queries: every client row, then the pool (as `recording.query_set` orders them).
  qx, qy = np.concatenate(xs + [px]), np.concatenate(ys + [py])
  query_pool = np.r_[np.full(sum(len(x) for x in xs), -1), np.arange(len(px))]
  args = dict(key=jax.random.key(7), num_rounds=2, record_every=1, optimizer=_per_round,
              epochs=2, batch_size=3, hooks=hooks, chunk_size=5)
  args.update(kw)
  return clients, recording.train_recorded(MODEL.apply, params, clients, qx, qy, **args,
                                           shadow_x=px, shadow_y=py, query_pool=query_pool)


@pytest.mark.parametrize('sizes,hooks', [((8, 8, 8), None), ((8, 7, 5), None),
                                         ((8, 7, 5), client.ClientHooks(upload=_noisy_upload))])
def test_in_model_on_the_clients_own_shard_is_its_upload(sizes, hooks):
  """The re-run is the protocol: on client k's shard (the query at its own row) with k's round
  key and mask, the IN loss is the loss the recording measured on k's upload."""
  xs, ys, px, py, params = _data(sizes)
  key = jax.random.key(7)
  clients, rec = _record(xs, ys, px, py, params, hooks=hooks)
  w1, _ = rounds.run(losses.make_loss_fn(MODEL.apply), params, clients, key=key, num_rounds=1,
                     optimizer=_per_round, epochs=2, batch_size=3, hooks=hooks)
  run = jax.jit(functools.partial(shadow.in_loss, MODEL.apply, epochs=2, batch_size=3,
                                  hooks=hooks), static_argnames=('optimizer',))
  offsets = np.cumsum((0,) + sizes)
  for t, w_t in ((0, params), (1, w1)):
    opt = _per_round(t)
    for k in range(len(sizes)):
      mask = None if clients.mask is None else clients.mask[k]
      for i in (0, sizes[k] - 1):
        got, margin = run(w_t, clients.x[k], clients.y[k], i, xs[k][i], ys[k][i],
                          key=rounds.client_key(key, t, k), optimizer=opt, mask=mask)
        np.testing.assert_allclose(float(got), rec['loss'][t, k, offsets[k] + i], rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(float(margin), rec['margin'][t, k, offsets[k] + i],
                                   rtol=1e-5, atol=1e-5)
  # A different position (the query replacing another row) is a different model.
  other = run(params, clients.x[0], clients.y[0], 1, xs[0][0], ys[0][0],
              key=rounds.client_key(key, 0, 0), optimizer=_per_round(0),
              mask=None if clients.mask is None else clients.mask[0])[0]
  assert abs(float(other) - rec['loss'][0, 0, 0]) > 1e-4


def test_loss_in_is_the_documented_shadow_draw():
  """`loss_in[t, m, q]` is `in_loss` on the rows, position and key the module docstring names."""
  xs, ys, px, py, params = _data((8, 7, 5))
  key = jax.random.key(7)
  clients, rec = _record(xs, ys, px, py, params, in_models=3)
  assert rec['loss_in'].shape == (2, 3, 20 + 12) and rec['loss_in'].dtype == np.float32
  assert rec['margin_in'].shape == (2, 3, 20 + 12) and rec['margin_in'].dtype == np.float32
  size = int(rec['shadow_size'])
  assert size == 7  # the mean client size, rounded: 20 / 3
  w1, _ = rounds.run(losses.make_loss_fn(MODEL.apply), params, clients, key=key, num_rounds=1,
                     optimizer=_per_round, epochs=2, batch_size=3)
  qx, qy = np.concatenate(xs + [px]), np.concatenate(ys + [py])
  pool_index = np.r_[np.full(20, -1), np.arange(12)]
  # Jitted once per round's optimizer: op by op, the 24 re-runs took most of a minute.
  run = jax.jit(functools.partial(shadow.in_loss, MODEL.apply, epochs=2, batch_size=3),
                static_argnames=('optimizer',))
  opts = [_per_round(0), _per_round(1)]  # one object per round: a static argument
  for t, w_t in ((0, params), (1, w1)):
    for m in range(3):
      k_tm = shadow.shadow_key(key, t, m)
      rows = shadow.shadow_rows(jax.random.fold_in(k_tm, shadow.ROWS_SALT), 12, size)
      for q in (0, 19, 20, 31):
        k = jax.random.fold_in(k_tm, q)
        pos = shadow.insert_position(jax.random.fold_in(k, 0), rows, pool_index[q])
        got, margin = run(
            w_t, px[np.asarray(rows)], py[np.asarray(rows)], pos, qx[q], qy[q],
            key=jax.random.fold_in(k, 1), optimizer=opts[t],
            mask=jnp.ones(size))  # padded shards: the masked path
        np.testing.assert_allclose(float(got), rec['loss_in'][t, m, q], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(float(margin), rec['margin_in'][t, m, q], rtol=1e-5,
                                   atol=1e-5)
        # The margin is the loss's logit, log(p / (1 - p)) with p = exp(-loss), where the
        # float32 loss keeps its digits (these models are far from confident).
        p = np.exp(-np.float64(got))
        np.testing.assert_allclose(float(margin), np.log(p / (1 - p)), rtol=1e-4, atol=1e-4)


def test_loss_in_reproducible_and_independent_of_chunk_size():
  xs, ys, px, py, params = _data()
  _, a = _record(xs, ys, px, py, params, in_models=2, chunk_size=5)
  _, b = _record(xs, ys, px, py, params, in_models=2, chunk_size=32)
  _, c = _record(xs, ys, px, py, params, in_models=2, chunk_size=5)
  np.testing.assert_allclose(a['loss_in'], b['loss_in'], rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(a['loss_in'], c['loss_in'])
  np.testing.assert_allclose(a['margin_in'], b['margin_in'], rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(a['margin_in'], c['margin_in'])
  # The IN models of different shadow indices and rounds differ; so do another key's.
  assert not np.allclose(a['loss_in'][:, 0], a['loss_in'][:, 1])
  _, d = _record(xs, ys, px, py, params, in_models=2, key=jax.random.key(8))
  assert not np.allclose(a['loss_in'], d['loss_in'])


def test_without_in_models_the_recording_is_unchanged():
  xs, ys, px, py, params = _data((8, 7, 5))
  _, plain = _record(xs, ys, px, py, params)
  _, online = _record(xs, ys, px, py, params, in_models=2)
  assert 'loss_in' not in plain and 'margin_in' not in plain and 'shadow_size' not in plain
  assert 'margin' in plain
  assert set(online) == set(plain) | {'loss_in', 'margin_in', 'shadow_size'}
  for name, value in plain.items():
    np.testing.assert_array_equal(online[name], value, err_msg=name)


def test_shadow_sets_differ_by_index_and_hold_the_query_once():
  key = jax.random.key(3)
  a = np.asarray(shadow.shadow_rows(shadow.shadow_key(key, 4, 0), 50, 20))
  b = np.asarray(shadow.shadow_rows(shadow.shadow_key(key, 4, 1), 50, 20))
  c = np.asarray(shadow.shadow_rows(shadow.shadow_key(key, 5, 0), 50, 20))
  assert len(set(a)) == 20 and set(a) != set(b) and set(a) != set(c)
  # A pool smaller than a client is cycled: every row before any repeat.
  small = np.asarray(shadow.shadow_rows(key, 5, 12))
  assert sorted(small[:5]) == list(range(5)) and np.array_equal(small[5:10], small[:5])
  # The query replaces its own row when the set holds it, else a uniformly drawn row.
  assert int(shadow.insert_position(key, jnp.asarray(a), a[7])) == 7
  draws = np.array([int(shadow.insert_position(jax.random.key(i), jnp.asarray(a), -1))
                    for i in range(400)])
  counts = np.bincount(draws, minlength=20)
  assert draws.min() >= 0 and draws.max() < 20
  # 400 draws over 20 rows: 20 expected per row, sd ~4.4; every row drawn at least once w.h.p.
  assert counts.min() >= 3


def test_in_models_need_a_pool():
  xs, ys, px, py, params = _data()
  clients = rounds.pad_clients(xs, ys)
  with pytest.raises(ValueError, match='shadow_x'):
    recording.train_recorded(MODEL.apply, params, clients, px, py, key=jax.random.key(0),
                             num_rounds=1, record_every=1, optimizer=optax.sgd(0.1), epochs=1,
                             batch_size=4, in_models=2)
