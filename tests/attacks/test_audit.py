"""The LDP audit: crafters, distinguishers, the game and its statistics."""

from __future__ import annotations

import itertools
import math

import jax
from jax import flatten_util
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sp_stats

from fl_privacy import models
from fl_privacy.attacks.audit import crafters
from fl_privacy.attacks.audit import distinguishers as dist
from fl_privacy.attacks.audit import game
from fl_privacy.eval import stats
from fl_privacy.fl import grads as fl_grads
from fl_privacy.fl import losses
from fl_privacy.mechanisms import bitrand


def _cp(k, n, confidence=0.999):
  ci = sp_stats.binomtest(int(k), int(n)).proportion_ci(confidence, 'exact')
  return ci.low, ci.high


def _white_args(g1, g2, eps, clip_norm=1.0):
  d = g1.shape[0]
  return (jnp.stack([g1, g2]), jnp.zeros(d), jnp.zeros((2, 1)),
          jnp.zeros(2, jnp.int32), jnp.float32(eps), jnp.float32(clip_norm),
          jnp.float32(0.1), jnp.float32(1.0))


WHITE = game.ldp_sgd_trial_fn('white_box')


@pytest.mark.parametrize('epsilon', [0.5, 2.0])
def test_proposition_1_dummy_gradient_white_box_reaches_the_bound(epsilon):
  c = crafters.dummy_gradient(jnp.zeros(200), jnp.zeros(1), 0, clip_norm=1.0)
  np.testing.assert_allclose(jnp.linalg.norm(c.g1), 1.0, rtol=1e-5)
  n = 20_000
  m = game.run_point(WHITE, jax.random.key(3), n, chunk_size=5000,
                     args=_white_args(c.g1, c.g2, epsilon),
                     claimed_epsilon=epsilon, progress=False)
  low, high = _cp(round(m['acc'] * n), n)
  assert low <= math.exp(epsilon) / (1 + math.exp(epsilon)) <= high
  assert m['acc_ci_low'] <= m['acc_bound'] <= m['acc_ci_high']
  assert m['eps_emp_lower'] <= epsilon <= m['eps_emp_upper']
  assert m['privacy_violation'] == 0.0


@pytest.mark.parametrize('norm', [0.3, 0.7])
def test_gradient_flip_below_the_clip_norm_attains_the_pole_formula(norm):
  # g2 = -g1 with ||g1|| < L: P(correct) = pk pz + (1 - pk)(1 - pz).
  eps, n = 2.0, 20_000
  g1 = norm * jnp.ones(50) / jnp.sqrt(50.0)
  m = game.run_point(WHITE, jax.random.key(4), n, chunk_size=4000,
                     args=_white_args(g1, -g1, eps), claimed_epsilon=eps,
                     progress=False)
  pk, pz = 1 / (1 + math.exp(-eps)), 0.5 + norm / 2
  low, high = _cp(round(m['acc'] * n), n)
  assert low <= pk * pz + (1 - pk) * (1 - pz) <= high
  assert m['acc_ci_high'] < m['acc_bound']


def test_outcomes_do_not_depend_on_chunk_size():
  g1 = jnp.linspace(-1.0, 1.0, 30)
  args = _white_args(g1, -g1, 1.0)
  from fl_privacy.eval import runner
  a = runner.run_trials(WHITE, jax.random.key(5), 300, chunk_size=37,
                        args=args, progress=False)
  b = runner.run_trials(WHITE, jax.random.key(5), 300, chunk_size=300,
                        args=args, progress=False)
  np.testing.assert_array_equal(a['b'], b['b'])
  np.testing.assert_array_equal(a['guess'], b['guess'])
  assert 100 < int(a['b'].sum()) < 200


