"""Fixed-point encoding: round trips, bit order, clipping counts, the public code's sign bug."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl_privacy import validate
from fl_privacy.mechanisms import fixed_point

FORMATS = [(5, 4), (3, 6), (0, 8), (8, 0)]


def _maybe_jit(fn, jit, **static):
  bound = lambda *a: fn(*a, **static)
  return jax.jit(bound) if jit else bound


@pytest.mark.parametrize('jit', [False, True])
@pytest.mark.parametrize('int_bits,frac_bits', FORMATS)
@pytest.mark.parametrize('sign_bit', [True, False])
def test_round_trip_within_half_a_quantum(jit, int_bits, frac_bits, sign_bit):
  top = fixed_point.max_value(int_bits, frac_bits)
  low = -top if sign_bit else 0.0
  x = np.random.default_rng(0).uniform(low, top, size=(3, 4, 50)).astype(np.float32)
  fmt = dict(int_bits=int_bits, frac_bits=frac_bits, sign_bit=sign_bit)
  bits, clipped = _maybe_jit(fixed_point.encode, jit, **fmt)(x)
  y = _maybe_jit(fixed_point.decode, jit, **fmt)(bits)
  l = fixed_point.bits_per_feature(**fmt)
  assert bits.shape == (3, 4, 50, l) and bits.dtype == jnp.uint8
  assert set(np.unique(np.asarray(bits))) <= {0, 1}
  assert int(clipped) == 0
  assert y.shape == x.shape and y.dtype == jnp.float32
  half = fixed_point.quantum(frac_bits) / 2
  np.testing.assert_array_less(np.abs(np.asarray(y) - x), half + 1e-6)


def test_bit_order_is_sign_then_most_to_least_significant():
  # 2**j has one set magnitude bit; with 5 + 4 bits it sits at position 1 + (4 - j).
  for j in range(-4, 5):
    bits, _ = fixed_point.encode(jnp.array([2.0**j, -(2.0**j)]), 5, 4)
    want = np.zeros(10, np.uint8)
    want[1 + 4 - j] = 1
    np.testing.assert_array_equal(bits[0], want)
    want[0] = 1
    np.testing.assert_array_equal(bits[1], want)


def test_codes_match_integer_arithmetic():
  x = np.random.default_rng(1).uniform(-31, 31, size=500).astype(np.float32)
  bits, _ = fixed_point.encode(x, 5, 4)
  powers = 2 ** np.arange(8, -1, -1)
  codes = np.asarray(bits)[:, 1:].astype(np.int64) @ powers
  np.testing.assert_array_equal(codes, np.round(np.abs(x) * 16).astype(np.int64))
  np.testing.assert_array_equal(np.asarray(bits)[:, 0], (x < 0).astype(np.uint8))


@pytest.mark.parametrize('jit', [False, True])
def test_clipping_is_counted_and_never_overflows(jit):
  x = jnp.array([40.0, -40.0, 31.9375, 31.97, 1e9, jnp.inf, -jnp.inf, jnp.nan, 0.5])
  bits, clipped = _maybe_jit(fixed_point.encode, jit, int_bits=5, frac_bits=4)(x)
  y = np.asarray(fixed_point.decode(bits, 5, 4))
  # 31.97 rounds to code 512, one past the largest; nan encodes as 0.
  assert int(clipped) == 7
  np.testing.assert_array_equal(
      y, [31.9375, -31.9375, 31.9375, 31.9375, 31.9375, 31.9375, -31.9375, 0.0, 0.5])


def test_unsigned_format_counts_negatives_as_clipped():
  x = jnp.array([-1.0, -0.02, 0.0, 2.5])
  bits, clipped = fixed_point.encode(x, 5, 4, sign_bit=False)
  assert bits.shape == (4, 9)
  assert int(clipped) == 1  # -0.02 rounds to 0 and is representable
  np.testing.assert_array_equal(fixed_point.decode(bits, 5, 4, sign_bit=False),
                                [0.0, 0.0, 0.0, 2.5])


def test_clip_count_sums_over_batch_axes():
  x = jnp.full((4, 3, 7), 100.0)
  _, clipped = fixed_point.encode(x)
  assert int(clipped) == 4 * 3 * 7


def test_ignoring_the_sign_reproduces_the_public_code():
  x = np.random.default_rng(2).uniform(-10, 10, size=(6, 40)).astype(np.float32)
  bits, _ = fixed_point.encode(x)
  honoured = np.asarray(fixed_point.decode(bits))
  dropped = np.asarray(fixed_point.decode(bits, honour_sign=False))
  assert (dropped >= 0).all() and (honoured < 0).any()
  np.testing.assert_array_equal(dropped, np.abs(honoured))
  flipped = bits.at[..., 0].set(1 - bits[..., 0])
  np.testing.assert_array_equal(fixed_point.decode(flipped, honour_sign=False), dropped)
  np.testing.assert_array_equal(fixed_point.decode(flipped), -honoured)


def test_decode_checks_the_bit_count():
  bits, _ = fixed_point.encode(jnp.ones(3))
  with pytest.raises(ValueError, match='bits per feature'):
    fixed_point.decode(bits, 5, 4, sign_bit=False)


@pytest.mark.parametrize('int_bits,frac_bits', [(-1, 4), (5, 2.5), (0, 0), (20, 20)])
def test_bad_format_raises_config_error(int_bits, frac_bits):
  with pytest.raises(validate.ConfigError) as e:
    fixed_point.encode(jnp.ones(3), int_bits, frac_bits)
  assert e.value.field in ('int_bits', 'frac_bits')


def test_format_helpers():
  assert fixed_point.bits_per_feature() == 10
  assert fixed_point.max_value() == 31.9375
  assert fixed_point.quantum() == 1 / 16
  np.testing.assert_array_equal(fixed_point.bit_weights(2, 1),
                                [0.0, 2.0, 1.0, 0.5])


@pytest.mark.parametrize('sign_bit,honour_sign', [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize('int_bits,frac_bits', [(5, 4), (0, 3), (10, 14)])
def test_decode_pattern_equals_decode_of_the_bits(sign_bit, honour_sign, int_bits, frac_bits):
  l = fixed_point.bits_per_feature(int_bits, frac_bits, sign_bit)
  bits = np.random.default_rng(l).integers(0, 2, (50, 7, l)).astype(np.uint8)
  pattern = np.zeros(bits.shape[:-1], np.uint32)
  for i in range(l):  # bit 0 is the most significant
    pattern = (pattern << 1) | bits[..., i]
  np.testing.assert_array_equal(
      fixed_point.decode_pattern(jnp.asarray(pattern), int_bits, frac_bits, sign_bit,
                                 honour_sign),
      fixed_point.decode(jnp.asarray(bits), int_bits, frac_bits, sign_bit, honour_sign))


def test_every_default_is_the_papers_signed_1_5_4_format():
  x = jnp.asarray([-1.5, 0.0625, 31.9375, -40.0])
  bits, n = fixed_point.encode(x)
  want_bits, want_n = fixed_point.encode(x, 5, 4, True)
  np.testing.assert_array_equal(bits, want_bits)
  assert int(n) == int(want_n) == 1
  np.testing.assert_array_equal(fixed_point.decode(bits), [-1.5, 0.0625, 31.9375, -31.9375])
  np.testing.assert_array_equal(fixed_point.bit_weights(), fixed_point.bit_weights(5, 4, True))
  pattern = jnp.asarray([(1 << 9) | 24, 1, 511, (1 << 9) | 511], jnp.uint32)
  np.testing.assert_array_equal(fixed_point.decode_pattern(pattern),
                                [-1.5, 0.0625, 31.9375, -31.9375])


def test_float16_input_is_encoded_in_float32():
  # 0.5 * 2**20 overflows float16: the input must be widened before it is scaled.
  x = jnp.asarray([0.5, -0.25, 3e-5], jnp.float16)
  bits, n = fixed_point.encode(x, 0, 20)
  want_bits, want_n = fixed_point.encode(x.astype(jnp.float32), 0, 20)
  np.testing.assert_array_equal(bits, want_bits)
  assert int(n) == int(want_n) == 0


def test_decode_error_names_both_bit_counts():
  bits, _ = fixed_point.encode(jnp.ones((2, 3)))
  with pytest.raises(ValueError) as e:
    fixed_point.decode(bits, 5, 4, sign_bit=False)
  assert str(e.value) == 'bits has 10 bits per feature; the format (0 + 5 + 4) has 9'


def test_format_bounds_messages_and_the_sign_of_zero():
  for int_bits, frac_bits in ((1, 0), (0, 1), (20, 10)):  # 1 and 30 magnitude bits: allowed
    fixed_point.check_format(int_bits, frac_bits)
  with pytest.raises(validate.ConfigError) as e:
    fixed_point.check_format(-1, 4)
  assert (e.value.field, e.value.allowed, e.value.got) == ('int_bits', 'an integer >= 0', -1)
  with pytest.raises(validate.ConfigError) as e:
    fixed_point.check_format(20, 11)
  assert (e.value.allowed, e.value.got) == (
      'such that 1 <= int_bits + frac_bits <= 30', (20, 11))
  # 0 is not negative: its sign bit is 0.
  bits, _ = fixed_point.encode(jnp.asarray([0.0, -0.0]))
  np.testing.assert_array_equal(bits[:, 0], [0, 0])
