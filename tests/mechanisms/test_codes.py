"""The AMI game's code sampler (`mechanisms.codes`): the fixed-point encoding, packing bit groups
into integers, the per-group inverse-CDF tables against the exact product law of independent
bits, and the sampler's draws (exact words, XOR structure, frequencies)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps

from fl_privacy.mechanisms import bitrand
from fl_privacy.mechanisms import codes
from fl_privacy.mechanisms import fixed_point
from fl_privacy.mechanisms import ome

SCALE = 2.0**32
# Jitted (one compile per shape instead of one per operation: keeps the file fast).
_pack = jax.jit(codes.pack_codes, static_argnums=1)
_unpack = jax.jit(codes.unpack_codes, static_argnums=1)
_to_values = jax.jit(codes.codes_to_values, static_argnums=(1, 2))
_sample = jax.jit(codes.sample_codes, static_argnums=3)
# A channel that is not flip-symmetric: P(out_k = 1 | in_k = u) for 5 bits.
P_ASYM = np.array([[0.10, 0.70], [0.25, 0.95], [0.40, 0.55], [0.05, 0.60], [0.33, 0.90]])


def _exact_probs(p_one, n, rows):
  """probs[u, o] = prod_k P(out_k = o_k | in_k = u_k) over all n-bit codes (MSB = bit 0)."""
  out = np.zeros((len(rows), 2**n))
  for r, u in enumerate(rows):
    ubits = [(u >> (n - 1 - k)) & 1 for k in range(n)]
    for o, obits in enumerate(itertools.product((0, 1), repeat=n)):
      out[r, o] = np.prod([p_one[k, ubits[k]] if obits[k] else 1.0 - p_one[k, ubits[k]]
                           for k in range(n)])
  return out


def _realized(table):
  """Output-code probabilities that a uint32 inverse-CDF table realizes, [rows, 2**n]."""
  t = np.asarray(table, np.float64)
  edges = np.concatenate([np.zeros((len(t), 1)), t, np.full((len(t), 1), SCALE)], axis=-1)
  return np.diff(edges, axis=-1) / SCALE


def test_encoding_defaults_and_ranges():
  enc = codes.Encoding()
  assert (enc.int_bits, enc.frac_bits, enc.sign_bit, enc.honour_sign) == (5, 4, True, True)
  assert codes.DEFAULT_GROUP_SIZE == 5
  assert codes.MECHANISMS == ('none', 'bitrand', 'ome')
  assert enc.num_bits == 10 and enc.group_sizes() == (5, 5)
  assert enc.max_value == 511 / 16 and enc.min_value == -511 / 16
  assert codes.Encoding(honour_sign=False).min_value == 0.0
  unsigned = codes.Encoding(int_bits=3, frac_bits=2, sign_bit=False)
  assert unsigned.num_bits == 5 and unsigned.max_value == 31 / 4 and unsigned.min_value == 0.0
  assert unsigned.group_sizes(2) == (2, 2, 1)
  assert enc.group_sizes(3) == (3, 3, 3, 1) and enc.group_sizes(4) == (4, 4, 2)
  assert enc.group_sizes(10) == (10,) and enc.group_sizes(1) == (1,) * 10


@pytest.mark.parametrize('sizes', [(5, 5), (3, 3, 3, 1), (4, 4, 2)])
def test_pack_codes_is_msb_first_integer_per_group_and_unpack_inverts_it(sizes):
  bits = np.asarray(jax.random.bernoulli(jax.random.key(0), 0.5, (6, 3, 10)), np.uint8)
  packed = _pack(jnp.asarray(bits), sizes)
  assert packed.shape == (6, 3, len(sizes)) and packed.dtype == jnp.uint32
  start = 0
  for g, n in enumerate(sizes):
    want = bits[..., start:start + n].astype(np.int64) @ (2 ** np.arange(n - 1, -1, -1))
    np.testing.assert_array_equal(np.asarray(packed[..., g]), want)
    start += n
  unpacked = _unpack(packed, sizes)
  assert unpacked.dtype == jnp.uint8
  np.testing.assert_array_equal(np.asarray(unpacked), bits)


def test_a_32_bit_group_fills_one_uint32_word():
  bits = np.asarray(jax.random.bernoulli(jax.random.key(1), 0.5, (4, 32)), np.uint8)
  bits[0] = 1  # 2**32 - 1
  packed = _pack(jnp.asarray(bits), (32,))
  want = bits.astype(np.uint64) @ (2 ** np.arange(31, -1, -1, dtype=np.uint64))
  np.testing.assert_array_equal(np.asarray(packed)[:, 0], want)
  np.testing.assert_array_equal(np.asarray(_unpack(packed, (32,))), bits)


def test_unpack_codes_of_every_group_code():
  sizes = (3, 2)
  grid = np.array([[a, b] for a in range(8) for b in range(4)], np.uint32)  # [32, 2]
  bits = np.asarray(_unpack(jnp.asarray(grid), sizes))
  assert bits.shape == (32, 5)
  want = (np.arange(32)[:, None] >> np.arange(4, -1, -1)[None, :]) & 1
  np.testing.assert_array_equal(bits, want)
  np.testing.assert_array_equal(np.asarray(_pack(jnp.asarray(bits), sizes)), grid)


@pytest.mark.parametrize('enc,group', [
    (codes.Encoding(), 5), (codes.Encoding(honour_sign=False), 3),
    (codes.Encoding(int_bits=3, frac_bits=2, sign_bit=False), 2),
    (codes.Encoding(int_bits=2, frac_bits=3, sign_bit=True), 4)])
def test_codes_to_values_is_fixed_point_decode(enc, group):
  sizes = enc.group_sizes(group)
  l = enc.num_bits
  pattern = np.arange(2**l, dtype=np.int64)
  bits = ((pattern[:, None] >> np.arange(l - 1, -1, -1)[None, :]) & 1).astype(np.uint8)
  # As [2, 2**l / 2, G]: a leading batch axis before the features.
  packed = _pack(jnp.asarray(bits.reshape(2, -1, l)), sizes)
  values = np.asarray(_to_values(packed, sizes, enc)).reshape(-1)
  assert values.dtype == np.float32
  mag = (pattern & (2 ** (enc.int_bits + enc.frac_bits) - 1)) / 2**enc.frac_bits
  sign = np.where(bits[:, 0] == 1, -1.0, 1.0) if enc.sign_bit and enc.honour_sign else 1.0
  np.testing.assert_array_equal(values, sign * mag)
  np.testing.assert_array_equal(values, fixed_point.decode(
      jnp.asarray(bits), enc.int_bits, enc.frac_bits, enc.sign_bit, enc.honour_sign))


def _check_table(channel, p_one, sizes, xor):
  assert channel.xor == (xor,) * len(sizes)
  tv, start = 0.0, 0
  for table, n in zip(channel.thresholds, sizes):
    p = p_one[start:start + n]
    start += n
    rows = [0] if xor else list(range(2**n))
    assert table.dtype == np.uint32 and table.shape == (len(rows), 2**n - 1)
    exact = _exact_probs(p, n, rows)
    t = np.asarray(table, np.float64)
    assert np.all(np.diff(t, axis=-1) >= 0)  # monotone
    # Each threshold is the exact CDF rounded to a multiple of 2**-32 (at most 2**32 - 1).
    cdf = np.minimum(np.cumsum(exact, -1)[:, :-1], 1.0 - 1.0 / SCALE)
    np.testing.assert_allclose(t / SCALE, cdf, rtol=0, atol=0.5 / SCALE + 1e-15)
    # So each output code's probability is off by less than 2**-32, or 1.5 * 2**-32 next to
    # the clip (a CDF within half a unit of 1 is stored as 2**32 - 1, not 2**32).
    realized = _realized(table)
    clipped = np.concatenate([t == SCALE - 1, np.zeros((len(t), 1), bool)], -1)
    clipped[:, 1:] |= clipped[:, :-1]
    err = np.abs(realized - exact) * SCALE
    assert np.all(err[~clipped] < 1 + 1e-5) and np.all(err < 1.5 + 1e-5)
    tv += np.max(0.5 * np.sum(np.abs(realized - exact), axis=-1))
  assert channel.tv_per_feature == pytest.approx(tv, rel=1e-9, abs=1e-25)
  assert 0 < channel.tv_per_feature <= sum(2**n for n in sizes) * 0.5 / SCALE


def test_bitrand_channel_is_the_product_of_eq23_flip_probabilities():
  """Eq. (23) of the AMI paper: bits flip independently, q_k = P(0 -> 1) = P(1 -> 0), so one
  flip-pattern row per group, P(f) = prod_k q_k^f_k (1 - q_k)^(1 - f_k), up to 2**-32."""
  enc = codes.Encoding()
  q = bitrand.flip_probabilities(2.0, 8, 10)
  p_one = codes.bit_probabilities('bitrand', 2.0, 8, enc)
  assert p_one.dtype == np.float64 and p_one.shape == (10, 2)
  np.testing.assert_array_equal(p_one, np.stack([q, 1.0 - q], axis=1))
  for sizes in [(5, 5), (3, 3, 3, 1)]:
    _check_table(codes.channel_from_bit_probs(p_one, sizes), p_one, sizes, xor=True)


def test_asymmetric_channel_has_one_row_per_input_code():
  p_one = np.concatenate([P_ASYM, P_ASYM[:3]])  # 8 bits
  sizes = (5, 3)
  _check_table(codes.channel_from_bit_probs(p_one, sizes), p_one, sizes, xor=False)
  # Off flip symmetry by 1e-3 in one bit only: still one row per input code.
  q = np.array([0.1, 0.2, 0.3])
  near = np.stack([q, 1.0 - q], axis=1)
  near[1, 1] += 1e-3
  _check_table(codes.channel_from_bit_probs(near, (3,)), near, (3,), xor=False)
  # Symmetry is exact up to 1e-15 in absolute terms, no relative slack: 1e-9 off is asymmetric.
  near[1, 1] -= 1e-3 - 1e-9
  assert codes.channel_from_bit_probs(near, (3,)).xor == (False,)
  near[1, 1] -= 1e-9 - 1e-16
  assert codes.channel_from_bit_probs(near, (3,)).xor == (True,)
  # float32 probabilities are computed with in float64, as float64 ones.
  p32 = P_ASYM.astype(np.float32)
  a, b = (codes.channel_from_bit_probs(p, (2, 3)) for p in (p32, p32.astype(np.float64)))
  assert a.tv_per_feature == b.tv_per_feature
  for ta, tb in zip(a.thresholds, b.thresholds):
    np.testing.assert_array_equal(ta, tb)


def test_ome_channel_reads_eq22_by_bit_parity():
  """Eq. (22) of the AMI paper: P(out = 1 | in) depends on the input bit and the parity of the
  bit's position in the r*l vector (l even, so parity of its position within the feature)."""
  enc = codes.Encoding()
  p_one = codes.bit_probabilities('ome', 3.0, 7, enc)
  want = np.asarray(ome.output_probabilities(3.0, 70), np.float64)
  assert p_one.dtype == np.float64 and p_one.shape == (10, 2)
  # float64 also where Eq. (22) is evaluated in float32 (a float32 epsilon).
  assert codes.bit_probabilities('ome', np.float32(3.0), 7, enc).dtype == np.float64
  np.testing.assert_array_equal(p_one[0::2], np.broadcast_to(want[0], (5, 2)))
  np.testing.assert_array_equal(p_one[1::2], np.broadcast_to(want[1], (5, 2)))
  _check_table(codes.channel_from_bit_probs(p_one, (5, 5)), p_one, (5, 5), xor=False)
  assert codes.bit_probabilities('ome', 3.0, 7, codes.Encoding(sign_bit=False)) is None
  for name in ('none', 'gaussian'):
    with pytest.raises(ValueError, match='no bitwise channel'):
      codes.bit_probabilities(name, 3.0, 7, enc)


