"""fl_privacy.defenses.dp's four functions and hooks, each against numpy or the Gaussian
mechanism called directly: clipping, masking, denominators, noise scales (fast, no training)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl_privacy.defenses import dp
from fl_privacy.mechanisms import gaussian


def _tree(seed=0, lead=()):
  rng = np.random.default_rng(seed)
  return {'a': jnp.asarray(rng.normal(size=lead + (7,)), jnp.float32),
          'b': jnp.asarray(rng.normal(size=lead + (3, 2)), jnp.float32)}


def _leaves(t):
  return [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(t)]


def _np_norm(t):
  return float(np.sqrt(sum(np.sum(x ** 2) for x in _leaves(t))))


def _np_clip(t, c):
  n = _np_norm(t)
  return [x * min(1.0, c / n) if n > 0 else x for x in _leaves(t)]


def _close(got, want, **kw):
  kw.setdefault('rtol', 1e-5)
  kw.setdefault('atol', 1e-6)
  want = want if isinstance(want, list) else _leaves(want)
  got = _leaves(got)
  assert len(got) == len(want) > 0
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, **kw)


def test_global_norm_is_the_l2_norm_over_all_leaves():
  t = _tree()
  assert float(dp.global_norm(t)) == pytest.approx(_np_norm(t), rel=1e-6)
  assert float(dp.global_norm({'x': jnp.asarray([3.0]), 'y': jnp.asarray([[4.0]])})) == 5.0


@pytest.mark.parametrize('c', [0.5, 2.0, 100.0])
def test_clip_tree_scales_only_a_long_tree(c):
  t = _tree(1)
  _close(dp.clip_tree(t, c), _np_clip(t, c))
  assert float(dp.global_norm(dp.clip_tree(t, c))) == pytest.approx(min(c, _np_norm(t)),
                                                                      rel=1e-5)
  # Exactly at the norm: unchanged.
  at = jax.tree_util.tree_map(lambda x: x / _np_norm(t), t)
  _close(dp.clip_tree(at, 1.0), at, rtol=1e-6)


def test_clip_tree_keeps_zero_and_dtype():
  zero = {'a': jnp.zeros(4, jnp.bfloat16), 'b': jnp.zeros(2, jnp.float32)}
  out = dp.clip_tree(zero, 1.0)
  assert out['a'].dtype == jnp.bfloat16 and out['b'].dtype == jnp.float32
  assert all(np.all(x == 0) for x in _leaves(out))


def _stack(seed=2, n=5):
  t = _tree(seed, (n,))
  # Rows with norms from 0.1 to 10.
  scales = jnp.asarray(np.geomspace(0.1, 10, n), jnp.float32)
  norms = jnp.sqrt(sum(jnp.sum(x.reshape(n, -1) ** 2, 1) for x in jax.tree_util.tree_leaves(t)))
  return jax.tree_util.tree_map(
      lambda x: x * (scales / norms).reshape((n,) + (1,) * (x.ndim - 1)), t)


def _row(t, i):
  return jax.tree_util.tree_map(lambda x: x[i], t)


def _masked_clipped_sum(g, mask, c):
  rows = [_np_clip(_row(g, i), c) for i in range(len(mask)) if mask[i]]
  return [sum(r[j] for r in rows) for j in range(len(rows[0]))]


@pytest.mark.parametrize('mask', [[1, 1, 0, 1, 0], [1, 1, 1, 1, 1]])
def test_noise_free_private_gradient_divides_by_the_real_rows(mask):
  g, c = _stack(), 1.0
  out = dp.private_gradient(jax.random.key(0), g, jnp.asarray(mask, jnp.float32), c, 0.0)
  want = [s / sum(mask) for s in _masked_clipped_sum(g, mask, c)]
  _close(out, want)


def test_private_gradient_divides_by_the_denominator_when_given():
  g, mask, c = _stack(), [1, 0, 1, 1, 0], 0.7
  out = dp.private_gradient(jax.random.key(0), g, jnp.asarray(mask, jnp.float32), c, 0.0,
                            denominator=8)
  _close(out, [s / 8 for s in _masked_clipped_sum(g, mask, c)])
  hook = dp.dp_sgd_hook(c, 0.0, 8)(jax.random.key(0), g, jnp.asarray(mask, jnp.float32))
  _close(hook, out, rtol=0, atol=0)


def test_private_gradient_of_an_empty_batch_is_finite_noise():
  g = _stack()
  out = dp.private_gradient(jax.random.key(0), g, jnp.zeros(5), 1.0, 0.0)
  assert all(np.all(x == 0) for x in _leaves(out))
  noisy = dp.private_gradient(jax.random.key(0), g, jnp.zeros(5), 1.0, 2.0)
  noise = gaussian.add_noise(jax.random.key(0), jax.tree_util.tree_map(
      lambda x: jnp.zeros_like(x[0]), g), 2.0)
  _close(noisy, noise)  # divided by max(0 rows, 1)


@pytest.mark.parametrize('denominator', [None, 4.0])
def test_private_gradient_is_the_clipped_sum_plus_gaussian_noise_over_n(denominator):
  g, mask, c, z = _stack(), [1, 1, 0, 1, 1], 0.8, 1.7
  key = jax.random.key(3)
  out = dp.private_gradient(key, g, jnp.asarray(mask, jnp.float32), c, z, denominator)
  summed = _masked_clipped_sum(g, mask, c)
  treedef = jax.tree_util.tree_structure(_row(g, 0))
  noisy = gaussian.add_noise(key, jax.tree_util.tree_unflatten(
      treedef, [jnp.asarray(s, jnp.float32) for s in summed]), z * c)
  n = 4 if denominator is None else denominator
  _close(out, [x / n for x in _leaves(noisy)])
  hook = dp.dp_sgd_hook(c, z, denominator)(key, g, jnp.asarray(mask, jnp.float32))
  _close(hook, out, rtol=0, atol=0)


def test_private_gradient_noise_std():
  n, c, z = 4, 0.5, 3.0
  g = {'w': jnp.zeros((n, 20000), jnp.float32)}
  out = np.asarray(dp.private_gradient(jax.random.key(5), g, jnp.ones(n), c, z)['w'])
  # The std of 20,000 draws is within 2% of the truth (its relative error is ~0.5%).
  assert out.std() == pytest.approx(z * c / n, rel=0.02)


def test_clip_and_noise_update_and_its_hook():
  t, c, z = _tree(4), 0.9, 1.3
  key = jax.random.key(6)
  out = dp.clip_and_noise_update(key, t, c, z)
  treedef = jax.tree_util.tree_structure(t)
  clipped = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(x, jnp.float32)
                                                   for x in _np_clip(t, c)])
  _close(out, gaussian.add_noise(key, clipped, z * c))
  _close(dp.update_dp_hook(c, z)(key, t, object()), out, rtol=0, atol=0)
  big = {'w': jnp.zeros(20000)}
  assert np.asarray(dp.clip_and_noise_update(key, big, c, z)['w']).std() == pytest.approx(
      z * c, rel=0.02)


def test_dp_fedavg_equal_weights_over_participants():
  g, c = _stack(7, 4), 1.0
  weights = jnp.asarray([3.0, 0.0, 0.5, -1.0])  # participants: 0 and 2
  out = dp.dp_fedavg(jax.random.key(0), g, weights, c, 0.0)
  want = [(a + b) / 2 for a, b in zip(_np_clip(_row(g, 0), c), _np_clip(_row(g, 2), c))]
  _close(out, want)
  _close(dp.central_dp_hook(c, 0.0)(jax.random.key(0), g, weights), out, rtol=0, atol=0)


def test_dp_fedavg_noise_is_zc_over_k_and_no_participant_is_a_zero_update():
  g, c, z, key = _stack(8, 4), 0.6, 2.5, jax.random.key(9)
  weights = jnp.asarray([1.0, 1.0, 0.0, 1.0])
  out = dp.dp_fedavg(key, g, weights, c, z)
  clean = dp.dp_fedavg(key, g, weights, c, 0.0)
  noise = gaussian.add_noise(key, clean, z * c / 3)
  _close(out, noise)
  _close(dp.central_dp_hook(c, z)(key, g, weights), out, rtol=0, atol=0)
  none = dp.dp_fedavg(key, g, jnp.zeros(4), c, z)
  assert all(np.all(x == 0) for x in _leaves(none))
  big = {'w': jnp.zeros((3, 20000))}
  std = np.asarray(dp.dp_fedavg(key, big, jnp.ones(3), c, z)['w']).std()
  assert std == pytest.approx(z * c / 3, rel=0.02)


def test_a_single_participant_is_its_clipped_update():
  g, c = _stack(10, 3), 1.0
  out = dp.dp_fedavg(jax.random.key(0), g, jnp.asarray([0.0, 2.0, 0.0]), c, 0.0)
  _close(out, _np_clip(_row(g, 1), c))


def test_outputs_keep_the_gradient_dtype():
  g = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), _stack(11, 4))
  mask = jnp.asarray([1.0, 1.0, 0.0, 1.0])
  for denominator in (None, 4.0):
    out = dp.private_gradient(jax.random.key(0), g, mask, 1.0, 0.5, denominator)
    assert {x.dtype for x in jax.tree_util.tree_leaves(out)} == {jnp.dtype(jnp.bfloat16)}
  # (dp_fedavg returns float32 for bfloat16 uploads: its noise scale z C / K is a float32
  # array, which promotes; docs/testing.md.)
