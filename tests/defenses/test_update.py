"""Update defenses: sparsify keeps exactly k entries, quantisation is unbiased on its levels."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl_privacy import defenses
from fl_privacy.defenses import update


def _delta(seed=0):
  rng = np.random.default_rng(seed)
  return {'big': jnp.asarray(rng.normal(size=(40, 30)), jnp.float32),   # 1,200 > 1,000
          'small': jnp.asarray(rng.normal(size=(50,)), jnp.float32)}


@pytest.mark.parametrize('jit', [False, True])
@pytest.mark.parametrize('p', [0.9, 0.99, 0.5, 1.0])
def test_fedmia_sparsify_keeps_exactly_k_largest(jit, p):
  delta = _delta()
  hooks = defenses.make('sparsify', sparsity=p)  # FedMIA: min_size 1,000
  fn = jax.jit(hooks.upload) if jit else hooks.upload
  out = fn(jax.random.key(0), delta, None)
  big = np.asarray(out['big'])
  k = int((1 - p) * 1200)  # the code's int((1 - p) n)
  assert np.count_nonzero(big) == k
  kept = np.abs(np.asarray(delta['big']))[big != 0]
  dropped = np.abs(np.asarray(delta['big']))[big == 0]
  if k:
    assert kept.min() >= dropped.max()
    np.testing.assert_array_equal(big[big != 0], np.asarray(delta['big'])[big != 0])
  # Tensors of at most 1,000 entries are sent as they are.
  np.testing.assert_array_equal(out['small'], delta['small'])


def test_plain_top_k_sparsifies_every_tensor():
  delta = _delta()
  out = defenses.make('sparsify', sparsity=0.9, min_size=0).upload(jax.random.key(0), delta,
                                                                  None)
  # int((1 - p) n) in float64, as the FedMIA code computes it: (1 - 0.9) * 50 = 4.99... -> 4.
  assert np.count_nonzero(np.asarray(out['small'])) == int((1 - 0.9) * 50) == 4
  assert np.count_nonzero(np.asarray(out['big'])) == int((1 - 0.9) * 1200)


@pytest.mark.parametrize('bits', [1, 2, 4])
def test_quantize_is_unbiased_and_on_levels(bits):
  x = jnp.asarray(np.random.default_rng(1).normal(size=(64,)), jnp.float32)
  n = 4000
  keys = jax.random.split(jax.random.key(2), n)
  q = np.asarray(jax.jit(jax.vmap(lambda k: update.quantize_leaf(k, x, bits)))(keys))
  lo, hi = float(x.min()), float(x.max())
  levels = lo + (hi - lo) * np.arange(2 ** bits) / (2 ** bits - 1)
  # Every output is one of the 2^b levels (float32 rounding aside).
  assert np.all(np.min(np.abs(q[..., None] - levels), axis=-1) < 1e-5 * (hi - lo))
  # Unbiased: each entry's mean over n draws is within 5 standard errors of x; the per-draw
  # variance of stochastic rounding is at most step^2 / 4.
  step = (hi - lo) / (2 ** bits - 1)
  tol = 5 * (step / 2) / np.sqrt(n)
  np.testing.assert_array_less(np.abs(q.mean(axis=0) - np.asarray(x)), tol + 1e-6)
  # The extremes are levels themselves and never move.
  np.testing.assert_allclose(q[:, np.argmin(x)], lo, atol=1e-6)
  np.testing.assert_allclose(q[:, np.argmax(x)], hi, atol=1e-6)


def test_quantize_hook_and_constant_tensor():
  delta = {'a': jnp.full((5,), 0.25), 'b': jnp.arange(6.0)}
  out = jax.jit(defenses.make('quantize', bits=8).upload)(jax.random.key(0), delta, None)
  np.testing.assert_array_equal(out['a'], delta['a'])
  np.testing.assert_allclose(out['b'], delta['b'], atol=5 / 255 + 1e-6)


def test_update_noise_scale():
  delta = {'w': jnp.zeros((200, 100))}
  out = defenses.make('update_noise', sigma=0.3).upload(jax.random.key(0), delta, None)
  w = np.asarray(out['w']).ravel()
  # Sample std of 20,000 normals: relative standard error ~ 1 / sqrt(2 n) = 0.5%.
  assert abs(w.std() / 0.3 - 1) < 5 / np.sqrt(2 * w.size)
  assert abs(w.mean()) < 5 * 0.3 / np.sqrt(w.size)