def test_black_box_sign_sum_uses_the_descent_direction():
  # Small step, no projection: theta_{t+1} - theta_t = -lr * scale * report, so
  # the descent form of Eq. (7) must beat chance clearly at eps = 4.
  d = 64
  c = crafters.dummy_gradient(jnp.zeros(d), jnp.zeros(1), 0, clip_norm=1.0)
  fn = game.ldp_sgd_trial_fn('black_box', 'sign_sum')
  args = (jnp.stack([c.g1, c.g2]), jnp.full(d, 0.1), jnp.zeros((2, 1)),
          jnp.zeros(2, jnp.int32), jnp.float32(4.0), jnp.float32(1.0),
          jnp.float32(1e-3), jnp.float32(1e6))
  m = game.run_point(fn, jax.random.key(6), 4000, chunk_size=2000, args=args,
                     claimed_epsilon=4.0, progress=False)
  assert m['acc_ci_low'] > 0.6
  assert m['acc_ci_high'] < m['acc_bound']


def _tiny_model():
  model = models.MLP(hidden=(8,), num_classes=3)
  x = jax.random.normal(jax.random.key(0), (6, 4))
  y = jnp.asarray([0, 1, 2, 0, 1, 2])
  params = model.init(jax.random.key(1), x[:1])
  return model, losses.make_loss_fn(model.apply), params, x, y


def test_black_box_loss_rules_run_through_the_game():
  model, loss_fn, params, x, y = _tiny_model()
  c = crafters.gradient_flip(loss_fn, params, x[0], y[0])
  _, unravel = flatten_util.ravel_pytree(params)

  def per_example(p, xs, ys):
    return losses.per_example_cross_entropy(model.apply(p, xs), ys)

  fns = {rule: game.ldp_sgd_trial_fn('black_box', rule, per_example, unravel)
         for rule in ('loss_decrease', 'loss_change')}

  def run(rule, lr):
    args = (jnp.stack([c.g1, c.g2]), c.params, c.x, c.y, jnp.float32(4.0),
            jnp.float32(1.0), jnp.float32(lr), jnp.float32(1e6))
    return game.run_point(fns[rule], jax.random.key(7), 1000, chunk_size=1000,
                          args=args, claimed_epsilon=4.0, progress=False)

  m = run('loss_change', 1e-3)
  assert m['n_neg'] + m['n_pos'] == 1000
  assert m['eps_emp_lower'] <= 4.0
  # Eq. (4) on a flip with a tiny step is a first-order sign test of
  # <report, g1>: it must beat chance.
  m = run('loss_decrease', 1e-4)
  assert m['acc_ci_low'] > 0.55


