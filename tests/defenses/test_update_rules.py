"""Fast rule checks of the update defenses against brute force: top-k edges, min_size, small spans."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl_privacy.defenses import update


def _brute_top_k(x, k):
  flat = np.asarray(x).ravel()
  keep = np.argsort(-np.abs(flat), kind='stable')[:max(k, 0)]
  out = np.zeros_like(flat)
  out[keep] = flat[keep]
  return out.reshape(np.shape(x))


@pytest.mark.parametrize('k', [-1, 0, 1, 2, 11, 12, 15])
def test_top_k_leaf_matches_brute_force_at_the_edges(k):
  x = jnp.asarray(np.random.default_rng(3).permutation(np.arange(1, 13)) *
                  np.tile([1.0, -1.0], 6), jnp.float32).reshape(3, 4)
  np.testing.assert_array_equal(update.top_k_leaf(x, k), _brute_top_k(x, k))


def test_sparsify_min_size_is_inclusive_and_defaults_to_every_tensor():
  delta = {'scalar': jnp.asarray(2.0), 'one': jnp.asarray([-3.0]),
           'four': jnp.asarray([1.0, -4.0, 2.0, 3.0]), 'five': jnp.asarray([1., 5., -2., 4., 3.])}
  # Default min_size 0: every tensor, even one entry, keeps int(0.5 n) entries.
  out = update.sparsify(delta, 0.5)
  for name, x in delta.items():
    np.testing.assert_array_equal(out[name], _brute_top_k(x, int(0.5 * x.size)), err_msg=name)
  # min_size 4: tensors of at most 4 entries (4 included) are sent as they are.
  out = update.sparsify(delta, 0.5, min_size=4)
  for name in ('scalar', 'one', 'four'):
    np.testing.assert_array_equal(out[name], delta[name])
  np.testing.assert_array_equal(out['five'], [0., 5., 0., 4., 0.])


@pytest.mark.parametrize('scale', [1e-3, 0.3])
def test_quantize_leaf_of_a_narrow_tensor_is_on_its_levels_and_unbiased(scale):
  # Spans below 1 (update entries are usually small): levels lo + i span / 3.
  x = jnp.asarray(np.random.default_rng(4).normal(size=(16,)) * scale, jnp.float32)
  n, bits = 2000, 2
  q = np.asarray(jax.vmap(lambda k: update.quantize_leaf(k, x, bits))(
      jax.random.split(jax.random.key(5), n)), np.float64)
  lo, hi = float(x.min()), float(x.max())
  step = (hi - lo) / 3
  levels = lo + step * np.arange(4)
  assert np.all(np.min(np.abs(q[..., None] - levels), axis=-1) < 1e-5 * (hi - lo))
  # Each entry's mean over n draws is within 5 standard errors (sd <= step / 2) of x.
  assert np.all(np.abs(q.mean(0) - np.asarray(x, np.float64)) < 5 * (step / 2) / np.sqrt(n))
  # Each entry takes only the two levels around it.
  below = np.floor((np.asarray(x, np.float64) - lo) / step + 1e-6)
  assert np.all(q >= levels[np.clip(below, 0, 3).astype(int)] - 1e-6 * step)
  assert np.all(q <= levels[np.clip(below + 1, 0, 3).astype(int)] + 1e-6 * step)


def test_quantize_keeps_dtype_and_constant_tensors():
  delta = {'b': jnp.asarray([0.0, 0.5, 1.0, 0.25], jnp.bfloat16), 'c': jnp.full((3,), 0.1)}
  out = update.quantize(jax.random.key(0), delta, 1)
  assert out['b'].dtype == jnp.bfloat16 and out['c'].dtype == jnp.float32
  assert set(np.asarray(out['b'], np.float32).tolist()) <= {0.0, 1.0}
  np.testing.assert_array_equal(np.asarray(out['b'], np.float32)[[0, 2]], [0.0, 1.0])
  np.testing.assert_array_equal(out['c'], delta['c'])
