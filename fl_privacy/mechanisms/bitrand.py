"""BitRand: bit-aware randomized response on fixed-point encoded features.

BitRand (Lai et al., 2021), as used by the AMI paper (Nguyen et al., Appendix C, Eq. (23)),
encodes each of r features as l bits (`fixed_point`) and randomizes every bit of the r*l-bit
vector independently. Bit i, at position k = i % l in its group (k = 0 is the sign bit, k = l-1
the least significant bit), outputs 1 with probability

  P(v'(i) = 1 | v(i) = 1) = p_k = 1 / (1 + a e^{k eps / l}),
  P(v'(i) = 1 | v(i) = 0) = q_k = a e^{k eps / l} / (1 + a e^{k eps / l}).

Since 1 - p_k = q_k, this is a symmetric bit flip with probability q_k: the more significant a
bit, the less often it flips.

Formal guarantee (what the probabilities imply, as computed by `claimed_vs_implied`): one bit
is |ln((1 - q_k) / q_k)| = |ln a + k eps / l|-LDP, so a feature is the sum over its l positions
and the whole vector r times that. The eps of Eq. (23) only sets the spread of the flip
log-odds across positions (ln-odds(l-1) - ln-odds(0) = (l - 1) eps / l); with a from the bound
below the vector-level LDP epsilon is far larger than eps (about 2,200 for eps = 1, r = 512,
l = 10). Reports should quote both.

Drawing. Each flip compares a raw word from `jax.random.bits` with an integer threshold
round(q * 2**rng_bits): P(word < threshold) = threshold / 2**rng_bits exactly, the probability
the privacy claim then rests on (`effective_probabilities`). Large draws are made in blocks of
`BLOCK_WORDS` words (`random_words`), which keeps threefry in cache and every word exact. rng_bits = 32 is exact to 2**-32;
rng_bits = 16 uses each 32-bit word for two comparisons (about half the cost: threefry words
are what a BitRand trial spends its time on) at a resolution of 2**-16, which moves small q_k
(eps = 10: q_0 = 2.6e-4 -> 17 / 65536 = 2.59e-4) and can round a q_k to 0 (a bit that never
flips: infinite epsilon); `claimed_vs_implied(..., rng_bits=16)` says what it implies. Float
uniforms are not used: `jax.random.uniform` keeps 23 random mantissa bits, no finer than
comparing integers, and hides the realised probability.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import validate
from fl_privacy.mechanisms import fixed_point

RNG_BITS = (32, 16)
# Random words per threefry block: larger draws are made block by block (block b with key
# fold_in(key, b)) so that threefry's intermediates stay in cache. On the 2-core machine one
# 10-million-word draw ran 13 M words/s, the same in blocks of 2**14 words 75 M words/s.
BLOCK_WORDS = 1 << 14


def is_static(value: Any) -> bool:
  """Whether `value` is known at trace time (a Python or numpy number), not a jax value."""
  return isinstance(value, (int, float, np.number, np.ndarray))


def check_epsilon(epsilon: Any, field: str = 'epsilon') -> None:
  """Raises `ConfigError(field, ...)` unless a static epsilon is finite and > 0."""
  if is_static(epsilon):
    value = float(np.asarray(epsilon))
    validate.require(math.isfinite(value) and value > 0, field, 'a finite number > 0',
                     epsilon)


def check_rng_bits(rng_bits: int) -> None:
  """Raises `ConfigError` unless `rng_bits` is one of `RNG_BITS`."""
  validate.require(rng_bits in RNG_BITS, 'rng_bits', f'one of {RNG_BITS}', rng_bits)


def alpha(epsilon: float, num_features: int, bits_per_feature: int):
  """The upper bound on BitRand's temperature a (text under Eq. (23) of the AMI paper).

  a = sqrt((eps + r l) / (2 r sum_{k<l} e^{2 eps k / l})).

  Args:
    epsilon: the privacy budget eps of Eq. (23).
    num_features: r, the number of encoded features.
    bits_per_feature: l.

  Returns:
    a, a float (numpy float64) for a concrete epsilon, else a jax scalar.

  Example:
    >>> round(float(alpha(1.0, 512, 10)), 3)
    0.416
  """
  check_epsilon(epsilon)
  xp = np if is_static(epsilon) else jnp
  r, l = num_features, bits_per_feature
  k = xp.arange(l)
  total = xp.sum(xp.exp(2.0 * epsilon * k / l))
  return xp.sqrt((epsilon + r * l) / (2.0 * r * total))


# Functions below take an `alpha=` argument that shadows `alpha`.
_alpha_bound = alpha


def log_odds(epsilon: float, num_features: int, bits_per_feature: int,
             alpha: float | None = None):
  """ln(q_k / (1 - q_k)) = ln a + k eps / l per bit position k, [l] (Eq. (23))."""
  check_epsilon(epsilon)
  if alpha is not None:
    check_epsilon(alpha, field='alpha')  # same rule: finite and > 0
  xp = np if is_static(epsilon) and (alpha is None or is_static(alpha)) else jnp
  a = _alpha_bound(epsilon, num_features, bits_per_feature) if alpha is None else alpha
  k = xp.arange(bits_per_feature)
  return xp.log(a) + k * epsilon / bits_per_feature


def flip_probabilities(epsilon: float, num_features: int, bits_per_feature: int,
                       alpha: float | None = None):
  """BitRand's flip probability q_k per bit position (Eq. (23) of the AMI paper).

  q_k = a e^{k eps / l} / (1 + a e^{k eps / l}) is both P(0 -> 1) and P(1 -> 0).

  Args:
    epsilon: eps of Eq. (23).
    num_features: r.
    bits_per_feature: l.
    alpha: the temperature a; None takes the paper's bound `alpha(...)`.

  Returns:
    [l] array (numpy float64 when the inputs are concrete, else jax).
  """
  z = log_odds(epsilon, num_features, bits_per_feature, alpha)
  xp = np if isinstance(z, np.ndarray) else jnp
  return 1.0 / (1.0 + xp.exp(-z))


def thresholds(q, rng_bits: int = 32):
  """Integer thresholds round(q * 2**rng_bits), clipped to [0, 2**rng_bits - 1], as uint32.

  A raw rng_bits-bit word w is below the threshold with probability threshold / 2**rng_bits.
  """
  check_rng_bits(rng_bits)
  top = 2**rng_bits - 1
  if isinstance(q, (np.ndarray, np.number, float, int)):
    scaled = np.round(np.asarray(q, np.float64) * 2.0**rng_bits)
    return np.clip(scaled, 0, top).astype(np.uint32)
  # float32 cannot hold 2**32 - 1; the largest float32 below 2**32 is the safe ceiling.
  ceiling = float(np.nextafter(np.float32(2.0**32), np.float32(0))) if rng_bits == 32 else top
  scaled = jnp.round(jnp.asarray(q, jnp.float32) * 2.0**rng_bits)
  return jnp.clip(scaled, 0, ceiling).astype(jnp.uint32)


def effective_probabilities(q, rng_bits: int = 32):
  """The probabilities the integer-threshold draw actually realises: thresholds / 2**rng_bits.

  The privacy of a draw rests on these, not on q. Returned as float64 numpy for concrete q.
  """
  t = thresholds(q, rng_bits)
  if isinstance(t, np.ndarray):
    return t.astype(np.float64) / 2.0**rng_bits
  return t.astype(jnp.float32) / 2.0**rng_bits


def bernoulli_below(key: jax.Array, threshold: jax.Array, shape: tuple[int, ...],
                    rng_bits: int = 32) -> jax.Array:
  """Booleans of `shape`, each True with probability threshold / 2**rng_bits.

  Args:
    key: a typed PRNG key.
    threshold: uint32 thresholds broadcastable to `shape` (see `thresholds`).
    shape: output shape.
    rng_bits: 32 (one threefry word per draw) or 16 (each 32-bit word split into two 16-bit
      halves: all low halves, then all high halves).

  Returns:
    bool array of `shape`.
  """
  check_rng_bits(rng_bits)
  threshold = jnp.asarray(threshold, jnp.uint32)
  size = math.prod(shape)
  if rng_bits == 32:
    words = random_words(key, size)
  else:
    half = random_words(key, (size + 1) // 2)
    words = jnp.concatenate([half & 0xFFFF, half >> 16])[:size]
  return words.reshape(shape) < threshold


def random_words(key: jax.Array, size: int) -> jax.Array:
  """`size` uniform uint32 words, drawn in blocks of `BLOCK_WORDS` (each word exact).

  Up to one block: `jax.random.bits(key, (size,))`. Beyond: block b is
  `jax.random.bits(fold_in(key, b), (BLOCK_WORDS,))`, the blocks concatenated and cut to
  `size` (a `lax.map`, so one block's working set is live at a time). Every word is an
  independent uniform 32-bit word either way; only which words a key yields differs.
  """
  # Flat draws: on CPU, threefry over a [..., d, l] shape ran 3-4x slower than over the
  # same number of words in one axis.
  if size <= BLOCK_WORDS:
    return jax.random.bits(key, (size,), jnp.uint32)
  return _blocked_words(key, size)


def _blocked_words(key: jax.Array, size: int) -> jax.Array:
  # Jitted with the key as an argument: called eagerly (crafting copies, certification), a
  # `lax.map` over a closure of the key would be traced and compiled again at every call.
  blocks = -(-size // BLOCK_WORDS)
  words = jax.lax.map(
      lambda b: jax.random.bits(jax.random.fold_in(key, b), (BLOCK_WORDS,), jnp.uint32),
      jnp.arange(blocks, dtype=jnp.uint32))
  return words.reshape(-1)[:size]


# Jitted by rebinding, not by a decorator: mutmut skips decorated functions.
_blocked_words = jax.jit(_blocked_words, static_argnums=1)


def per_bit_epsilon(epsilon: float, num_features: int, bits_per_feature: int,
                    alpha: float | None = None, rng_bits: int | None = None):
  """The LDP epsilon of one bit at each position: |ln((1 - q_k) / q_k)|, [l].

  Args:
    epsilon: eps of Eq. (23).
    num_features: r.
    bits_per_feature: l.
    alpha: the temperature; None takes the paper's bound.
    rng_bits: None for the exact q_k of Eq. (23); 32 or 16 for the probabilities the
      integer-threshold draw realises (inf where one rounds to 0).
  """
  if rng_bits is None:
    return np.abs(np.asarray(log_odds(epsilon, num_features, bits_per_feature, alpha),
                             np.float64))
  q = effective_probabilities(
      np.asarray(flip_probabilities(epsilon, num_features, bits_per_feature, alpha),
                 np.float64), rng_bits)
  with np.errstate(divide='ignore'):
    return np.abs(np.log(q) - np.log1p(-q))


def bit_one_probabilities(bits, epsilon: float, alpha: float | None = None,
                          rng_bits: int | None = None) -> np.ndarray:
  """P(output bit = 1 | input bit) for every bit of encodings `bits` [..., r, l] (Eq. (23)).

  A 1 stays 1 with probability 1 - q_k, a 0 becomes 1 with probability q_k.

  Args:
    bits: {0, 1} [..., r, l] inputs (r features of l bits).
    epsilon: eps of Eq. (23).
    alpha: the temperature; None takes the paper's bound.
    rng_bits: None for the exact q_k; 32 or 16 for the probabilities the integer-threshold
      draw realises (`effective_probabilities`, what `randomize_bits` draws with).

  Returns:
    float64 [..., r, l].
  """
  bits = np.asarray(bits)
  q = np.asarray(flip_probabilities(epsilon, bits.shape[-2], bits.shape[-1], alpha),
                 np.float64)
  if rng_bits is not None:
    q = effective_probabilities(q, rng_bits)
  return np.where(bits == 1, 1.0 - q, q)


def pair_epsilon(bits0, bits1, epsilon: float, alpha: float | None = None,
                 rng_bits: int | None = None) -> float:
  """The LDP epsilon BitRand implies between two encoded inputs [r, l].

  Bits are randomized independently, so it is the sum of `per_bit_epsilon` over the bits in
  which the two inputs differ (tight for that pair).
  """
  bits0, bits1 = np.asarray(bits0), np.asarray(bits1)
  r, l = bits0.shape[-2], bits0.shape[-1]
  per_bit = np.broadcast_to(per_bit_epsilon(epsilon, r, l, alpha, rng_bits=rng_bits), (r, l))
  return float(np.sum(np.where(bits0 != bits1, per_bit, 0.0)))


def claimed_vs_implied(epsilon: float, num_features: int, bits_per_feature: int,
                       alpha: float | None = None,
                       rng_bits: int | None = None) -> dict[str, Any]:
  """Compares the eps of Eq. (23) with the LDP epsilon its flip probabilities imply.

  Bits are randomized independently, so the epsilon of a group (or the whole vector) is the
  sum of its bits' epsilons; it is attained by two inputs that differ in every bit, hence
  tight.

  Returns:
    dict with `claimed` (eps), `alpha`, `rng_bits`, `per_bit` ([l] list), `per_feature`
    (sum over one l-bit group: two inputs differing in one feature) and `per_vector`
    (r times that: any two inputs, the usual LDP neighbourhood of a whole sample).
  """
  a = float(_alpha_bound(epsilon, num_features, bits_per_feature)
            if alpha is None else alpha)
  per_bit = per_bit_epsilon(epsilon, num_features, bits_per_feature, a, rng_bits)
  per_feature = float(np.sum(per_bit))
  return {
      'claimed': float(epsilon),
      'alpha': a,
      'rng_bits': rng_bits,
      'per_bit': per_bit.tolist(),
      'per_feature': per_feature,
      'per_vector': num_features * per_feature,
  }


def randomize_bits(key: jax.Array, bits: jax.Array, epsilon: float, *,
                   num_features: int | None = None, alpha: float | None = None,
                   rng_bits: int = 32) -> jax.Array:
  """Flips each bit of an encoded vector with BitRand's probability (Eq. (23), AMI paper).

  Args:
    key: a typed PRNG key; one call uses it for one draw.
    bits: {0, 1} uint8 [..., d, l] (`fixed_point.encode`); leading axes are batch axes.
    epsilon: eps of Eq. (23). Pass a Python float for the exact float64 thresholds; a traced
      epsilon works with float32 thresholds (relative error <= 2**-24).
    num_features: r in the bound on a; None takes d = bits.shape[-2].
    alpha: the temperature; None takes the paper's bound.
    rng_bits: 32 or 16, see the module docstring.

  Returns:
    uint8 array like `bits`.

  One key draws the whole array, so row j's noise depends on the array's shape; for results
  that do not depend on how rows are batched, give each row (trial) its own
  `jax.random.fold_in` key and vmap.
  """
  d, l = bits.shape[-2], bits.shape[-1]
  r = d if num_features is None else num_features
  q = flip_probabilities(epsilon, r, l, alpha)
  flip = bernoulli_below(key, thresholds(q, rng_bits), bits.shape, rng_bits)
  return bits ^ flip.astype(bits.dtype)


def randomize(key: jax.Array, x: jax.Array, epsilon: float, *, int_bits: int = 5,
              frac_bits: int = 4, sign_bit: bool = True, honour_sign: bool = True,
              num_features: int | None = None, alpha: float | None = None,
              rng_bits: int = 32) -> jax.Array:
  """BitRand on real features: encode, flip bits (Eq. (23) of the AMI paper), decode.

  Values outside the fixed-point range are clipped (count them with
  `fixed_point.encode` when it matters).

  Args:
    key: a typed PRNG key.
    x: real features [..., d]; leading axes are batch axes (each row randomized afresh).
    epsilon: eps of Eq. (23).
    int_bits, frac_bits, sign_bit: the fixed-point format (default 1 + 5 + 4 = 10 bits).
    honour_sign: False reproduces the public code, whose decoder ignores the sign bit.
    num_features: r in the bound on a; None takes d.
    alpha: the temperature; None takes the paper's bound.
    rng_bits: 32 or 16.

  Returns:
    float32 [..., d].

  Example:
    >>> x = jnp.full((2, 512), 3.25)
    >>> y = randomize(jax.random.key(0), x, 10.0)
    >>> y.shape
    (2, 512)
  """
  bits, _ = fixed_point.encode(x, int_bits, frac_bits, sign_bit)
  noisy = randomize_bits(key, bits, epsilon, num_features=num_features, alpha=alpha,
                         rng_bits=rng_bits)
  return fixed_point.decode(noisy, int_bits, frac_bits, sign_bit, honour_sign)
