"""DP baselines of the PASTEL experiment: clipping, noise scale (KS), accounting = dp-accounting."""

from __future__ import annotations

import math

import dp_accounting
from dp_accounting import rdp
import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from fl_privacy.defenses import pastel_dp


def test_clip_bounds_the_norm_and_keeps_small_trees():
  key = jax.random.key(0)
  for i in range(20):
    tree = {'a': 3 * jax.random.normal(jax.random.fold_in(key, i), (5, 4)), 'b': jnp.ones(3)}
    out, clipped = pastel_dp.clip(tree, 1.5)
    norm = float(pastel_dp._global_norm(out))
    assert norm <= 1.5 * (1 + 1e-6)
    assert bool(clipped) == (float(pastel_dp._global_norm(tree)) > 1.5)
  small = {'a': jnp.full((2,), 0.1)}
  out, clipped = pastel_dp.clip(small, 1.0)
  np.testing.assert_array_equal(out['a'], small['a'])
  assert not bool(clipped)


def test_dp_sgd_noise_has_the_stated_scale():
  sigma, c, b = 1.7, 0.5, 8
  grad = pastel_dp.dp_sgd_grad(c, sigma, b)
  per_example = {'w': jnp.zeros((b, 4000))}
  g = grad(jax.random.key(1), per_example, jnp.ones(b))
  z = np.asarray(g['w']) * b / (sigma * c)
  assert stats.kstest(z, 'norm').pvalue > 1e-3
  # Large per-example gradients: each contributes at most C before the noise.
  big = {'w': 100 * jnp.ones((b, 3))}
  g = pastel_dp.dp_sgd_grad(c, 0.0, b)(jax.random.key(2), big, jnp.ones(b))
  np.testing.assert_allclose(np.linalg.norm(np.asarray(g['w'])), c, rtol=1e-5)


def test_central_dp_noise_and_clipping():
  z, c, k = 2.0, 0.3, 5
  agg = pastel_dp.central_dp_aggregate(c, z)
  mean = agg(jax.random.key(3), {'w': jnp.zeros((k, 5000))}, jnp.ones(k))
  assert stats.kstest(np.asarray(mean['w']) / (z * c / k), 'norm').pvalue > 1e-3
  mean = pastel_dp.central_dp_aggregate(c, 0.0)(jax.random.key(4), {'w': 10 * jnp.ones((k, 4))},
                                                jnp.arange(1.0, k + 1))
  np.testing.assert_allclose(np.linalg.norm(np.asarray(mean['w'])), c, rtol=1e-5)


def _direct(event, delta):
  acc = rdp.RdpAccountant()
  acc.compose(event)
  return acc.get_epsilon(delta)


def test_accounting_equals_dp_accounting_called_directly():
  delta = 1e-5
  _, info = pastel_dp.make('ldp', target_epsilon=4.0, delta=delta, num_rounds=10, epochs=2,
                           batch_size=32, num_examples=230)
  steps = 2 * math.ceil(230 / 32) * 10
  direct = _direct(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
      32 / 230, dp_accounting.GaussianDpEvent(info['noise_multiplier'])), steps), delta)
  assert info['dp_steps'] == steps
  np.testing.assert_allclose(info['dp_epsilon'], direct, rtol=1e-9)
  assert info['dp_epsilon'] <= 4.0 + 1e-3 and info['dp_epsilon'] > 3.9
  _, info = pastel_dp.make('cdp', target_epsilon=1.0, delta=delta, num_rounds=40)
  direct = _direct(dp_accounting.SelfComposedDpEvent(
      dp_accounting.GaussianDpEvent(info['noise_multiplier']), 40), delta)
  np.testing.assert_allclose(info['dp_epsilon'], direct, rtol=1e-9)
  assert abs(info['dp_epsilon'] - 1.0) < 1e-2
  _, info = pastel_dp.make('wdp', target_epsilon=1.0, delta=delta, num_rounds=40)
  one = _direct(dp_accounting.GaussianDpEvent(info['noise_multiplier']), delta)
  np.testing.assert_allclose(info['dp_epsilon_per_round'], one, rtol=1e-9)
  assert abs(one - 1.0) < 1e-2 and info['dp_epsilon'] > 5 * one  # composition grows it
