"""OME (Eq. (22) of the AMI paper): output probabilities per parity and bit value, purity."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sp_stats

from fl_privacy import validate
from fl_privacy.mechanisms import bitrand
from fl_privacy.mechanisms import fixed_point
from fl_privacy.mechanisms import ome

CONFIDENCE = 0.999


def _cp(k, n, confidence=CONFIDENCE):
  ci = sp_stats.binomtest(int(k), int(n)).proportion_ci(confidence, 'exact')
  return ci.low, ci.high


def _randomize_bits(jit, epsilon, alpha, **kw):
  fn = lambda key, bits: ome.randomize_bits(key, bits, epsilon, alpha, **kw)
  return jax.jit(fn) if jit else fn


def test_output_probabilities_follow_eq_22():
  eps, rl, a = 3.0, 5120, 100.0
  p = ome.output_probabilities(eps, rl, a)
  np.testing.assert_allclose(p[0, 1], a / (1 + a), rtol=1e-12)
  np.testing.assert_allclose(p[1, 1], 1 / (1 + a**3), rtol=1e-12)
  np.testing.assert_allclose(p[:, 0], 1 / (1 + a * math.exp(eps / rl)), rtol=1e-12)
  # eps / (r l) is tiny: the 0 -> 1 probability hardly moves between eps = 1 and 10
  change = ome.output_probabilities(1.0, rl)[0, 0] - ome.output_probabilities(10.0, rl)[0, 0]
  assert 0 < change < 2e-5


def test_flip_probabilities_complement_output_probabilities():
  p = ome.output_probabilities(2.0, 640, 100.0)
  f = ome.flip_probabilities(2.0, 640, 100.0)
  np.testing.assert_allclose(f[:, 0], p[:, 0])
  np.testing.assert_allclose(f[:, 1], 1 - p[:, 1])
  assert f[1, 1] > 0.999 and f[0, 1] == pytest.approx(1 / 101)


def test_parity_counts_over_the_whole_vector():
  odd = ome.odd_positions(4, 3)
  np.testing.assert_array_equal(odd.reshape(-1), np.arange(12) % 2 == 1)
  assert odd[1, 0] and not odd[0, 0]  # feature 1, bit 0 is index 3
  # with even l, global and within-group parity agree
  np.testing.assert_array_equal(ome.odd_positions(5, 10), np.tile(np.arange(10) % 2, (5, 1)))


@pytest.mark.parametrize('jit', [False, True])
@pytest.mark.parametrize('alpha,l', [(100.0, 10), (2.0, 3)])
def test_output_rates_per_parity_and_bit_value(jit, alpha, l):
  n_rows, d, eps = 400, 64, 2.0
  fn = _randomize_bits(jit, eps, alpha, num_features=512)
  want = bitrand.effective_probabilities(ome.output_probabilities(eps, 512 * l, alpha))
  odd = ome.odd_positions(d, l)
  for value in (0, 1):
    bits = jnp.full((n_rows, d, l), value, jnp.uint8)
    out = np.asarray(fn(jax.random.key(value), bits)).astype(bool)
    for parity, mask in ((0, ~odd), (1, odd)):
      ones = int(out[:, mask].sum())
      low, high = _cp(ones, n_rows * int(mask.sum()))
      assert low <= want[parity, value] <= high, (parity, value, ones)


def test_probability_ratios_imply_the_computed_epsilon():
  eps, alpha, d, l, n_rows = 2.0, 3.0, 16, 10, 2000
  key = jax.random.key(11)
  ones = np.asarray(ome.randomize_bits(jax.random.fold_in(key, 1),
                                       jnp.ones((n_rows, d, l), jnp.uint8), eps, alpha))
  zeros = np.asarray(ome.randomize_bits(jax.random.fold_in(key, 0),
                                        jnp.zeros((n_rows, d, l), jnp.uint8), eps, alpha))
  summary = ome.claimed_vs_implied(eps, d, l, alpha)
  odd = ome.odd_positions(d, l)
  for parity, mask in ((0, ~odd), (1, odd)):
    n = n_rows * int(mask.sum())
    lo11, hi11 = _cp(ones[:, mask].sum(), n)
    lo10, hi10 = _cp(zeros[:, mask].sum(), n)
    # output 1: ln(P(1|1)/P(1|0)); output 0: ln(P(0|1)/P(0|0))
    ratios = [(math.log(lo11 / hi10), math.log(hi11 / lo10)),
              (math.log((1 - hi11) / (1 - lo10)), math.log((1 - lo11) / (1 - hi10)))]
    abs_hi = max(max(abs(a), abs(b)) for a, b in ratios)
    abs_lo = max(0.0 if a <= 0 <= b else min(abs(a), abs(b)) for a, b in ratios)
    assert abs_lo <= summary['per_parity'][parity] <= abs_hi
  assert summary['per_vector'] == pytest.approx(
      d * l / 2 * sum(summary['per_parity']))
  paper = ome.claimed_vs_implied(1.0, 512, 10)
  assert paper['per_vector'] > 1e4 * paper['claimed']
  assert math.isinf(ome.claimed_vs_implied(1.0, 512, 10, rng_bits=16)['per_vector'])


@pytest.mark.parametrize('jit', [False, True])
def test_purity_uniqueness_and_jit(jit):
  bits, _ = fixed_point.encode(
      jnp.asarray(np.random.default_rng(0).uniform(-8, 8, (5, 32)), jnp.float32))
  fn = _randomize_bits(jit, 2.0, 100.0)
  a = fn(jax.random.key(0), bits)
  np.testing.assert_array_equal(a, fn(jax.random.key(0), bits))
  assert (np.asarray(a) != np.asarray(fn(jax.random.key(1), bits))).sum() > 0
  np.testing.assert_array_equal(a, _randomize_bits(not jit, 2.0, 100.0)(jax.random.key(0),
                                                                          bits))
  assert a.dtype == jnp.uint8 and a.shape == bits.shape


@pytest.mark.parametrize('jit', [False, True])
def test_randomize_decodes_with_the_chosen_sign_rule(jit):
  x = jnp.asarray(np.random.default_rng(1).uniform(-8, 8, (50, 32)), jnp.float32)
  fn = lambda key, x, h: ome.randomize(key, x, 5.0, honour_sign=h)
  if jit:
    fn = jax.jit(fn, static_argnums=2)
  honoured = np.asarray(fn(jax.random.key(2), x, True))
  dropped = np.asarray(fn(jax.random.key(2), x, False))
  assert honoured.shape == x.shape and (honoured < 0).any()
  np.testing.assert_array_equal(dropped, np.abs(honoured))
  top = fixed_point.max_value()
  assert np.abs(honoured).max() <= top


@pytest.mark.parametrize('field,kw', [('epsilon', dict(epsilon=0.0)),
                                      ('alpha', dict(epsilon=1.0, alpha=-1.0))])
def test_bad_arguments_raise_config_error(field, kw):
  with pytest.raises(validate.ConfigError) as e:
    ome.randomize(jax.random.key(0), jnp.ones((2, 3)), **kw)
  assert e.value.field == field


@pytest.mark.parametrize('rng_bits', [32, 16])
def test_randomize_bits_is_raw_words_below_the_documented_thresholds(rng_bits):
  # Odd l and r != d: the parity runs over the whole d*l vector and eps is divided by the
  # given r * l. Each output bit is exactly `word < threshold` for that bit's case.
  eps, alpha, r = 3.0, 2.0, 7
  bits = jnp.asarray(np.random.default_rng(3).integers(0, 2, (3, 4, 5)), jnp.uint8)
  key = jax.random.key(5)
  t = bitrand.thresholds(ome.output_probabilities(eps, r * 5, alpha), rng_bits)
  odd = ome.odd_positions(4, 5).astype(int)
  want_threshold = np.where(np.asarray(bits) == 1, t[odd, 1], t[0, 0])
  want = bitrand.bernoulli_below(key, jnp.asarray(want_threshold), bits.shape, rng_bits)
  got = ome.randomize_bits(key, bits, eps, alpha, num_features=r, rng_bits=rng_bits)
  assert got.dtype == jnp.uint8
  np.testing.assert_array_equal(got, np.asarray(want).astype(np.uint8))
  # The three cases really differ here (else the check above could not tell them apart).
  assert len({int(t[0, 0]), int(t[0, 1]), int(t[1, 1])}) == 3
  # randomize = encode, randomize_bits, decode with the documented defaults.
  x = jnp.asarray(np.random.default_rng(4).uniform(-40, 40, (6, 4)), jnp.float32)
  enc, _ = fixed_point.encode(x, 5, 4, True)
  kw = dict(num_features=r, rng_bits=rng_bits)
  np.testing.assert_array_equal(
      ome.randomize(key, x, eps, alpha, **kw),
      fixed_point.decode(ome.randomize_bits(key, enc, eps, alpha, **kw), 5, 4, True, True))
  unsigned, _ = fixed_point.encode(x, 3, 2, False)
  np.testing.assert_array_equal(
      ome.randomize(key, x, eps, alpha, int_bits=3, frac_bits=2, sign_bit=False, **kw),
      fixed_point.decode(ome.randomize_bits(key, unsigned, eps, alpha, **kw), 3, 2, False))
  if rng_bits == 32:
    np.testing.assert_array_equal(
        ome.randomize(key, x, eps),
        fixed_point.decode(ome.randomize_bits(key, enc, eps, 100.0), 5, 4, True, True))


def test_traced_epsilon_and_alpha_give_the_concrete_probabilities():
  want = ome.output_probabilities(2.0, 640, 3.0)
  assert isinstance(want, np.ndarray) and want.dtype == np.float64
  flips = ome.flip_probabilities(2.0, 640, 3.0)
  assert isinstance(flips, np.ndarray) and flips.dtype == np.float64
  np.testing.assert_allclose(flips, np.stack([want[:, 0], 1 - want[:, 1]], axis=1), rtol=1e-12)
  for fn in (lambda e, a: ome.output_probabilities(e, 640, a),
             lambda e, a: ome.output_probabilities(e, 640, 3.0),
             lambda e, a: ome.output_probabilities(2.0, 640, a)):
    np.testing.assert_allclose(jax.jit(fn)(2.0, 3.0), want, rtol=1e-6)
  np.testing.assert_allclose(
      jax.jit(lambda e: ome.flip_probabilities(e, 640, 3.0))(2.0), flips, rtol=1e-6)


def test_claimed_vs_implied_fields_and_short_vectors():
  eps, alpha = 2.0, 3.0

  def by_parity(num_bits, alpha=alpha):
    p = ome.output_probabilities(eps, num_bits, alpha)
    one = np.abs(np.log(p[:, 1] / p[:, 0]))
    zero = np.abs(np.log((1 - p[:, 1]) / (1 - p[:, 0])))
    return np.maximum(one, zero)

  per_parity = by_parity(3)
  # r = 1, l = 3: bits 0 and 2 even, bit 1 odd (one bit of that parity).
  np.testing.assert_allclose(ome.per_bit_epsilon(eps, 1, 3, alpha),
                             [per_parity[[0, 1, 0]]], rtol=1e-9)
  # alpha < 1: at odd positions the output 0 carries the larger ratio.
  small = by_parity(3, 0.1)
  np.testing.assert_allclose(ome.per_bit_epsilon(eps, 1, 3, 0.1), [small[[0, 1, 0]]],
                             rtol=1e-9)
  assert small[1] > 5.0
  # A concrete jax epsilon: probabilities in float32, the epsilons still float64.
  assert ome.per_bit_epsilon(jnp.float32(eps), 1, 3, alpha).dtype == np.float64
  got = ome.claimed_vs_implied(eps, 1, 3, alpha, rng_bits=32)
  assert set(got) == {'claimed', 'alpha', 'rng_bits', 'per_parity', 'per_vector'}
  assert got['claimed'] == eps and got['alpha'] == alpha and got['rng_bits'] == 32
  np.testing.assert_allclose(got['per_parity'], per_parity, rtol=1e-6)
  np.testing.assert_allclose(got['per_vector'], 2 * per_parity[0] + per_parity[1], rtol=1e-6)
  # A single bit has only an even position: the odd entry is nan.
  single = ome.claimed_vs_implied(eps, 1, 1, alpha)
  assert single['rng_bits'] is None
  assert single['per_parity'][0] == pytest.approx(by_parity(1)[0])
  assert math.isnan(single['per_parity'][1])


@pytest.mark.parametrize('rng_bits', [None, 32, 16])
def test_bit_probabilities_and_pair_epsilon_follow_per_bit_epsilon(rng_bits):
  # Eq. (22) read bit by bit: P(1 | bit) by the parity of the bit's index in the r*l vector,
  # and a pair's epsilon is the sum of per_bit_epsilon where the two encodings differ.
  eps, alpha, r, l = 3.0, 20.0, 3, 5
  rng = np.random.default_rng(0)
  bits = rng.integers(0, 2, size=(2, r, l)).astype(np.uint8)
  p = np.asarray(ome.output_probabilities(eps, r * l, alpha), np.float64)
  if rng_bits is not None:
    p = bitrand.effective_probabilities(p, rng_bits)
  odd = ome.odd_positions(r, l)
  got = ome.bit_one_probabilities(bits, eps, alpha, rng_bits=rng_bits)
  for idx in np.ndindex(bits.shape):
    assert got[idx] == p[int(odd[idx[1:]]), bits[idx]]
  per_bit = ome.per_bit_epsilon(eps, r, l, alpha, rng_bits=rng_bits)
  assert ome.pair_epsilon(bits[0], bits[1], eps, alpha, rng_bits=rng_bits) == pytest.approx(
      float(np.sum(per_bit[bits[0] != bits[1]])))
  everything = ome.pair_epsilon(np.zeros((r, l)), np.ones((r, l)), eps, alpha, rng_bits)
  assert everything == pytest.approx(
      ome.claimed_vs_implied(eps, r, l, alpha, rng_bits)['per_vector'])