def test_certain_outputs_are_clipped_to_the_largest_threshold():
  # Every bit outputs 0: P(code 0) = 1, whose CDF 1 cannot be a uint32; the table stops at
  # 2**32 - 1, which leaves 2**-32 to the last code: a TV of 2**-32 per group.
  p_one = np.zeros((3, 2))
  channel = codes.channel_from_bit_probs(p_one, (2, 1))
  assert channel.xor == (False, False)
  for table, n in zip(channel.thresholds, (2, 1)):
    np.testing.assert_array_equal(np.asarray(table), np.full((2**n, 2**n - 1), 2**32 - 1))
  assert channel.tv_per_feature == 2 * 2.0**-32
  # A flip-symmetric channel that never flips: one row, all mass on the pattern 0.
  never = codes.channel_from_bit_probs(np.array([[0.0, 1.0]] * 2), (2,))
  assert never.xor == (True,)
  np.testing.assert_array_equal(np.asarray(never.thresholds[0]), [[2**32 - 1] * 3])
  assert never.tv_per_feature == 2.0**-32


def test_channel_rejects_a_wrong_shape():
  with pytest.raises(ValueError, match=r'p_one must be \[5, 2\]'):
    codes.channel_from_bit_probs(np.zeros((4, 2)), (3, 2))
  with pytest.raises(ValueError, match='got'):
    codes.channel_from_bit_probs(np.zeros((5, 3)), (3, 2))


