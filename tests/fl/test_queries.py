"""`fl.queries.measure` equals a plain per-example, per-client loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl_privacy import models
from fl_privacy.fl import losses
from fl_privacy.fl import queries


def _setup(num_clients=3, num_queries=7):
  model = models.MLP(hidden=(6,), num_classes=4)
  key = jax.random.key(0)
  x = jax.random.normal(jax.random.fold_in(key, 1), (num_queries, 5))
  y = jax.random.randint(jax.random.fold_in(key, 2), (num_queries,), 0, 4)
  params = model.init(jax.random.fold_in(key, 3), x[:1])
  uploads = jax.tree_util.tree_map(
      lambda p: 0.1 * jax.random.normal(jax.random.fold_in(key, 4), (num_clients,) + p.shape),
      params)
  # Client 1 uploads a zero update: its cosines must be 0, not NaN.
  uploads = jax.tree_util.tree_map(lambda u: u.at[1].set(0.0), uploads)
  return model, params, uploads, x, y


def _loop(model, params, uploads, x, y):
  def flat(tree):
    return np.concatenate([np.ravel(np.asarray(a, np.float64))
                           for a in jax.tree_util.tree_leaves(tree)])

  num_clients = jax.tree_util.tree_leaves(uploads)[0].shape[0]
  out = {n: np.zeros((num_clients, len(x))) for n in ('loss', 'cos', 'diff', 'margin')}
  grad_sq = np.zeros(len(x))
  for q in range(len(x)):
    g = flat(jax.grad(lambda p: losses.cross_entropy(model.apply(p, x[q:q + 1]),
                                                     y[q:q + 1]))(params))
    grad_sq[q] = g @ g
    for k in range(num_clients):
      u = jax.tree_util.tree_map(lambda a: a[k], uploads)
      d = flat(u)
      local = jax.tree_util.tree_map(jnp.subtract, params, u)
      out['loss'][k, q] = float(losses.cross_entropy(model.apply(local, x[q:q + 1]),
                                                     y[q:q + 1]))
      z = np.asarray(model.apply(local, x[q:q + 1])[0], np.float64)
      yq = int(y[q])
      out['margin'][k, q] = z[yq] - np.logaddexp.reduce(np.delete(z, yq))
      nd = np.linalg.norm(d)
      out['cos'][k, q] = 0.0 if nd == 0 else (g @ d) / (np.linalg.norm(g) * nd)
      out['diff'][k, q] = d @ d - (d - g) @ (d - g)
  return out, grad_sq


@pytest.mark.parametrize('chunk_size', [1, 3, 7, 100])
def test_measure_equals_per_example_loop(chunk_size):
  model, params, uploads, x, y = _setup()
  got = queries.measure_numpy(model.apply, params, uploads, x, y, chunk_size=chunk_size)
  want, grad_sq = _loop(model, params, uploads, x, y)
  for name in ('loss', 'cos', 'diff', 'margin'):
    np.testing.assert_allclose(getattr(got, name), want[name], rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(got.grad_sq, grad_sq, rtol=2e-5)
  assert np.all(got.cos[1] == 0.0)
  assert got.loss.shape == (3, 7) and got.grad_sq.shape == (7,)


def test_measure_chunk_size_does_not_change_results():
  model, params, uploads, x, y = _setup(num_clients=4, num_queries=11)
  a = queries.measure_numpy(model.apply, params, uploads, x, y, chunk_size=2)
  b = queries.measure_numpy(model.apply, params, uploads, x, y, chunk_size=11)
  for u, v in zip(a, b):
    np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7)


def test_member_gradient_aligns_with_its_update():
  """A one-step SGD update on (x, y) has cosine 1 with that example's gradient (the sign of
  Delta = w_t - w_local)."""
  model, params, _, x, y = _setup()
  g = jax.grad(lambda p: losses.cross_entropy(model.apply(p, x[:1]), y[:1]))(params)
  uploads = jax.tree_util.tree_map(lambda a: 0.5 * a[None], g)
  got = queries.measure_numpy(model.apply, params, uploads, x[:1], y[:1], chunk_size=1)
  assert got.cos[0, 0] == pytest.approx(1.0, abs=1e-5)
  # ||D||^2 - ||D - g||^2 = 0.25 |g|^2 - 0.25 |g|^2.
  assert abs(got.diff[0, 0]) <= 1e-4 * got.grad_sq[0]


def test_measure_checks_its_arguments():
  model, params, uploads, x, y = _setup()
  with pytest.raises(ValueError, match=r'^chunk_size must be >= 1 \(got 0\)$'):
    queries.measure(model.apply, params, uploads, x, y, chunk_size=0)
  with pytest.raises(ValueError, match=r'^7 queries but 6 labels$'):
    queries.measure(model.apply, params, uploads, x, y[:6], chunk_size=2)
  with pytest.raises(ValueError, match=r'^measure needs at least one query$'):
    queries.measure(model.apply, params, uploads, x[:0], y[:0], chunk_size=2)


def test_flatten_stack_of_one_leaf_and_of_a_tree():
  # A bare array is a one-leaf tree: [K, ...] -> [K, P].
  a = jnp.arange(12.0).reshape(3, 2, 2)
  np.testing.assert_array_equal(queries.flatten_stack(a), np.arange(12.0).reshape(3, 4))
  tree = {'b': jnp.ones((3, 2), jnp.bfloat16), 'w': a}
  got = queries.flatten_stack(tree)
  assert got.dtype == jnp.float32 and got.shape == (3, 6)
  want = np.concatenate([np.ones((3, 2)), np.arange(12.0).reshape(3, 4)], axis=1)
  np.testing.assert_array_equal(got, want)


def _scalar_inputs_model(params, x):
  """Logits [N, 3] of scalar inputs [N] (queries with no trailing axes)."""
  return x[:, None] * params['w'] + params['b']


def test_measure_takes_queries_without_trailing_axes():
  key = jax.random.key(5)
  params = {'w': jnp.asarray([1.0, -1.0, 0.5]), 'b': jnp.asarray([0.0, 0.2, -0.1])}
  uploads = jax.tree_util.tree_map(
      lambda p: 0.1 * jax.random.normal(jax.random.fold_in(key, p.size), (2,) + p.shape), params)
  x = jax.random.normal(jax.random.fold_in(key, 1), (5,))
  y = jnp.asarray([0, 1, 2, 1, 0])
  got = queries.measure_numpy(_scalar_inputs_model, params, uploads, x, y, chunk_size=4)
  assert got.loss.shape == (2, 5) and got.grad_sq.shape == (5,)
  for k in range(2):
    local = jax.tree_util.tree_map(lambda p, u: p - u[k], params, uploads)
    np.testing.assert_allclose(
        got.loss[k], losses.per_example_cross_entropy(_scalar_inputs_model(local, x), y),
        rtol=1e-5)


def _linear(params, x):
  """Logits x @ W: the test sets them exactly through x and W."""
  return x @ params['w']


@pytest.mark.parametrize('num_classes', [2, 5])
def test_margin_is_exact_where_the_float32_loss_is_zero(num_classes):
  """At logit margins 10-60 the recorded margin z_y - logsumexp_{j != y} z_j is exact to
  float32 rounding, where the float32 cross-entropy is exactly 0 from a margin of about 17
  (and phi = log(p / (1 - p)) from it is undefined)."""
  target = np.arange(10.0, 61.0)
  q = target.size
  # Logits: the true class (q % C) at 3 + m, the others at 3 - j / 4 (j = 1..C-1); the exact
  # margin in float64 below.
  others = -np.arange(1, num_classes) / 4.0
  y = (np.arange(q) % num_classes).astype(np.int32)
  logits = np.empty((q, num_classes))
  for i in range(q):
    rest = np.delete(np.arange(num_classes), y[i])
    logits[i, rest] = 3.0 + others
    logits[i, y[i]] = 3.0 + target[i]
  want = np.array([logits[i, y[i]] - np.logaddexp.reduce(np.delete(logits[i], y[i]))
                   for i in range(q)])
  x = jnp.asarray(logits, jnp.float32)
  params = {'w': jnp.eye(num_classes, dtype=jnp.float32)}
  uploads = {'w': jnp.zeros((2, num_classes, num_classes), jnp.float32)}
  got = queries.measure_numpy(_linear, params, uploads, x, jnp.asarray(y), chunk_size=16)
  assert got.margin.shape == (2, q) and got.margin.dtype == np.float32
  # float32 logits of size <= 63: absolute error a few ulps of 64 (4e-6 each).
  np.testing.assert_allclose(got.margin, np.broadcast_to(want, (2, q)), rtol=0, atol=2e-5)
  # The regime the margin is for: the float32 loss is exactly 0 from a margin of ~17 on.
  assert (got.loss[:, target >= 20] == 0).all()
  # The same from losses.true_label_margin directly, and its C = 1 edge (+inf).
  direct = np.asarray(losses.true_label_margin(x, jnp.asarray(y)))
  np.testing.assert_allclose(direct, want, rtol=0, atol=2e-5)
  assert np.isposinf(np.asarray(losses.true_label_margin(jnp.zeros((1, 1)),
                                                         jnp.zeros(1, jnp.int32))))[0]
