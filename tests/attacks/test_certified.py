"""Tests of the certified guarantee (Theorem 1, Corollary 1, Eqs. 9-10 of the AMI paper)."""

from __future__ import annotations

import itertools
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


def _corners(low, high, d):
  return np.array(list(itertools.product([low, high], repeat=d)), np.float64)


def _values(neuron, x):
  """v(x) = h . ReLU(x W + b) + c in float64 (independent of `ami.chosen_value`'s dtype)."""
  w, b, h = (np.asarray(a, np.float64) for a in (neuron.w, neuron.b, neuron.h))
  return np.maximum(x @ w + b, 0.0) @ h + float(neuron.c)


def _block(w, b, h, c):
  return ami.CraftedNeuron(w=jnp.asarray(w, jnp.float32), b=jnp.asarray(b, jnp.float32),
                           h=jnp.asarray(h, jnp.float32), c=jnp.float32(c))


# One hidden unit: the pre-activation is linear in x, so its extremes over the box are corners,
# and ReLU and the scalar h are monotone: the interval is exact, each sign case by hand.
# (w, b, h, c, low, high, v_min, v_max)
HAND = [
    # w = (2, -1), b = 0.5 on [0, 1]^2: pre in [0.5 - 1, 0.5 + 2] = [-0.5, 2.5]; ReLU [0, 2.5].
    ([[2.0], [-1.0]], [0.5], [3.0], -1.0, 0.0, 1.0, -1.0, 6.5),
    # h < 0 flips the ends: v in [-1 - 2 * 2.5, -1] .
    ([[2.0], [-1.0]], [0.5], [-2.0], -1.0, 0.0, 1.0, -6.0, -1.0),
    # A negative box: w x at low = -3 is -6 for w = 2 and +3 for w = -1.
    # pre in [0.5 - 6 - 2, 0.5 + 4 + 3] = [-7.5, 7.5]  (w=2: [-6, 4]; w=-1: [-2, 3]).
    ([[2.0], [-1.0]], [0.5], [1.0], 0.0, -3.0, 2.0, 0.0, 7.5),
    # Pre-activation never positive: the unit is dead, v = c exactly.
    ([[1.0], [1.0]], [-5.0], [4.0], 0.25, 0.0, 1.0, 0.25, 0.25),
    # Pre-activation always positive: v linear, range = h (pre_lo, pre_hi) + c.
    ([[1.0], [-2.0]], [10.0], [0.5], 1.0, -1.0, 1.0, 1.0 + 0.5 * 7.0, 1.0 + 0.5 * 13.0),
]


@pytest.mark.parametrize('w,b,h,c,low,high,v_min,v_max', HAND)
def test_value_range_of_one_unit_by_hand(w, b, h, c, low, high, v_min, v_max):
  neuron = _block(w, b, h, c)
  lo, hi = certified.value_range(neuron, low, high)
  assert lo == pytest.approx(v_min, abs=1e-6) and hi == pytest.approx(v_max, abs=1e-6)
  # Exact: the corners of the box reach both ends.
  v = _values(neuron, _corners(low, high, len(w)))
  assert v.min() == pytest.approx(lo, abs=1e-5) and v.max() == pytest.approx(hi, abs=1e-5)


@pytest.mark.parametrize('seed', range(4))
def test_value_range_is_exact_when_each_unit_reads_its_own_features(seed):
  # Units on disjoint features are independent over the box, so interval arithmetic (the sum
  # of each unit's own extremes) is attained at a corner: the range equals brute force over
  # every corner. Mixed signs of W, b and h.
  rng = np.random.default_rng(seed)
  d, r = 6, 3
  w = np.zeros((d, r))
  for i in range(r):
    w[2 * i:2 * i + 2, i] = rng.normal(size=2) * 2
  b, h, c = rng.normal(size=r), rng.normal(size=r) * 3, rng.normal()
  low, high = sorted(rng.uniform(-3, 3, size=2))
  neuron = _block(w, b, h, c)
  lo, hi = certified.value_range(neuron, low, high)
  v = _values(neuron, _corners(low, high, d))
  assert lo == pytest.approx(v.min(), abs=1e-5) and hi == pytest.approx(v.max(), abs=1e-5)


@pytest.mark.parametrize('seed', range(3))
def test_value_range_contains_brute_force_and_is_the_sum_of_unit_ranges(seed):
  # Dense W: the interval contains every corner and random point, and it is the sum over
  # units of each unit's exact range (each attained at some corner) plus c.
  rng = np.random.default_rng(10 + seed)
  d, r = 5, 4
  neuron = _block(rng.normal(size=(d, r)), rng.normal(size=r), rng.normal(size=r) * 2,
                  rng.normal())
  low, high = -1.5, 0.5
  lo, hi = certified.value_range(neuron, low, high)
  x = np.concatenate([_corners(low, high, d), rng.uniform(low, high, size=(5000, d))])
  v = _values(neuron, x)
  assert lo - 1e-6 <= v.min() and v.max() <= hi + 1e-6
  corners = _corners(low, high, d)
  w, b, h = (np.asarray(a, np.float64) for a in (neuron.w, neuron.b, neuron.h))
  unit = np.maximum(corners @ w + b, 0.0) * h          # [corners, r]: each unit's term
  want_lo = unit.min(axis=0).sum() + float(neuron.c)
  want_hi = unit.max(axis=0).sum() + float(neuron.c)
  assert lo == pytest.approx(want_lo, abs=1e-5) and hi == pytest.approx(want_hi, abs=1e-5)


def test_value_range_of_a_degenerate_box_is_the_point_value():
  rng = np.random.default_rng(7)
  neuron = _block(rng.normal(size=(4, 3)), rng.normal(size=3), rng.normal(size=3), 0.2)
  lo, hi = certified.value_range(neuron, 0.7, 0.7)
  v = _values(neuron, np.full((1, 4), 0.7))[0]
  assert lo == pytest.approx(v, abs=1e-5) and hi == pytest.approx(v, abs=1e-5)


def test_value_range_is_computed_in_float64():
  # float32 weights times the box's ends, rounded in float32, would be off by about 1e-8
  # relative; the docstring promises float64 interval arithmetic (exact here to 1e-15).
  w32 = np.float32(0.1)
  neuron = _block([[0.1], [0.1]], [0.0], [1.0], 0.0)
  lo, hi = certified.value_range(neuron, 3.0, 7.0)
  want = 2 * 7.0 * float(w32)
  assert hi == pytest.approx(want, rel=1e-15, abs=0)
  assert lo == pytest.approx(2 * 3.0 * float(w32), rel=1e-15, abs=0)
  assert float(np.float32(w32 * np.float32(7.0)) * np.float32(2)) != want  # float32 differs