def _reference_draw(key, code_arr, thresholds, xor):
  """numpy `sample_codes`: one uint32 word per group, output = #thresholds <= word."""
  u = np.asarray(jax.random.bits(key, code_arr.shape, jnp.uint32))
  out = np.zeros_like(code_arr)
  for g, (table, is_xor) in enumerate(zip(thresholds, xor)):
    table = np.asarray(table)
    rows = table[np.zeros_like(code_arr[..., g]) if is_xor else code_arr[..., g]]
    drawn = np.sum(u[..., g, None] >= rows, axis=-1).astype(np.uint32)
    out[..., g] = code_arr[..., g] ^ drawn if is_xor else drawn
  return out


def test_sample_codes_compares_one_raw_word_per_group():
  key = jax.random.key(7)
  sym = codes.channel_from_bit_probs(codes.bit_probabilities('bitrand', 1.0, 4,
                                                             codes.Encoding()), (5, 5))
  p_one = np.concatenate([P_ASYM, P_ASYM[:3]])
  asym = codes.channel_from_bit_probs(p_one, (5, 3))
  rng = np.random.default_rng(0)
  for channel, sizes in ((sym, (5, 5)), (asym, (5, 3))):
    code_arr = np.stack([rng.integers(0, 2**n, size=(4, 3)) for n in sizes],
                        axis=-1).astype(np.uint32)
    tables = tuple(jnp.asarray(t) for t in channel.thresholds)
    out = _sample(key, jnp.asarray(code_arr), tables, channel.xor)
    assert out.shape == code_arr.shape and out.dtype == jnp.uint32
    np.testing.assert_array_equal(np.asarray(out),
                                  _reference_draw(key, code_arr, channel.thresholds, channel.xor))


