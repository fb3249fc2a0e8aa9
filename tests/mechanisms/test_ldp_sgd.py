"""Properties of the LDP-SGD randomizer and server (Algorithms 1-2, LDP-audit paper)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special as sp_special
from scipy import stats as sp_stats

from fl_privacy.mechanisms import ldp_sgd


def _cp(k, n, confidence=0.999):
  ci = sp_stats.binomtest(int(k), int(n)).proportion_ci(confidence, 'exact')
  return ci.low, ci.high


def _direction(dim, seed=0):
  g = np.random.default_rng(seed).normal(size=dim).astype(np.float32)
  return g / np.linalg.norm(g)


@pytest.mark.parametrize('jit', [False, True])
def test_reports_are_unit_vectors_and_pure(jit):
  fn = jax.jit(ldp_sgd.randomize) if jit else ldp_sgd.randomize
  g = jnp.asarray(np.random.default_rng(1).normal(size=(3, 5, 40)), jnp.float32)
  key = jax.random.key(0)
  r = fn(key, g, 1.0, 1.0)
  assert r.shape == g.shape
  np.testing.assert_allclose(np.linalg.norm(r, axis=-1), 1.0, atol=1e-5)
  np.testing.assert_array_equal(r, fn(key, g, 1.0, 1.0))
  assert not np.allclose(r, fn(jax.random.key(1), g, 1.0, 1.0))
  np.testing.assert_allclose(r, ldp_sgd.randomize(key, g, 1.0, 1.0), atol=1e-6)


def test_clip_only_shrinks():
  g = jnp.asarray([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
  np.testing.assert_allclose(ldp_sgd.clip(g, 1.0),
                             [[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]], atol=1e-6)


@pytest.mark.parametrize('epsilon', [0.5, 2.0, 4.0])
def test_kept_hemisphere_probability(epsilon):
  # ||g|| >= L: the pole is g's own direction, so only line 3 randomizes.
  n, dim = 20_000, 16
  u = _direction(dim)
  g = jnp.broadcast_to(jnp.asarray(3.0 * u), (n, dim))
  r = ldp_sgd.randomize(jax.random.key(7), g, epsilon, 1.0)
  kept = int(jnp.sum(r @ u > 0))
  low, high = _cp(kept, n)
  assert low <= np.exp(epsilon) / (1 + np.exp(epsilon)) <= high


@pytest.mark.parametrize('norm,clip_norm', [(0.3, 1.0), (0.6, 2.0)])
def test_pole_probability_for_small_gradients(norm, clip_norm):
  # ||g|| = 0.3 L: P(report on g's side) = pk * pz + (1 - pk)(1 - pz).
  n, dim, eps = 20_000, 16, 3.0
  u = _direction(dim, 2)
  g = jnp.broadcast_to(jnp.asarray(norm * u), (n, dim))
  r = ldp_sgd.randomize(jax.random.key(8), g, eps, clip_norm)
  pk, pz = 1 / (1 + np.exp(-eps)), 0.5 + norm / (2 * clip_norm)
  low, high = _cp(int(jnp.sum(r @ u > 0)), n)
  assert low <= pk * pz + (1 - pk) * (1 - pz) <= high


def test_zero_gradient_gives_uniform_direction():
  n, dim = 20_000, 6
  r = ldp_sgd.randomize(jax.random.key(9), jnp.zeros((n, dim)), 4.0, 1.0)
  for axis in range(dim):
    low, high = _cp(int(jnp.sum(r[:, axis] > 0)), n)
    assert low <= 0.5 <= high


def test_debias_scale_matches_scipy_gamma():
  for dim in (1, 2, 7, 50, 150):
    for eps in (0.5, 4.0):
      want = (2.0 * np.sqrt(np.pi) * sp_special.gamma((dim + 1) / 2)
              / sp_special.gamma(dim / 2) * (np.exp(eps) + 1) / (np.exp(eps) - 1))
      np.testing.assert_allclose(ldp_sgd.debias_scale(dim, eps, 2.0), want,
                                 rtol=1e-4)
  # Large d: finite and ~ L sqrt(pi d / 2) / tanh(eps / 2).
  big = float(ldp_sgd.debias_scale(10**7, 1.0, 1.0))
  np.testing.assert_allclose(big, np.sqrt(np.pi * 1e7 / 2) / np.tanh(0.5),
                             rtol=1e-4)


@pytest.mark.parametrize('norm', [0.4, 2.5])
def test_debiased_report_is_unbiased_per_coordinate(norm):
  # Each coordinate's Monte Carlo mean lies within 4.5 standard errors of the
  # clipped gradient (two-sided p ~ 7e-6 each, 8 coordinates).
  n, dim, eps, clip_norm = 400_000, 8, 1.0, 1.0
  g = jnp.asarray(norm * _direction(dim, 3))
  r = ldp_sgd.randomize(jax.random.key(11), jnp.broadcast_to(g, (n, dim)),
                        eps, clip_norm)
  scaled = np.asarray(r) * float(ldp_sgd.debias_scale(dim, eps, clip_norm))
  mean, se = scaled.mean(0), scaled.std(0) / np.sqrt(n)
  want = np.asarray(ldp_sgd.clip(g, clip_norm))
  assert np.all(np.abs(mean - want) <= 4.5 * se), (mean, want, se)


def test_debiased_report_is_unbiased_in_norm_high_dim():
  # E||mean - x||^2 = (scale^2 - ||x||^2) / n exactly; with d = 2000 the squared
  # error is a sum of ~d weakly dependent terms, so 0.8-1.2 is > 4 sd wide.
  # The printed constant (a factor d smaller) would fail by orders of magnitude.
  n, dim, eps = 2_000, 2_000, 2.0
  g = jnp.asarray(_direction(dim, 4))
  r = ldp_sgd.randomize(jax.random.key(12), jnp.broadcast_to(g, (n, dim)), eps,
                        1.0)
  scale = float(ldp_sgd.debias_scale(dim, eps, 1.0))
  err = np.asarray(ldp_sgd.server_estimate(r, eps, 1.0)) - np.asarray(g)
  expected = (scale**2 - 1.0) / n
  assert 0.8 * expected <= float(err @ err) <= 1.2 * expected


def test_project_l2_is_a_projection():
  inside = {'a': jnp.asarray([0.3, 0.4]), 'b': jnp.asarray([[0.0]])}
  out = ldp_sgd.project_l2(inside, 1.0)
  np.testing.assert_allclose(out['a'], inside['a'])
  outside = {'a': jnp.asarray([3.0, 4.0]), 'b': jnp.asarray([[12.0]])}
  out = ldp_sgd.project_l2(outside, 2.0)
  flat = np.concatenate([np.ravel(out['a']), np.ravel(out['b'])])
  np.testing.assert_allclose(np.linalg.norm(flat), 2.0, rtol=1e-6)
  np.testing.assert_allclose(flat, np.array([3.0, 4.0, 12.0]) * 2.0 / 13.0,
                             rtol=1e-6)


def test_server_update_is_projected_sgd_step_on_pytrees():
  params = {'w': jnp.asarray([[1.0, 0.0]]), 'b': jnp.asarray([0.0])}
  reports = jnp.asarray([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
  eps, lr = 1.0, 0.01
  scale = float(ldp_sgd.debias_scale(3, eps, 1.0))
  # ravel_pytree orders leaves by key: 'b' then 'w'.
  flat = np.array([0.0, 1.0, 0.0]) - lr * scale * np.array([0.5, 0.5, 0.0])
  new = ldp_sgd.server_update(params, reports, lr, 10.0, epsilon=eps,
                              clip_norm=1.0)
  np.testing.assert_allclose(new['b'], flat[:1], rtol=1e-5)
  np.testing.assert_allclose(new['w'], flat[None, 1:], rtol=1e-5)
  small = ldp_sgd.server_update(params, reports, lr, 0.5, epsilon=eps,
                                clip_norm=1.0)
  np.testing.assert_allclose(
      np.concatenate([small['b'], small['w'].ravel()]),
      flat * 0.5 / np.linalg.norm(flat), rtol=1e-5)


def test_paper_learning_rate_makes_the_step_independent_of_eps():
  # eta_t * debias ~ ||C|| sqrt(pi / 2) for n = 1 and large d.
  for eps in (0.5, 4.0):
    step = (ldp_sgd.paper_learning_rate(3.0, 1, 10_000, eps, 1.0)
            * ldp_sgd.debias_scale(10_000, eps, 1.0))
    np.testing.assert_allclose(step, 3.0 * np.sqrt(np.pi / 2), rtol=1e-3)


@pytest.mark.parametrize('norm,eps', [(0.6, 1.0), (2.0, 3.0)])
def test_subspace_shortcut_matches_the_literal_randomizer(norm, eps):
  # <randomize(g), e_j> and randomize_in_subspace(coef) have the same joint
  # law: two-sample KS per coordinate and on a rotated combination.
  n, dim = 20_000, 40
  basis, _ = np.linalg.qr(np.random.default_rng(5).normal(size=(dim, 2)))
  basis = basis.T.astype(np.float32)  # [2, d], orthonormal rows
  coef = np.array([0.8, -0.6], np.float32) * norm
  g = jnp.asarray(coef @ basis)
  literal = np.asarray(ldp_sgd.randomize(
      jax.random.key(21), jnp.broadcast_to(g, (n, dim)), eps, 1.0)) @ basis.T
  short = np.asarray(ldp_sgd.randomize_in_subspace(
      jax.random.key(22), jnp.broadcast_to(jnp.asarray(coef), (n, 2)), eps,
      1.0, dim))
  assert short.shape == (n, 2)
  assert np.all(np.linalg.norm(short, axis=1) <= 1.0 + 1e-6)
  for a, b in ((literal[:, 0], short[:, 0]), (literal[:, 1], short[:, 1]),
               (literal @ [0.6, 0.8], short @ [0.6, 0.8])):
    assert sp_stats.ks_2samp(a, b).pvalue > 1e-3
  # Same kept-side rate as the literal path.
  u = coef / np.linalg.norm(coef)
  p_lit, p_short = np.mean(literal @ u > 0), np.mean(short @ u > 0)
  pooled = (p_lit + p_short) / 2
  assert abs(p_lit - p_short) <= 4.5 * np.sqrt(2 * pooled * (1 - pooled) / n)


def test_subspace_shortcut_full_dimension_is_a_unit_vector():
  r = ldp_sgd.randomize_in_subspace(jax.random.key(3), jnp.ones((5, 3)), 1.0,
                                    1.0, 3)
  np.testing.assert_allclose(np.linalg.norm(r, axis=-1), 1.0, atol=1e-5)


def test_clip_and_projection_below_unit_norm():
  # Norms below 1 with a bound below them: the guard against dividing by zero
  # (max(norm, tiny)) must not act as a floor at 1.
  g = jnp.asarray([[0.3, 0.4], [0.03, 0.04]])
  np.testing.assert_allclose(ldp_sgd.clip(g, 0.25),
                             [[0.15, 0.2], [0.03, 0.04]], rtol=1e-6)
  out = ldp_sgd.project_l2({'a': jnp.asarray([0.3, 0.4])}, 0.25)
  np.testing.assert_allclose(out['a'], [0.15, 0.2], rtol=1e-6)


@pytest.mark.parametrize('dim', [3, 40])
def test_subspace_shortcut_norm_is_beta(dim):
  # The projection of a uniform unit vector in d dims onto a k-dim subspace has
  # squared norm Beta(k / 2, (d - k) / 2), independently across the batch; dim
  # = k + 1 is the edge where the rest of the space has one degree of freedom.
  # A 3-d batch checks that the leading axes are all batch axes.
  shape, k = (4, 5_000), 2
  coef = jnp.broadcast_to(jnp.asarray([0.3, -0.2], jnp.float32), shape + (k,))
  r = np.asarray(ldp_sgd.randomize_in_subspace(jax.random.key(31), coef, 1.5,
                                               1.0, dim))
  assert r.shape == shape + (k,)
  sq = np.sum(r.astype(np.float64)**2, axis=-1).ravel()
  beta = sp_stats.beta(k / 2, (dim - k) / 2)
  assert sp_stats.kstest(sq, beta.cdf).pvalue > 1e-3


def test_low_precision_inputs_are_computed_in_float32():
  # A float16 gradient, epsilon or report is converted to float32 first: the same
  # reports and estimates as from its float32 copy, float32 results. (Kept in float16,
  # the pole's probability 1/2 + ||g|| / 2L, below 1 for these small gradients, would
  # be drawn as a float16 Bernoulli, from other bits; the mean of 4,000 float16
  # reports loses ~3 digits.)
  n, dim = 4_000, 16
  g16 = jnp.asarray(0.02 * np.random.default_rng(6).normal(size=(n, dim)), jnp.float16)
  g32 = g16.astype(jnp.float32)
  key = jax.random.key(13)
  np.testing.assert_array_equal(ldp_sgd.randomize(key, g16, 1.0, 0.5),
                                ldp_sgd.randomize(key, g32, 1.0, 0.5))
  c16 = g16[:, :3]
  np.testing.assert_array_equal(ldp_sgd.randomize_in_subspace(key, c16, 1.0, 0.5, 40),
                                ldp_sgd.randomize_in_subspace(key, c16.astype(jnp.float32),
                                                              1.0, 0.5, 40))
  eps16 = jnp.float16(1.3)
  assert ldp_sgd.keep_probability(eps16).dtype == jnp.float32
  assert ldp_sgd.debias_scale(dim, eps16, 1.0).dtype == jnp.float32
  assert ldp_sgd.paper_learning_rate(2.0, 4, dim, eps16, 1.0).dtype == jnp.float32
  reports = ldp_sgd.randomize(key, g32, 1.0, 0.5).astype(jnp.float16)
  np.testing.assert_allclose(ldp_sgd.server_estimate(reports, 1.0, 0.5),
                             ldp_sgd.server_estimate(reports.astype(jnp.float32), 1.0, 0.5),
                             rtol=1e-6)


def test_randomize_is_the_documented_draw_from_three_keys():
  # Algorithm 1 on the keys split(key, 3) = (pole, direction, keep): a zero gradient
  # takes e_0 as its direction (a fair pole, so any fixed direction has the same law,
  # but the draw is pinned).
  n, dim, eps, clip_norm = 16, 5, 1.0, 2.0
  g = np.random.default_rng(7).normal(size=(n, dim)).astype(np.float32)
  g[:8] = 0.0
  g[8:10] *= 0.1
  key = jax.random.key(14)
  k_pole, k_dir, k_keep = jax.random.split(key, 3)
  norm = np.linalg.norm(g, axis=-1)
  direction = np.where(norm[:, None] > 0, g / np.maximum(norm, 1e-30)[:, None],
                       np.eye(dim, dtype=np.float32)[0])
  p_pole = 0.5 + np.minimum(norm, clip_norm) / (2 * clip_norm)
  pole = np.where(jax.random.bernoulli(k_pole, jnp.asarray(p_pole, jnp.float32), (n,)),
                  1.0, -1.0)
  v = np.asarray(jax.random.normal(k_dir, (n, dim), jnp.float32))
  v = v / np.linalg.norm(v, axis=-1, keepdims=True)
  dot = np.sum(direction * v, axis=-1)
  side = np.where(dot >= 0, 1.0, -1.0) * pole
  keep = np.asarray(jax.random.bernoulli(k_keep, 1 / (1 + np.exp(-eps)), (n,)))
  want = np.where(keep, side, -side)[:, None] * v
  # Each draw is a comparison (a sign, a uniform below a probability) recomputed here outside
  # the jitted program: none may sit within rounding of its boundary, or another CPU's
  # rounding could flip it (the inputs are fixed: this checks they stay clear of it).
  u_pole = np.asarray(jax.random.uniform(k_pole, (n,)))
  u_keep = np.asarray(jax.random.uniform(k_keep, (n,)))
  assert np.min(np.abs(dot)) > 1e-4 and np.min(np.abs(u_pole - p_pole)) > 1e-5
  assert np.min(np.abs(u_keep - 1 / (1 + np.exp(-eps)))) > 1e-5
  np.testing.assert_allclose(ldp_sgd.randomize(key, jnp.asarray(g), eps, clip_norm), want,
                             rtol=1e-5, atol=1e-6)