def test_crafters_shapes_and_definitions():
  model, loss_fn, params, x, y = _tiny_model()
  d = models.param_count(params)
  ref = fl_grads.per_example_grads(loss_fn, params, x[:2], y[:2])
  ref0 = flatten_util.ravel_pytree(jax.tree.map(lambda a: a[0], ref))[0]
  ref1 = flatten_util.ravel_pytree(jax.tree.map(lambda a: a[1], ref))[0]
  b = crafters.benign(loss_fn, params, x[0], y[0], x[1], y[1])
  assert b.g1.shape == (d,) and b.params.shape == (d,)
  np.testing.assert_allclose(b.g1, ref0, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(b.g2, ref1, rtol=1e-5, atol=1e-7)
  f = crafters.gradient_flip(loss_fn, params, x[0], y[0])
  np.testing.assert_array_equal(f.g2, -f.g1)
  p = crafters.input_perturbation(loss_fn, params, x[0], y[0], alpha=1.0)
  np.testing.assert_allclose(jnp.abs(p.x[1] - p.x[0]), 1.0, atol=1e-6)
  np.testing.assert_allclose(p.g1, ref0, rtol=1e-5, atol=1e-7)
  r = crafters.parameter_retrogression(loss_fn, params, x[0], y[0], alpha=1.0)
  np.testing.assert_allclose(r.g1, ref0, rtol=1e-5, atol=1e-7)
  np.testing.assert_array_equal(r.params, b.params)
  # Ascending along the gradient raises x1's loss (alpha small enough here).
  small = crafters.parameter_retrogression(loss_fn, params, x[0], y[0],
                                           alpha=0.05)
  _, unravel = flatten_util.ravel_pytree(params)
  retro = unravel(small.params + 0.05 * small.g1)
  assert loss_fn(retro, x[:1], y[:1]) > loss_fn(params, x[:1], y[:1])
  dg = crafters.dummy_gradient(params, x[0], y[0], clip_norm=2.0)
  np.testing.assert_allclose(dg.g1, 2.0 / np.sqrt(d), rtol=1e-6)
  np.testing.assert_allclose(jnp.linalg.norm(dg.g1), 2.0, rtol=1e-5)


def test_collusion_model_inflates_other_classes_gradients():
  model, loss_fn, params, _, _ = _tiny_model()
  rng = np.random.default_rng(0)
  x = rng.normal(size=(60, 4)).astype(np.float32)
  y = (np.arange(60) % 3).astype(np.int32)
  bad = crafters.malicious_model(loss_fn, params, x, y, label=0,
                                 key=jax.random.key(2), steps=200,
                                 learning_rate=0.5, batch_size=16)
  others = jnp.asarray(x[y != 0][:10]), jnp.asarray(y[y != 0][:10])
  before = crafters.grad_norms(loss_fn, params, *others)
  after = crafters.grad_norms(loss_fn, bad, *others)
  assert np.median(after) > 2 * np.median(before)
  c = crafters.collusion(loss_fn, bad, others[0][0], others[1][0])
  np.testing.assert_array_equal(c.params, flatten_util.ravel_pytree(bad)[0])
  with pytest.raises(ValueError):
    crafters.malicious_model(loss_fn, params, x, y, label=7,
                             key=jax.random.key(2), steps=1,
                             learning_rate=0.1, batch_size=4)


def test_select_examples():
  norms = np.array([0.5, 3.0, 2.0, 1.0])
  labels = np.array([1, 0, 0, 2])
  assert crafters.select_examples(norms, labels, 'max_grad_norm') == (1, 3)
  assert crafters.select_examples(norms, labels, 'random') == (0, 1)
  assert crafters.select_examples(norms, labels, 'max_grad_norm',
                                  exclude_label=0) == (3, 1)
  with pytest.raises(ValueError):
    crafters.select_examples(norms, labels, 'best')


def test_distinguisher_rules():
  g = jnp.asarray([1.0, 0.0])
  assert int(dist.white_box(jnp.asarray([0.6, 0.8]), g, -g)) == 0
  assert int(dist.white_box(jnp.asarray([-0.6, 0.8]), g, -g)) == 1
  assert int(dist.white_box(jnp.asarray([0.0, 1.0]), g, -g)) == 0  # tie: g1
  before = jnp.asarray([1.0, 1.0])
  assert int(dist.loss_decrease(before, jnp.asarray([0.9, 5.0]))) == 0
  assert int(dist.loss_decrease(before, jnp.asarray([1.1, 0.0]))) == 1
  assert int(dist.loss_change(before, jnp.asarray([0.5, 1.2]))) == 0
  assert int(dist.loss_change(before, jnp.asarray([1.1, 0.0]))) == 1
  theta = jnp.zeros(3)
  assert int(dist.sign_sum(theta, jnp.asarray([-1.0, -1.0, 1.0]))) == 0
  assert int(dist.sign_sum(theta, jnp.asarray([1.0, 1.0, -1.0]))) == 1
  x0, x1 = jnp.zeros(2), jnp.asarray([1.0, 0.0])
  assert int(dist.likelihood_ratio_gaussian(jnp.asarray([0.4, 9.0]), x0,
                                            x1)) == 0
  assert int(dist.likelihood_ratio_gaussian(jnp.asarray([0.6, -9.0]), x0,
                                            x1)) == 1


def test_bit_log_ratios_match_scipy_and_cap_impossible_outputs():
  p0 = np.array([0.1, 0.5, 0.0])
  p1 = np.array([0.7, 0.5, 0.3])
  one, zero = dist.bit_log_ratios(p0, p1)
  np.testing.assert_allclose(
      one[:2], sp_stats.bernoulli.logpmf(1, p1[:2])
      - sp_stats.bernoulli.logpmf(1, p0[:2]), rtol=1e-6)
  np.testing.assert_allclose(
      zero, sp_stats.bernoulli.logpmf(0, p1) - sp_stats.bernoulli.logpmf(0, p0),
      rtol=1e-6)
  assert np.isfinite(one[2]) and one[2] > 100


def test_likelihood_ratio_on_bitrand_attains_the_exact_optimum():
  # r = 1 feature of l = 3 bits: enumerate the 8 outputs to get the exact
  # accuracy of the optimal test between the all-0 and all-1 inputs.
  eps, l = 2.0, 3
  q = bitrand.effective_probabilities(
      np.asarray(bitrand.flip_probabilities(eps, 1, l), np.float64))
  p_if_one = np.where(np.ones(l, bool), 1 - q, q)
  exact = 0.0
  for out in itertools.product((0, 1), repeat=l):
    o = np.array(out)
    like0 = np.prod(np.where(o == 1, q, 1 - q))
    like1 = np.prod(np.where(o == 1, p_if_one, 1 - p_if_one))
    exact += 0.5 * max(like0, like1)
  bits = np.stack([np.zeros((1, l)), np.ones((1, l))]).astype(np.uint8)
  if_one, if_zero = dist.bit_log_ratios(q[None], p_if_one[None])
  fn = game.bits_trial_fn(lambda k, b: bitrand.randomize_bits(k, b, eps))
  n = 20_000
  m = game.run_point(fn, jax.random.key(9), n, chunk_size=5000,
                     args=(jnp.asarray(bits), jnp.asarray(if_one),
                           jnp.asarray(if_zero)), claimed_epsilon=eps,
                     progress=False)
  low, high = _cp(round(m['acc'] * n), n)
  assert low <= exact <= high


def test_summarize_counts_and_epsilon():
  b = np.array([0] * 100 + [1] * 100)
  guess = np.array([1] * 10 + [0] * 90 + [0] * 20 + [1] * 80)
  m = game.summarize(b, guess, claimed_epsilon=1.0)
  assert (m['n_neg'], m['n_pos'], m['fp_count'], m['fn_count']) == (
      100, 100, 10, 20)
  assert m['fp'] == 0.1 and m['fn'] == 0.2 and m['acc'] == 0.85
  assert m['eps_emp'] == pytest.approx(max(math.log(0.9 / 0.2),
                                           math.log(0.8 / 0.1)))
  assert m['eps_emp_lower'] == pytest.approx(
      stats.empirical_epsilon_lower_bound(10, 100, 20, 100))
  assert m['eps_emp_lower'] < m['eps_emp'] < m['eps_emp_upper']
  assert m['privacy_violation'] == 1.0  # lower bound ~1.2 > claimed 1.0
  assert game.summarize(b, guess, 3.0)['privacy_violation'] == 0.0
  # With delta the bound uses FP + e^eps FN >= 1 - delta.
  md = game.summarize(b, guess, 1.0, delta=0.05)
  assert md['eps_emp'] == pytest.approx(math.log(0.75 / 0.1))


def test_violation_flag_respects_its_confidence():
  # A perfect distinguisher on 200 trials: the 95% bound is 3.28, the 99.99%
  # one 2.27.
  b = np.array([0, 1] * 100)
  loose = game.summarize(b, b, 3.0)
  strict = game.summarize(b, b, 3.0, violation_confidence=0.9999)
  assert loose['privacy_violation'] == 1.0
  assert strict['privacy_violation'] == 0.0
  assert loose['eps_emp'] == math.inf


def test_bad_trial_fn_arguments():
  with pytest.raises(ValueError):
    game.ldp_sgd_trial_fn('grey_box')
  with pytest.raises(ValueError):
    game.ldp_sgd_trial_fn('black_box', 'guess')
  with pytest.raises(ValueError):
    game.ldp_sgd_trial_fn('black_box', 'loss_change')


def test_subspace_coefficients_preserve_geometry():
  rng = np.random.default_rng(0)
  g1, g2 = rng.normal(size=50), rng.normal(size=50)
  coef = game.subspace_coefficients(np.stack([g1, g2]))
  assert coef.shape == (2, 2)
  np.testing.assert_allclose(coef @ coef.T, np.stack([g1, g2]) @
                             np.stack([g1, g2]).T, rtol=1e-5)
  assert game.subspace_coefficients(np.stack([g1, -g1])).shape == (2, 1)


@pytest.mark.parametrize('antipodal', [False, True])
def test_projected_white_box_agrees_with_the_literal_game(antipodal):
  # Same pair, two paths: accuracies within a two-sample bound.
  rng = np.random.default_rng(1)
  d, eps, n = 300, 2.0, 20_000
  g1 = rng.normal(size=d).astype(np.float32)
  g1 *= 0.8 / np.linalg.norm(g1)
  g2 = -g1 if antipodal else rng.normal(size=d).astype(np.float32) * 0.1
  lit = game.run_point(WHITE, jax.random.key(10), n, chunk_size=5000,
                       args=_white_args(jnp.asarray(g1), jnp.asarray(g2), eps),
                       claimed_epsilon=eps, progress=False)
  coef = game.subspace_coefficients(np.stack([g1, g2]))
  fast = game.run_point(game.ldp_sgd_projected_white_box_trial_fn(),
                        jax.random.key(11), n, chunk_size=5000,
                        args=(jnp.asarray(coef), jnp.float32(eps),
                              jnp.float32(1.0), jnp.float32(d)),
                        claimed_epsilon=eps, progress=False)
  p = (lit['acc'] + fast['acc']) / 2
  assert abs(lit['acc'] - fast['acc']) <= 4.5 * math.sqrt(2 * p * (1 - p) / n)


def test_projected_proposition_1_at_the_paper_dimension():
  d, eps, n = 13_722, 1.0, 50_000
  coef = game.subspace_coefficients(np.stack([np.ones(d), -np.ones(d)]) /
                                    np.sqrt(d))
  m = game.run_point(game.ldp_sgd_projected_white_box_trial_fn(),
                     jax.random.key(12), n, chunk_size=25_000,
                     args=(jnp.asarray(coef), jnp.float32(eps),
                           jnp.float32(1.0), jnp.float32(d)),
                     claimed_epsilon=eps, progress=False)
  assert m['acc_ci_low'] <= m['acc_bound'] <= m['acc_ci_high']


def test_summarize_auditor_bounds_test_the_guess_itself():
  # The guesses are 0/1, so the one informative threshold (guess = IN) is fixed before
  # the data: `'explicit'` at 1, every trial, no correction and no split.
  from fl_privacy.eval import auditing  # pylint: disable=g-import-not-at-top
  b = np.array([0] * 300 + [1] * 300)
  guess = np.array([1] * 30 + [0] * 270 + [0] * 60 + [1] * 240)
  m = game.summarize(b, guess, claimed_epsilon=1.0, audit_delta=1e-5)
  want = auditing.audit_scores(np.ones(240).tolist() + [0.0] * 60, [1.0] * 30 + [0.0] * 270,
                               delta=1e-5, fdp=False, threshold_strategy='explicit',
                               threshold=1.0)
  for k in ('epsilon_cp', 'gdp_mu', 'epsilon_gdp', 'epsilon_one_run'):
    assert m[k] == pytest.approx(want[k], rel=1e-12), k
  split = auditing.audit_scores(np.ones(240).tolist() + [0.0] * 60,
                                [1.0] * 30 + [0.0] * 270, delta=1e-5, fdp=False)
  assert m['epsilon_cp'] > split['epsilon_cp'] > 0
  # The (eps, delta) Clopper-Pearson form of eps_emp_lower: close to it at tiny delta.
  assert m['epsilon_cp'] == pytest.approx(m['eps_emp_lower'], abs=0.05)