def test_a_word_equal_to_a_threshold_draws_the_next_code():
  # Inverse CDF: code c is drawn when thresholds[c - 1] <= word < thresholds[c].
  key = jax.random.key(3)
  word = int(np.asarray(jax.random.bits(key, (1, 1, 1), jnp.uint32))[0, 0, 0])
  zero = jnp.zeros((1, 1, 1), jnp.uint32)
  for t, want in ((word, 1), (word + 1, 0)):
    table = jnp.asarray([[t], [t]], jnp.uint32)
    assert int(_sample(key, zero, (table,), (False,))[0, 0, 0]) == want
    assert int(_sample(key, zero + 1, (table[:1],), (True,))[0, 0, 0]) == 1 - want


def test_flip_symmetric_draws_are_input_xor_one_flip_pattern():
  # With one key, the flip pattern does not depend on the input: out ^ in is the same for
  # every input code, and equals the output for input 0.
  channel = codes.channel_from_bit_probs(codes.bit_probabilities('bitrand', 3.0, 4,
                                                                 codes.Encoding()), (5, 5))
  tables = tuple(jnp.asarray(t) for t in channel.thresholds)
  key = jax.random.key(11)
  grid = jnp.asarray(np.stack(np.meshgrid(np.arange(32), np.arange(32), indexing='ij'),
                              -1).reshape(1, 1024, 2), jnp.uint32)
  zeros = jnp.zeros_like(grid)
  flips = np.asarray(_sample(key, zeros, tables, channel.xor))
  out = np.asarray(_sample(key, grid, tables, channel.xor))
  np.testing.assert_array_equal(out ^ np.asarray(grid), flips)
  assert len(np.unique(flips)) > 1  # not a constant


