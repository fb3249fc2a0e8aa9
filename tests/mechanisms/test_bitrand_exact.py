"""BitRand's exact contracts: which raw words a draw compares, thresholds at the edges, traced
inputs, and `randomize` as encode -> flip -> decode with the documented defaults."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl_privacy import validate
from fl_privacy.mechanisms import bitrand
from fl_privacy.mechanisms import fixed_point

BLOCK = bitrand.BLOCK_WORDS


def _bits(key, n):
  return np.asarray(jax.random.bits(key, (n,), jnp.uint32))


def test_random_words_up_to_one_block_are_one_draw():
  key = jax.random.key(3)
  for n in (1, 5, BLOCK):
    np.testing.assert_array_equal(bitrand.random_words(key, n), _bits(key, n))


def test_random_words_beyond_one_block_come_from_folded_keys():
  key = jax.random.key(3)
  words = np.asarray(bitrand.random_words(key, 2 * BLOCK + 3))
  assert words.shape == (2 * BLOCK + 3,) and words.dtype == np.uint32
  for b in range(3):
    want = _bits(jax.random.fold_in(key, b), BLOCK)
    np.testing.assert_array_equal(words[b * BLOCK:(b + 1) * BLOCK], want[:len(words) - b * BLOCK])


@pytest.mark.parametrize('shape', [(7,), (3, 5), (2, 3, 4)])
def test_bernoulli_below_compares_the_raw_words(shape):
  key = jax.random.key(11)
  size = math.prod(shape)
  t32 = np.uint32(3 << 30)
  words = _bits(key, size)
  np.testing.assert_array_equal(bitrand.bernoulli_below(key, t32, shape),
                                (words < t32).reshape(shape))
  # A threshold equal to a drawn word: strictly below, so that word gives False.
  hit = bitrand.bernoulli_below(key, jnp.uint32(words[0]), shape)
  assert not np.asarray(hit).reshape(-1)[0]
  # 16 bits: the low halves of ceil(size / 2) words, then their high halves.
  half = _bits(key, (size + 1) // 2)
  halves = np.concatenate([half & 0xFFFF, half >> 16])[:size]
  t16 = np.uint32(40000)
  np.testing.assert_array_equal(bitrand.bernoulli_below(key, t16, shape, rng_bits=16),
                                (halves < t16).reshape(shape))


def test_thresholds_of_zero_never_fire_and_the_largest_almost_always():
  key = jax.random.key(0)
  assert not np.asarray(bitrand.bernoulli_below(key, jnp.uint32(0), (4096,))).any()
  assert not np.asarray(bitrand.bernoulli_below(key, jnp.uint32(0), (4096,), 16)).any()
  assert np.asarray(bitrand.bernoulli_below(key, jnp.uint32(65535), (4096,), 16)).mean() > 0.99


def test_traced_thresholds_at_the_edges():
  q = jnp.asarray([0.0, 0.5, 1.0], jnp.float32)
  t32 = np.asarray(jax.jit(bitrand.thresholds)(q))
  # float32 cannot hold 2**32 - 1: the ceiling is the largest float32 below 2**32.
  np.testing.assert_array_equal(t32, [0, 2**31, 2**32 - 256])
  assert t32.dtype == np.uint32
  t16 = np.asarray(jax.jit(lambda q: bitrand.thresholds(q, 16))(q))
  np.testing.assert_array_equal(t16, [0, 2**15, 2**16 - 1])
  eff = np.asarray(jax.jit(bitrand.effective_probabilities)(q))
  np.testing.assert_allclose(eff, [0.0, 0.5, 1.0 - 2.0**-24], rtol=0, atol=1e-9)
  eff16 = np.asarray(jax.jit(lambda q: bitrand.effective_probabilities(q, 16))(q))
  np.testing.assert_allclose(eff16, [0.0, 0.5, 65535 / 65536], rtol=1e-7)


def test_effective_probabilities_default_to_32_bits():
  q = np.array([0.1, 0.3])
  np.testing.assert_array_equal(bitrand.effective_probabilities(q),
                                np.round(q * 2.0**32) / 2.0**32)
  assert bitrand.effective_probabilities(q).dtype == np.float64
  np.testing.assert_array_equal(bitrand.thresholds(q), np.round(q * 2.0**32).astype(np.uint32))


def test_traced_epsilon_and_alpha_give_the_static_values():
  static = bitrand.alpha(3.0, 64, 10)
  traced = jax.jit(lambda e: bitrand.alpha(e, 64, 10))(jnp.float32(3.0))
  assert float(traced) == pytest.approx(static, rel=1e-5)
  z = bitrand.log_odds(3.0, 64, 10, alpha=0.25)
  np.testing.assert_allclose(z, math.log(0.25) + np.arange(10) * 0.3, rtol=1e-12)
  traced_alpha = jax.jit(lambda a: bitrand.log_odds(3.0, 64, 10, alpha=a))(jnp.float32(0.25))
  np.testing.assert_allclose(traced_alpha, z, rtol=1e-5)
  traced_eps = jax.jit(lambda e: bitrand.log_odds(e, 64, 10, alpha=0.25))(jnp.float32(3.0))
  np.testing.assert_allclose(traced_eps, z, rtol=1e-5)
  q = jax.jit(lambda e: bitrand.flip_probabilities(e, 64, 10))(jnp.float32(3.0))
  np.testing.assert_allclose(q, bitrand.flip_probabilities(3.0, 64, 10), rtol=1e-5)


def test_claimed_vs_implied_reports_its_inputs():
  got = bitrand.claimed_vs_implied(2, 64, 10)
  a = bitrand.alpha(2.0, 64, 10)
  assert got['claimed'] == 2.0 and type(got['claimed']) is float
  assert got['alpha'] == pytest.approx(a, rel=1e-12) and type(got['alpha']) is float
  assert got['rng_bits'] is None
  per_bit = np.abs(math.log(a) + np.arange(10) * 0.2)
  np.testing.assert_allclose(got['per_bit'], per_bit, rtol=1e-12)
  assert got['per_feature'] == pytest.approx(per_bit.sum(), rel=1e-12)
  assert got['per_vector'] == pytest.approx(64 * per_bit.sum(), rel=1e-12)
  fixed = bitrand.claimed_vs_implied(2.0, 64, 10, alpha=0.5, rng_bits=16)
  assert fixed['alpha'] == 0.5 and fixed['rng_bits'] == 16
  q = np.round(bitrand.flip_probabilities(2.0, 64, 10, alpha=0.5) * 65536) / 65536
  np.testing.assert_allclose(fixed['per_bit'], np.abs(np.log(q / (1 - q))), rtol=1e-12)


@pytest.mark.parametrize('kw', [
    {},
    dict(int_bits=3, frac_bits=2, sign_bit=False, honour_sign=True),
    dict(int_bits=4, frac_bits=6, sign_bit=True, honour_sign=False),
    dict(num_features=512, alpha=0.05, rng_bits=16),
    dict(num_features=1),  # r sets the bound on alpha (1 vs d = 40: a 1.5x larger alpha)
])
def test_randomize_is_encode_flip_decode(kw):
  x = jnp.asarray(np.random.default_rng(4).uniform(-12, 12, (6, 40)), jnp.float32)
  fmt = dict(int_bits=kw.get('int_bits', 5), frac_bits=kw.get('frac_bits', 4))
  sign = kw.get('sign_bit', True)
  key = jax.random.key(8)
  bits, _ = fixed_point.encode(x, fmt['int_bits'], fmt['frac_bits'], sign)
  noisy = bitrand.randomize_bits(key, bits, 1.5, num_features=kw.get('num_features'),
                                 alpha=kw.get('alpha'), rng_bits=kw.get('rng_bits', 32))
  want = fixed_point.decode(noisy, fmt['int_bits'], fmt['frac_bits'], sign,
                            kw.get('honour_sign', True))
  np.testing.assert_array_equal(bitrand.randomize(key, x, 1.5, **kw), want)


def test_randomize_bits_uses_the_last_two_axes():
  bits = jnp.zeros((3, 7, 6), jnp.uint8)  # d = 7 features of l = 6 bits
  key = jax.random.key(2)
  q = bitrand.flip_probabilities(1.0, 7, 6)
  want = bitrand.bernoulli_below(key, bitrand.thresholds(q), bits.shape).astype(np.uint8)
  np.testing.assert_array_equal(bitrand.randomize_bits(key, bits, 1.0), want)
  ones = jnp.ones((3, 7, 6), jnp.uint8)
  np.testing.assert_array_equal(bitrand.randomize_bits(key, ones, 1.0), 1 - want)


def test_bad_values_name_the_rule():
  with pytest.raises(validate.ConfigError) as e:
    bitrand.alpha(-1.0, 8, 10)
  assert (e.value.field, e.value.allowed) == ('epsilon', 'a finite number > 0')
  with pytest.raises(validate.ConfigError) as e:
    bitrand.log_odds(1.0, 8, 10, alpha=float('inf'))
  assert (e.value.field, e.value.got) == ('alpha', float('inf'))
  with pytest.raises(validate.ConfigError) as e:
    bitrand.thresholds(np.array([0.5]), 8)
  assert (e.value.field, e.value.allowed, e.value.got) == ('rng_bits', 'one of (32, 16)', 8)
  with pytest.raises(validate.ConfigError) as e:
    bitrand.log_odds(-1.0, 8, 10, alpha=0.5)  # a given alpha does not skip the epsilon check
  assert e.value.field == 'epsilon'
  bitrand.check_epsilon(1e-300)  # tiny but positive is fine


def test_per_bit_epsilon_with_the_bound_or_a_given_alpha():
  a = bitrand.alpha(2.0, 64, 10)
  np.testing.assert_allclose(bitrand.per_bit_epsilon(2.0, 64, 10),
                             np.abs(math.log(a) + np.arange(10) * 0.2), rtol=1e-12)
  np.testing.assert_allclose(bitrand.per_bit_epsilon(2.0, 64, 10, alpha=0.5),
                             np.abs(math.log(0.5) + np.arange(10) * 0.2), rtol=1e-12)
  q = bitrand.flip_probabilities(2.0, 64, 10)
  t = np.round(q * 2.0**32) / 2.0**32
  np.testing.assert_allclose(bitrand.per_bit_epsilon(2.0, 64, 10, rng_bits=32),
                             np.abs(np.log(t / (1 - t))), rtol=1e-9)
  given = bitrand.claimed_vs_implied(2.0, 64, 10, alpha=0.5)
  np.testing.assert_allclose(given['per_bit'], np.abs(math.log(0.5) + np.arange(10) * 0.2),
                             rtol=1e-12)


def test_thresholds_are_clipped_uint32_words_for_any_float_input():
  q = np.array([-0.25, 0.0, 0.5, 1.0, 1.5])
  want = np.array([0, 0, 2**31, 2**32 - 1, 2**32 - 1], np.uint32)
  for values in (q, q.astype(np.float32)):  # float32 input: still computed in float64
    got = bitrand.thresholds(values)
    assert got.dtype == np.uint32
    np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(bitrand.thresholds(q, 16), [0, 0, 2**15, 2**16 - 1, 2**16 - 1])
  traced = np.asarray(jax.jit(bitrand.thresholds)(jnp.asarray(q, jnp.float32)))
  np.testing.assert_array_equal(traced, [0, 0, 2**31, 2**32 - 256, 2**32 - 256])
