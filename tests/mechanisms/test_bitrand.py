"""BitRand (Eq. (23) of the AMI paper): flip probabilities, implied epsilon, purity."""

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

CONFIDENCE = 0.999


def _cp(k, n, confidence=CONFIDENCE):
  ci = sp_stats.binomtest(int(k), int(n)).proportion_ci(confidence, 'exact')
  return ci.low, ci.high


def _randomize_bits(jit, epsilon, **kw):
  fn = lambda key, bits: bitrand.randomize_bits(key, bits, epsilon, **kw)
  return jax.jit(fn) if jit else fn


def _alpha_by_hand(eps, r, l):
  total = sum(math.exp(2 * eps * k / l) for k in range(l))
  return math.sqrt((eps + r * l) / (2 * r * total))


@pytest.mark.parametrize('eps,want', [(1.0, 0.416), (5.0, 0.0198), (10.0, 2.6e-4)])
def test_alpha_is_the_papers_bound(eps, want):
  a = bitrand.alpha(eps, 512, 10)
  assert a == pytest.approx(_alpha_by_hand(eps, 512, 10), rel=1e-12)
  assert a == pytest.approx(want, rel=0.02)  # SEED-NOTES §1, from the public code


def test_flip_probabilities_follow_eq_23():
  q = bitrand.flip_probabilities(10.0, 512, 10)
  a = bitrand.alpha(10.0, 512, 10)
  odds = a * np.exp(np.arange(10) * 10.0 / 10)
  np.testing.assert_allclose(q, odds / (1 + odds), rtol=1e-12)
  assert np.all(np.diff(q) > 0)  # less significant bits flip more often
  np.testing.assert_allclose(bitrand.flip_probabilities(1.0, 512, 10)[[0, -1]],
                             [0.29, 0.51], atol=0.01)
  np.testing.assert_allclose(bitrand.flip_probabilities(1.0, 512, 10, alpha=1.0)[0], 0.5)


@pytest.mark.parametrize('jit', [False, True])
@pytest.mark.parametrize('rng_bits', [32, 16])
@pytest.mark.parametrize('eps', [1.0, 10.0])
def test_per_bit_flip_rates_match_effective_probabilities(jit, rng_bits, eps):
  """Eq. (23): P(1 -> 0) = 1 - p_X = q_k = P(0 -> 1), per bit position k."""
  n_rows, d, l = 100, 64, 10
  fn = _randomize_bits(jit, eps, num_features=512, rng_bits=rng_bits)
  want = bitrand.effective_probabilities(
      bitrand.flip_probabilities(eps, 512, l), rng_bits)
  for value, key in ((0, 0), (1, 1)):
    bits = jnp.full((n_rows, d, l), value, jnp.uint8)
    out = np.asarray(fn(jax.random.key(key), bits))
    flips = (out != value).reshape(-1, l).sum(axis=0)
    for k in range(l):
      low, high = _cp(flips[k], n_rows * d)
      assert low <= want[k] <= high, (value, k, flips[k], want[k])