@pytest.mark.parametrize('mechanism', ['bitrand', 'asymmetric'])
def test_sampled_code_frequencies_match_exact_probabilities(mechanism):
  """Output-code frequencies of every input code against the product law (Eq. (23) for
  BitRand): each count within its binomial 1 - 1e-6 interval at the exact probability."""
  if mechanism == 'bitrand':
    p_one = codes.bit_probabilities('bitrand', 6.0, 2, codes.Encoding(int_bits=2, frac_bits=2))
  else:
    p_one = P_ASYM
  sizes = (3, 2)
  channel = codes.channel_from_bit_probs(p_one, sizes)
  n = 8_000
  # Feature j carries input codes (j, j % 4): every input of both groups.
  inputs = np.stack([np.arange(8), np.arange(8) % 4], -1).astype(np.uint32)  # [8, 2]
  out = np.asarray(_sample(
      jax.random.key(5), jnp.broadcast_to(jnp.asarray(inputs), (n, 8, 2)),
      tuple(jnp.asarray(t) for t in channel.thresholds), channel.xor))
  start = 0
  for g, m in enumerate(sizes):
    exact = _exact_probs(p_one[start:start + m], m, range(2**m))  # [in, out]
    start += m
    for j in range(8):
      counts = np.bincount(out[:, j, g], minlength=2**m)
      assert counts.shape == (2**m,)
      lo, hi = sps.binom.interval(1 - 1e-6, n, exact[inputs[j, g]])
      assert np.all((lo <= counts) & (counts <= hi)), (g, j, counts, n * exact[inputs[j, g]])


def test_mechanism_fn_builds_the_registry_randomizers():
  x = jnp.asarray([[-3.3, 0.7, 2.9], [1.1, -0.2, 5.0]])
  key = jax.random.key(2)
  enc = codes.Encoding(int_bits=2, frac_bits=3, sign_bit=True, honour_sign=False)
  np.testing.assert_array_equal(
      jax.jit(codes.mechanism_fn('bitrand', 1.5, 7, enc))(key, x),
      jax.jit(lambda k, x: bitrand.randomize(k, x, 1.5, int_bits=2, frac_bits=3, sign_bit=True,
                                             honour_sign=False, num_features=7))(key, x))
  unsigned = codes.Encoding(int_bits=3, frac_bits=1, sign_bit=False)
  np.testing.assert_array_equal(
      jax.jit(codes.mechanism_fn('ome', 2.5, 5, unsigned))(key, x),
      jax.jit(lambda k, x: ome.randomize(k, x, 2.5, int_bits=3, frac_bits=1, sign_bit=False,
                                         num_features=5))(key, x))
  signed = codes.Encoding(int_bits=3, frac_bits=1)  # honour_sign True
  np.testing.assert_array_equal(
      jax.jit(codes.mechanism_fn('ome', 2.5, 5, signed))(key, x),
      jax.jit(lambda k, x: ome.randomize(k, x, 2.5, int_bits=3, frac_bits=1, num_features=5))(
          key, x))
  ident = codes.mechanism_fn('none', None, 3, enc)(key, np.array([[1, -2, 3]], np.int32))
  assert ident.dtype == jnp.float32
  np.testing.assert_array_equal(ident, [[1.0, -2.0, 3.0]])
  with pytest.raises(ValueError, match=r"mechanism must be one of .*'gaussian'"):
    codes.mechanism_fn('gaussian', 1.0, 3, enc)
