"""Gaussian noise and per-example clipping: KS tests on the scale, clip norms, purity."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sp_stats

from fl_privacy import validate
from fl_privacy.mechanisms import gaussian

ALPHA = 1e-3  # KS significance level


def _maybe_jit(fn, jit):
  return jax.jit(fn) if jit else fn


def test_sigma_for_matches_dwork_roth():
  assert gaussian.sigma_for(0.5, 1e-5) == pytest.approx(
      math.sqrt(2 * math.log(1.25e5)) / 0.5, rel=1e-12)
  assert gaussian.sigma_for(8.0, 1e-2, sensitivity=3.0) == pytest.approx(
      3 * math.sqrt(2 * math.log(125)) / 8)


@pytest.mark.parametrize('field,args', [('epsilon', (0.0, 1e-5)), ('delta', (1.0, 0.0)),
                                        ('delta', (1.0, 1.0)),
                                        ('sensitivity', (1.0, 1e-5, -1.0))])
def test_sigma_for_rejects_bad_values(field, args):
  with pytest.raises(validate.ConfigError) as e:
    gaussian.sigma_for(*args)
  assert e.value.field == field


@pytest.mark.parametrize('jit', [False, True])
def test_ks_accepts_the_right_scale_and_rejects_others(jit):
  sigma = 1.7
  fn = _maybe_jit(lambda key, x: gaussian.add_noise(key, x, sigma), jit)
  noise = np.asarray(fn(jax.random.key(0), jnp.zeros((20_000,), jnp.float32)))
  assert sp_stats.kstest(noise, 'norm', args=(0, sigma)).pvalue > ALPHA
  for wrong in (2 / 3 * sigma, 3 / 2 * sigma):
    assert sp_stats.kstest(noise, 'norm', args=(0, wrong)).pvalue < ALPHA


@pytest.mark.parametrize('jit', [False, True])
def test_noise_is_pure_unique_and_per_leaf(jit):
  tree = {'a': jnp.ones((3, 4)), 'b': (jnp.ones((3, 4)), jnp.zeros(2, jnp.float16))}
  fn = _maybe_jit(lambda key, t: gaussian.add_noise(key, t, 1.0), jit)
  one = fn(jax.random.key(0), tree)
  again = fn(jax.random.key(0), tree)
  other = fn(jax.random.key(1), tree)
  jax.tree_util.tree_map(np.testing.assert_array_equal, one, again)
  assert not np.array_equal(one['a'], other['a'])
  assert not np.array_equal(one['a'], one['b'][0])  # identical leaves, different noise
  assert one['b'][1].dtype == jnp.float16
  # jit fuses the normal transform differently: equal up to float rounding
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  jax.tree_util.tree_map(close, one,
                         _maybe_jit(lambda k, t: gaussian.add_noise(k, t, 1.0),
                                    not jit)(jax.random.key(0), tree))


def _numpy_clip(g, c):
  flat = np.concatenate([np.reshape(v, (v.shape[0], -1)) for v in g], axis=1)
  norms = np.linalg.norm(flat, axis=1)
  scale = np.minimum(1.0, c / np.where(norms > 0, norms, 1.0))
  return [v * scale.reshape((-1,) + (1,) * (v.ndim - 1)) for v in g], norms


@pytest.mark.parametrize('jit', [False, True])
def test_clip_respects_the_norm_and_matches_numpy(jit):
  rng = np.random.default_rng(0)
  g = [(rng.normal(size=(6, 3, 2)) * rng.uniform(0, 3, (6, 1, 1))).astype(np.float32),
       rng.normal(size=(6, 5)).astype(np.float32)]
  g[0][2] = 0.0
  g[1][2] = 0.0
  clip = _maybe_jit(lambda g: gaussian.clip_per_example(g, 1.5), jit)
  clipped, norms = clip(g)
  want, want_norms = _numpy_clip(g, 1.5)
  np.testing.assert_allclose(norms, want_norms, rtol=1e-5)
  for got, w in zip(clipped, want):
    np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-7)
  after = np.asarray(gaussian.per_example_norms(clipped))
  assert (after <= 1.5 * (1 + 1e-6)).all()
  small = want_norms <= 1.5
  np.testing.assert_allclose(after[small], want_norms[small], rtol=1e-5)


@pytest.mark.parametrize('jit', [False, True])
@pytest.mark.parametrize('reduce', ['mean', 'sum'])
def test_clip_and_noise_mean_and_noise_scale(jit, reduce):
  n, d, clip_norm, sigma = 8, 20_000, 0.5, 1.3
  g = jnp.zeros((n, d)).at[:, 0].set(10.0)  # every example clipped to 0.5 on axis 0
  fn = _maybe_jit(lambda key, g: gaussian.clip_and_noise(key, g, clip_norm, sigma,
                                                         reduce=reduce), jit)
  out = np.asarray(fn(jax.random.key(3), g))
  divisor = n if reduce == 'mean' else 1
  scale = sigma * clip_norm / divisor
  assert sp_stats.kstest(out[1:], 'norm', args=(0, scale)).pvalue > ALPHA
  for wrong in (2 / 3 * scale, 3 / 2 * scale):
    assert sp_stats.kstest(out[1:], 'norm', args=(0, wrong)).pvalue < ALPHA
  noiseless = gaussian.clip_and_noise(jax.random.key(3), g, clip_norm, 0.0, reduce=reduce)
  np.testing.assert_allclose(noiseless[0], n * clip_norm / divisor, rtol=1e-6)
  np.testing.assert_array_equal(noiseless[1:], 0.0)


def test_clip_and_noise_rejects_unknown_reduction():
  with pytest.raises(validate.ConfigError) as e:
    gaussian.clip_and_noise(jax.random.key(0), jnp.ones((2, 3)), 1.0, 1.0, reduce='max')
  assert e.value.field == 'reduce'


def test_error_messages_name_the_rule_and_the_value():
  with pytest.raises(validate.ConfigError) as e:
    gaussian.sigma_for(1.0, 1e-5, sensitivity=-2.0)
  assert (e.value.allowed, e.value.got) == ('a finite number > 0', -2.0)
  with pytest.raises(validate.ConfigError) as e:
    gaussian.sigma_for(1.0, 1.5)
  assert (e.value.allowed, e.value.got) == ('in (0, 1)', 1.5)
  with pytest.raises(validate.ConfigError) as e:
    gaussian.clip_and_noise(jax.random.key(0), jnp.ones((2, 3)), 1.0, 1.0, reduce='max')
  assert (e.value.allowed, e.value.got) == ("one of ('mean', 'sum')", 'max')


def test_clip_and_noise_default_reduction_is_the_mean():
  g = {'w': jnp.asarray(np.random.default_rng(2).normal(size=(4, 3)), jnp.float32)}
  key = jax.random.key(4)
  np.testing.assert_array_equal(gaussian.clip_and_noise(key, g, 1.0, 0.5)['w'],
                                gaussian.clip_and_noise(key, g, 1.0, 0.5, reduce='mean')['w'])


def test_clip_keeps_each_leaf_dtype():
  g = {'a': jnp.full((3, 2), 2.0, jnp.float16), 'b': jnp.full((3,), 2.0, jnp.bfloat16)}
  clipped, _ = gaussian.clip_per_example(g, 1.0)
  assert clipped['a'].dtype == jnp.float16 and clipped['b'].dtype == jnp.bfloat16
  # norm sqrt(3 * 4) per example: every entry scaled to 2 / sqrt(12)
  np.testing.assert_allclose(np.asarray(clipped['a'], np.float32), 2 / math.sqrt(12), rtol=1e-2)


def test_leaf_i_is_x_plus_sigma_times_the_normal_of_fold_in_key_i():
  # The module's documented draw: leaf i + sigma * normal(fold_in(key, i)).
  tree = {'a': jnp.arange(6.0).reshape(2, 3), 'b': jnp.ones((4,))}
  key, sigma = jax.random.key(9), 0.7
  out = gaussian.add_noise(key, tree, sigma)
  for i, name in enumerate(('a', 'b')):  # tree_util order
    want = tree[name] + sigma * jax.random.normal(jax.random.fold_in(key, i), tree[name].shape)
    np.testing.assert_allclose(out[name], want, rtol=1e-6, atol=1e-6)