@pytest.mark.parametrize('eps', [1.0, 3.0, 10.0])
def test_probability_ratios_imply_the_computed_epsilon(eps):
  """Monte Carlo log-ratios per bit give `claimed_vs_implied`, far above the claimed eps.

  For a bit with flip probability q, the worst-case output ratio is
  max(P(1|1)/P(1|0), P(0|0)/P(0|1)) = exp|ln((1 - q) / q)|; independent bits add up.
  """
  r, l, n = 512, 10, 40 * 512
  key = jax.random.key(7)
  ones = np.asarray(bitrand.randomize_bits(jax.random.fold_in(key, 1),
                                           jnp.ones((n // r, r, l), jnp.uint8), eps))
  zeros = np.asarray(bitrand.randomize_bits(jax.random.fold_in(key, 0),
                                            jnp.zeros((n // r, r, l), jnp.uint8), eps))
  p11 = ones.reshape(-1, l).sum(0)
  p10 = zeros.reshape(-1, l).sum(0)
  summary = bitrand.claimed_vs_implied(eps, r, l)
  lo_sum = hi_sum = 0.0
  for k in range(l):
    lo11, hi11 = _cp(p11[k], n)
    lo10, hi10 = _cp(p10[k], n)
    lo, hi = math.log(lo11 / hi10), math.log(hi11 / lo10)
    abs_lo = 0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))
    abs_hi = max(abs(lo), abs(hi))
    assert abs_lo <= summary['per_bit'][k] <= abs_hi
    lo_sum, hi_sum = lo_sum + abs_lo, hi_sum + abs_hi
  assert lo_sum <= summary['per_feature'] <= hi_sum
  assert summary['per_vector'] == pytest.approx(r * summary['per_feature'])
  # The documented relation: eps sets the log-odds spread across positions ...
  z = bitrand.log_odds(eps, r, l)
  assert z[-1] - z[0] == pytest.approx((l - 1) * eps / l)
  # ... while the vector-level LDP epsilon the probabilities imply is far larger.
  assert summary['per_feature'] >= (l - 1) * eps / l
  assert summary['per_vector'] > 100 * eps


def test_implied_epsilon_with_16_bit_thresholds():
  exact = bitrand.claimed_vs_implied(10.0, 512, 10)
  coarse = bitrand.claimed_vs_implied(10.0, 512, 10, rng_bits=16)
  assert coarse['per_vector'] == pytest.approx(exact['per_vector'], rel=1e-3)
  # A probability that 16-bit thresholds round to 0 never flips: no privacy at all.
  tiny = bitrand.claimed_vs_implied(1.0, 512, 10, alpha=1e-6, rng_bits=16)
  assert math.isinf(tiny['per_vector'])
  assert math.isfinite(bitrand.claimed_vs_implied(1.0, 512, 10, alpha=1e-6,
                                                  rng_bits=32)['per_vector'])


def test_thresholds_and_effective_probabilities():
  q = np.array([0.0, 1e-6, 0.25, 0.5, 1.0 - 1e-12, 1.0])
  t32 = bitrand.thresholds(q, 32)
  t16 = bitrand.thresholds(q, 16)
  np.testing.assert_array_equal(t16, [0, 0, 16384, 32768, 65535, 65535])
  np.testing.assert_array_equal(t32[:4], [0, 4295, 2**30, 2**31])
  assert t32[-1] == 2**32 - 1
  np.testing.assert_allclose(bitrand.effective_probabilities(q, 32), q, atol=2.0**-32)
  # traced q: float32 thresholds agree to float32 precision
  traced = jax.jit(lambda q: bitrand.thresholds(q, 32))(jnp.asarray(q[:4], jnp.float32))
  np.testing.assert_allclose(np.asarray(traced, np.float64), t32[:4], rtol=1e-6)


@pytest.mark.parametrize('threshold', [1, 4096, 32768, 65535])
def test_16_bit_draws_realise_threshold_over_65536(threshold):
  n = 1 << 20
  hits = bitrand.bernoulli_below(jax.random.key(threshold), jnp.uint32(threshold), (n,),
                                 rng_bits=16)
  low, high = _cp(int(hits.sum()), n)
  assert low <= threshold / 65536 <= high


def test_16_bit_halves_of_one_word_are_independent():
  n = 1 << 18
  hits = np.asarray(bitrand.bernoulli_below(jax.random.key(3), jnp.uint32(32768), (n,),
                                            rng_bits=16))
  both = int((hits[:n // 2] & hits[n // 2:]).sum())  # halves of the same word
  low, high = _cp(both, n // 2)
  assert low <= 0.25 <= high


@pytest.mark.parametrize('jit', [False, True])
@pytest.mark.parametrize('rng_bits', [32, 16])
def test_purity_uniqueness_and_jit(jit, rng_bits):
  bits, _ = fixed_point.encode(
      jnp.asarray(np.random.default_rng(0).uniform(-8, 8, (5, 32)), jnp.float32))
  fn = _randomize_bits(jit, 2.0, rng_bits=rng_bits)
  a = fn(jax.random.key(0), bits)
  b = fn(jax.random.key(0), bits)
  c = fn(jax.random.key(1), bits)
  np.testing.assert_array_equal(a, b)
  assert (np.asarray(a) != np.asarray(c)).mean() > 0.1
  other = _randomize_bits(not jit, 2.0, rng_bits=rng_bits)(jax.random.key(0), bits)
  np.testing.assert_array_equal(a, other)
  assert a.dtype == jnp.uint8 and a.shape == bits.shape


def test_traced_epsilon_matches_static_epsilon():
  bits = jnp.zeros((20, 64, 10), jnp.uint8)
  key = jax.random.key(4)
  static = bitrand.randomize_bits(key, bits, 3.0)
  traced = jax.jit(bitrand.randomize_bits)(key, bits, jnp.float32(3.0))
  # float32 thresholds move by at most a few units in 2**32: essentially never visible
  assert (np.asarray(static) != np.asarray(traced)).mean() < 1e-4


def test_vmap_over_keys_matches_a_loop():
  x = jnp.asarray(np.random.default_rng(1).uniform(0, 8, (3, 4, 16)), jnp.float32)
  keys = jax.random.split(jax.random.key(5), 3)
  batched = jax.vmap(lambda k, x: bitrand.randomize(k, x, 2.0))(keys, x)
  for i in range(3):
    np.testing.assert_array_equal(batched[i], bitrand.randomize(keys[i], x[i], 2.0))


@pytest.mark.parametrize('honour_sign', [True, False])
def test_randomize_without_noise_is_quantisation(honour_sign):
  x = jnp.asarray(np.random.default_rng(2).uniform(-40, 40, (4, 50)), jnp.float32)
  y = bitrand.randomize(jax.random.key(0), x, 1.0, alpha=1e-12, honour_sign=honour_sign)
  bits, _ = fixed_point.encode(x)
  np.testing.assert_array_equal(y, fixed_point.decode(bits, honour_sign=honour_sign))
  if not honour_sign:
    assert (np.asarray(y) >= 0).all()


@pytest.mark.parametrize('honour_sign', [True, False])
def test_randomize_mean_matches_flip_model(honour_sign):
  """E[decoded] = sum_k w_k E[b'_k] with E[b'_k] = b_k (1 - q_k) + (1 - b_k) q_k."""
  eps, r, n = 5.0, 64, 4000
  x = jnp.asarray(np.random.default_rng(3).uniform(-20, 20, (r,)), jnp.float32)
  ys = np.asarray(bitrand.randomize(jax.random.key(9), jnp.broadcast_to(x, (n, r)), eps,
                                    honour_sign=honour_sign))
  bits = np.asarray(fixed_point.encode(x)[0], np.float64)
  q = bitrand.flip_probabilities(eps, r, 10)
  p1 = bits * (1 - q) + (1 - bits) * q
  w = np.asarray(fixed_point.bit_weights(), np.float64)
  if honour_sign:  # sign and magnitude bits are independent
    want = (1 - 2 * p1[:, 0]) * (p1 @ w)
  else:
    want = p1 @ w
  sd = ys.std(axis=0, ddof=1)
  z = (ys.mean(axis=0) - want) / (sd / math.sqrt(n))
  assert np.abs(z).max() < sp_stats.norm.ppf(1 - 0.001 / (2 * r))


def test_num_features_sets_alpha():
  bits = jnp.zeros((200, 8, 10), jnp.uint8)
  small = bitrand.randomize_bits(jax.random.key(0), bits, 1.0)
  large = bitrand.randomize_bits(jax.random.key(0), bits, 1.0, num_features=512)
  assert bitrand.alpha(1.0, 8, 10) > bitrand.alpha(1.0, 512, 10)
  assert np.asarray(small).mean() > np.asarray(large).mean()


@pytest.mark.parametrize('eps', [0.0, -1.0, float('nan'), float('inf')])
def test_bad_epsilon_raises_config_error(eps):
  with pytest.raises(validate.ConfigError) as e:
    bitrand.randomize_bits(jax.random.key(0), jnp.zeros((2, 10), jnp.uint8), eps)
  assert e.value.field == 'epsilon'


def test_bad_alpha_raises_config_error():
  with pytest.raises(validate.ConfigError) as e:
    bitrand.flip_probabilities(1.0, 8, 10, alpha=0.0)
  assert e.value.field == 'alpha'


def test_bad_rng_bits_raises_config_error():
  with pytest.raises(validate.ConfigError) as e:
    bitrand.randomize(jax.random.key(0), jnp.zeros((2, 3)), 1.0, rng_bits=8)
  assert e.value.field == 'rng_bits'


@pytest.mark.parametrize('rng_bits', [None, 32, 16])
def test_bit_probabilities_and_pair_epsilon_follow_the_flip_probabilities(rng_bits):
  # Eq. (23) read bit by bit: a 0 becomes 1 with q_k, a 1 stays 1 with 1 - q_k; a pair's
  # epsilon is the sum of per_bit_epsilon over the bits in which the encodings differ.
  eps, r, l = 2.0, 4, 6
  rng = np.random.default_rng(1)
  bits = rng.integers(0, 2, size=(2, r, l)).astype(np.uint8)
  q = np.asarray(bitrand.flip_probabilities(eps, r, l), np.float64)
  if rng_bits is not None:
    q = bitrand.effective_probabilities(q, rng_bits)
  got = bitrand.bit_one_probabilities(bits, eps, rng_bits=rng_bits)
  np.testing.assert_array_equal(got, np.where(bits == 1, 1.0 - q, q))
  per_bit = np.broadcast_to(bitrand.per_bit_epsilon(eps, r, l, rng_bits=rng_bits), (r, l))
  assert bitrand.pair_epsilon(bits[0], bits[1], eps, rng_bits=rng_bits) == pytest.approx(
      float(np.sum(per_bit[bits[0] != bits[1]])))
  everything = bitrand.pair_epsilon(np.zeros((r, l)), np.ones((r, l)), eps, rng_bits=rng_bits)
  assert everything == pytest.approx(
      bitrand.claimed_vs_implied(eps, r, l, rng_bits=rng_bits)['per_vector'])
