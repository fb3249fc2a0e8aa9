"""Tests of the certified guarantee (Theorem 1, Corollary 1, Eqs. 9-10 of the AMI paper)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl_privacy.attacks import ami
from fl_privacy.attacks.ami import certified


def _neuron(seed=0, d=6, r=10):
  n = ami.init_neuron(jax.random.key(seed), d, r)
  return n._replace(b=jnp.linspace(-1, 1, r), c=jnp.float32(0.3))


def test_value_range_contains_every_value_in_the_box():
  neuron = _neuron()
  lo, hi = certified.value_range(neuron, -2.0, 3.0)
  rng = np.random.default_rng(0)
  x = rng.uniform(-2.0, 3.0, size=(20_000, 6)).astype(np.float32)
  corners = np.array(np.meshgrid(*[[-2.0, 3.0]] * 6)).reshape(6, -1).T.astype(np.float32)
  v = np.asarray(ami.chosen_value(neuron, jnp.asarray(np.concatenate([x, corners]))))
  assert lo - 1e-4 <= v.min() and v.max() <= hi + 1e-4
  assert hi > lo


def test_bounds_follow_eqs_9_and_10():
  vt = np.array([1.0, 2.0, 3.0, 2.0])
  vx = np.array([-1.0, -2.0, -3.0])
  out = certified.bounds(vt, vx, 10.0, 8.0, 1e-3)
  assert out['lower_target'] == pytest.approx(2.0 - 10.0 * math.sqrt(math.log(1e3) / 8))
  assert out['upper_other'] == pytest.approx(-2.0 + 8.0 * math.sqrt(math.log(1e3) / 6))


def test_line_search_finds_the_closed_form_delta():
  rng = np.random.default_rng(1)
  vt = rng.uniform(0.5, 1.5, 4000)
  vx = rng.uniform(-1.8, 0.2, 3000)
  width = 4.0
  exact = certified.smallest_delta_closed_form(vt.mean(), width, 4000, vx.mean(), width, 3000)
  found = certified.smallest_delta(vt, vx, width, width)
  assert exact <= found <= exact * 10 ** 0.05 * (1 + 1e-9)
  assert certified.bounds(vt, vx, width, width, found)['certified']
  assert not certified.bounds(vt, vx, width, width, found / 10 ** 0.05)['certified']


def test_no_delta_when_means_have_the_wrong_sign():
  vt = np.full(100, -0.1)
  vx = np.full(100, -1.0)
  assert certified.smallest_delta(vt, vx, 2.0, 2.0) == 1.0
  assert certified.smallest_delta_closed_form(-0.1, 2.0, 100, -1.0, 2.0, 100) == 1.0


def test_hoeffding_lower_bound_covers_the_mean():
  # P(lower bound > true mean) <= delta for a variable bounded in [0, 1].
  rng = np.random.default_rng(2)
  delta, n, reps = 0.2, 50, 4000
  draws = rng.uniform(0, 1, size=(reps, n)) ** 3  # mean 1/4
  misses = 0
  for row in draws:
    misses += certified.bounds(row, -row, 1.0, 1.0, delta)['lower_target'] > 0.25
  assert misses / reps <= delta


def test_certify_reports_valid_and_empirical_ranges():
  neuron = _neuron()
  rand = lambda k, x: x + jax.random.uniform(k, x.shape, minval=-0.5, maxval=0.5)
  vt = certified.monte_carlo_values(jax.random.key(0), neuron, jnp.ones(6), rand, 500)
  vx = certified.monte_carlo_values(jax.random.key(1), neuron, jnp.zeros((300, 6)), rand)
  assert vt.shape == (500,) and vx.shape == (300,)
  out = certified.certify(vt, vx, certified.value_range(neuron, -3.0, 3.0), 1e-8)
  assert out['range'] >= out['empirical_range'] > 0
  assert out['p'] == 500 and out['q'] == 300
  assert 0 < out['delta_star_exact'] <= 1 and 0 < out['delta_star'] <= 1
