"""Losses and vectorised gradients against independent computations."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import log_softmax

from fl_privacy import fl
from fl_privacy import models
from fl_privacy.fl import losses

KEY = jax.random.key(0)


@pytest.fixture(scope='module')
def setup():
  model = models.MLP(hidden=(8,), num_classes=3)
  x = jax.random.normal(jax.random.key(1), (6, 5))
  y = jnp.array([0, 1, 2, 2, 1, 0], jnp.int32)
  params = model.init(KEY, x)
  return fl.make_loss_fn(model.apply), params, x, y


def test_cross_entropy_matches_scipy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(7, 4)) * 3
  labels = rng.integers(0, 4, size=7)
  want = -log_softmax(logits, axis=1)[np.arange(7), labels]
  got = fl.per_example_cross_entropy(jnp.asarray(logits, jnp.float32),
                                     jnp.asarray(labels))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  np.testing.assert_allclose(
      fl.cross_entropy(jnp.asarray(logits, jnp.float32), jnp.asarray(labels)),
      want.mean(), rtol=1e-5)


def test_per_example_grads_equal_loop(setup):
  loss_fn, params, x, y = setup
  got = fl.per_example_grads(loss_fn, params, x, y)
  single = jax.jit(jax.grad(loss_fn))
  for i in range(x.shape[0]):
    want = single(params, x[i:i + 1], y[i:i + 1])
    chex.assert_trees_all_close(jax.tree_util.tree_map(lambda g: g[i], got),
                                want, rtol=1e-5, atol=1e-6)


def test_mean_of_per_example_grads_is_batch_grad(setup):
  loss_fn, params, x, y = setup
  per_example = fl.per_example_grads(loss_fn, params, x, y)
  chex.assert_trees_all_close(
      jax.tree_util.tree_map(lambda g: g.mean(0), per_example),
      jax.grad(loss_fn)(params, x, y), rtol=1e-5, atol=1e-6)


def test_client_grads_equal_loop(setup):
  loss_fn, params, x, y = setup
  xs, ys = x.reshape(3, 2, 5), y.reshape(3, 2)
  got = jax.jit(fl.client_grads, static_argnums=0)(loss_fn, params, xs, ys)
  for k in range(3):
    chex.assert_trees_all_close(jax.tree_util.tree_map(lambda g: g[k], got),
                                fl.fedsgd(loss_fn, params, xs[k], ys[k]),
                                rtol=1e-5, atol=1e-6)


def test_masked_mean_soft_labels_and_an_all_padding_batch():
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(5, 3)) * 2, jnp.float32)
  labels = jnp.asarray([2, 0, 1, 1, 0])
  per_example = -log_softmax(np.asarray(logits, np.float64), axis=1)[np.arange(5), labels]
  mask = jnp.asarray([1, 0, 1, 1, 0], jnp.int32)
  np.testing.assert_allclose(fl.cross_entropy(logits, labels, mask),
                             per_example[[0, 2, 3]].mean(), rtol=1e-5)
  np.testing.assert_allclose(losses.masked_mean(jnp.asarray([1.0, 2.0, 4.0]), None),
                             7 / 3, rtol=1e-6)
  # A row mask of weights 0.5 (no real row in full): sum / max(sum(mask), 1).
  np.testing.assert_allclose(
      losses.masked_mean(jnp.asarray([2.0, 4.0]), jnp.asarray([0.5, 0.0])), 1.0, rtol=1e-6)
  # Soft labels: a one-hot distribution is the integer label; a mixture mixes the losses.
  soft = jax.nn.one_hot(labels, 3).at[0].set(jnp.asarray([0.25, 0.0, 0.75]))
  want = per_example.copy()
  want[0] = -0.25 * log_softmax(np.asarray(logits[0], np.float64))[0] + 0.75 * per_example[0]
  np.testing.assert_allclose(fl.per_example_cross_entropy(logits, soft), want, rtol=1e-5)
  # All padding: loss 0 and gradient exactly 0, not NaN.
  zero = jnp.zeros(5)
  assert float(fl.cross_entropy(logits, labels, zero)) == 0.0
  g = jax.grad(lambda lg: fl.cross_entropy(lg, labels, zero))(logits)
  np.testing.assert_array_equal(g, 0.0)


def test_make_loss_fn_takes_the_mask(setup):
  loss_fn, params, x, y = setup
  mask = jnp.asarray([1, 1, 0, 1, 0, 0], jnp.float32)
  keep = np.asarray([0, 1, 3])
  np.testing.assert_allclose(loss_fn(params, x, y, mask), loss_fn(params, x[keep], y[keep]),
                             rtol=1e-6)
  assert not np.isclose(loss_fn(params, x, y, mask), loss_fn(params, x, y))


def test_masked_mean_keeps_the_dtype_of_the_values():
  # The mask takes the values' dtype, so a half-precision loss stays half precision
  # (an integer or float32 mask does not promote it).
  values = jnp.asarray([1.0, 2.0, 4.0], jnp.bfloat16)
  for mask in (jnp.asarray([1, 0, 1], jnp.int32), jnp.asarray([1.0, 0.0, 1.0], jnp.float32)):
    got = losses.masked_mean(values, mask)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.float32(got), 2.5)
