"""OME: optimized multiple encoding (Lyu et al., 2020), as in the AMI paper's Eq. (22).

Features are encoded as l bits each (`fixed_point`) and concatenated into one r*l-bit vector
per sample. Bit i of that vector outputs 1 with probability

  alpha / (1 + alpha)               if i is even and v(i) = 1,
  1 / (1 + alpha**3)                if i is odd  and v(i) = 1,
  1 / (1 + alpha e^{eps / (r l)})   if v(i) = 0.

The index i runs over the whole flattened r*l vector, as Eq. (22) writes it (i in [0, rl-1]);
the parity of a bit is then that of feature * l + k. SEED-NOTES §1 states the rule per "even /
odd position"; for even l (the default l = 10) global and within-group parity coincide, so the
two readings differ only for odd l. With l = 10, the sign bit (k = 0) sits at an even position.

With the paper's alpha = 100 a 1-bit at an odd position almost always becomes 0 and a 0-bit
becomes 1 with probability about 1 / (1 + alpha), nearly independent of eps (eps / (r l) is
tiny): this is why OME's utility and the attack's success hardly move with eps.

Formal guarantee (what the probabilities imply, `claimed_vs_implied`): a bit is
max over outputs |ln(P(o | 1) / P(o | 0))|-LDP, and the vector the sum over its bits; for
alpha = 100, eps = 1, r = 512, l = 10 that is about 35,000, not eps.

Draws compare raw threefry words with integer thresholds (`bitrand.bernoulli_below`); keep
rng_bits = 32 here: 1 / (1 + 100**3) = 1e-6 rounds to 0 with 16-bit thresholds.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy.mechanisms import bitrand
from fl_privacy.mechanisms import fixed_point

DEFAULT_ALPHA = 100.0


def output_probabilities(epsilon: float, num_bits: int, alpha: float = DEFAULT_ALPHA):
  """P(v'(i) = 1) for each case of Eq. (22) of the AMI paper.

  Args:
    epsilon: the total privacy budget eps.
    num_bits: r * l, the length of the concatenated bit vector.
    alpha: OME's alpha (the paper uses 100).

  Returns:
    [2, 2] array indexed [parity of i (0 even, 1 odd), v(i)] (numpy float64 for concrete
    inputs, else jax).
  """
  bitrand.check_epsilon(epsilon)
  bitrand.check_epsilon(alpha, field='alpha')  # same rule: finite and > 0
  concrete = bitrand.is_static(epsilon) and bitrand.is_static(alpha)
  xp = np if concrete else jnp
  one_even = alpha / (1.0 + alpha)
  one_odd = 1.0 / (1.0 + alpha**3)
  zero = 1.0 / (1.0 + alpha * xp.exp(epsilon / num_bits))
  return xp.stack([xp.stack([zero, one_even * xp.ones_like(zero)]),
                   xp.stack([zero, one_odd * xp.ones_like(zero)])])


def flip_probabilities(epsilon: float, num_bits: int, alpha: float = DEFAULT_ALPHA):
  """P(v'(i) != v(i)) for each case of Eq. (22): [2, 2] indexed [parity of i, v(i)].

  Unlike BitRand, OME is not a symmetric flip: a 0 becomes 1 with probability
  1 / (1 + alpha e^{eps / (r l)}) at every position, while a 1 becomes 0 with probability
  1 / (1 + alpha) at even and alpha**3 / (1 + alpha**3) at odd positions.
  """
  p = output_probabilities(epsilon, num_bits, alpha)
  xp = np if isinstance(p, np.ndarray) else jnp
  return xp.stack([p[:, 0], 1.0 - p[:, 1]], axis=1)


def odd_positions(num_features: int, bits_per_feature: int) -> np.ndarray:
  """Whether bit (feature, k) has an odd index i = feature * l + k in the r*l vector, [r, l]."""
  i = np.arange(num_features * bits_per_feature).reshape(num_features, bits_per_feature)
  return (i % 2).astype(bool)


def per_bit_epsilon(epsilon: float, num_features: int, bits_per_feature: int,
                    alpha: float = DEFAULT_ALPHA, rng_bits: int | None = None) -> np.ndarray:
  """max over outputs o of |ln(P(o | v=1) / P(o | v=0))| per bit, [r, l].

  Args:
    epsilon: eps of Eq. (22).
    num_features: r.
    bits_per_feature: l.
    alpha: OME's alpha.
    rng_bits: None for the exact probabilities of Eq. (22); 32 or 16 for those the
      integer-threshold draw realises (inf where one rounds to 0 or 1).
  """
  p = np.asarray(output_probabilities(epsilon, num_features * bits_per_feature, alpha),
                 np.float64)
  if rng_bits is not None:
    p = bitrand.effective_probabilities(p, rng_bits)
  with np.errstate(divide='ignore'):
    one = np.abs(np.log(p[:, 1]) - np.log(p[:, 0]))
    zero = np.abs(np.log1p(-p[:, 1]) - np.log1p(-p[:, 0]))
  by_parity = np.maximum(one, zero)
  return by_parity[odd_positions(num_features, bits_per_feature).astype(int)]


def bit_one_probabilities(bits, epsilon: float, alpha: float = DEFAULT_ALPHA,
                          rng_bits: int | None = None) -> np.ndarray:
  """P(output bit = 1 | input bit) for every bit of encodings `bits` [..., r, l] (Eq. (22)).

  Args:
    bits: {0, 1} [..., r, l] inputs; each sample's r*l bits form the vector whose index
      parity Eq. (22) uses.
    epsilon: eps of Eq. (22).
    alpha: OME's alpha.
    rng_bits: None for the exact probabilities; 32 or 16 for those the integer-threshold draw
      realises (what `randomize_bits` draws with).

  Returns:
    float64 [..., r, l].
  """
  bits = np.asarray(bits)
  r, l = bits.shape[-2], bits.shape[-1]
  p = np.asarray(output_probabilities(epsilon, r * l, alpha), np.float64)
  if rng_bits is not None:
    p = bitrand.effective_probabilities(p, rng_bits)
  return p[odd_positions(r, l).astype(int), bits.astype(int)]


def pair_epsilon(bits0, bits1, epsilon: float, alpha: float = DEFAULT_ALPHA,
                 rng_bits: int | None = None) -> float:
  """The LDP epsilon OME implies between two encoded inputs [r, l].

  Bits are randomized independently, so it is the sum of `per_bit_epsilon` over the bits in
  which the two inputs differ (tight for that pair).
  """
  bits0, bits1 = np.asarray(bits0), np.asarray(bits1)
  per_bit = per_bit_epsilon(epsilon, bits0.shape[-2], bits0.shape[-1], alpha,
                            rng_bits=rng_bits)
  return float(np.sum(np.where(bits0 != bits1, per_bit, 0.0)))


def claimed_vs_implied(epsilon: float, num_features: int, bits_per_feature: int,
                       alpha: float = DEFAULT_ALPHA,
                       rng_bits: int | None = None) -> dict[str, Any]:
  """Compares the eps of Eq. (22) with the LDP epsilon its probabilities imply.

  Returns:
    dict with `claimed`, `alpha`, `rng_bits`, `per_parity` ([even, odd] epsilon of one bit)
    and `per_vector` (sum over the r*l independent bits: any two inputs).
  """
  per_bit = per_bit_epsilon(epsilon, num_features, bits_per_feature, alpha, rng_bits)
  odd = odd_positions(num_features, bits_per_feature)
  even_eps = float(per_bit[~odd][0]) if (~odd).any() else float('nan')
  odd_eps = float(per_bit[odd][0]) if odd.any() else float('nan')
  return {
      'claimed': float(epsilon),
      'alpha': float(alpha),
      'rng_bits': rng_bits,
      'per_parity': [even_eps, odd_eps],
      'per_vector': float(np.sum(per_bit)),
  }


def randomize_bits(key: jax.Array, bits: jax.Array, epsilon: float,
                   alpha: float = DEFAULT_ALPHA, *, num_features: int | None = None,
                   rng_bits: int = 32) -> jax.Array:
  """Randomizes an encoded vector with OME's probabilities (Eq. (22) of the AMI paper).

  Args:
    key: a typed PRNG key; one call uses it for one draw.
    bits: {0, 1} uint8 [..., d, l]; leading axes are batch axes, and each sample's d*l bits
      form the concatenated vector whose index parity Eq. (22) uses.
    epsilon: the total privacy budget eps.
    alpha: OME's alpha (the paper uses 100).
    num_features: r in eps / (r l); None takes d = bits.shape[-2].
    rng_bits: 32 (default; see the module docstring) or 16.

  Returns:
    uint8 array like `bits`.
  """
  d, l = bits.shape[-2], bits.shape[-1]
  r = d if num_features is None else num_features
  t = bitrand.thresholds(output_probabilities(epsilon, r * l, alpha), rng_bits)
  t = jnp.asarray(t, jnp.uint32)
  odd = jnp.asarray(odd_positions(d, l))
  threshold = jnp.where(bits == 1, jnp.where(odd, t[1, 1], t[0, 1]), t[0, 0])
  return bitrand.bernoulli_below(key, threshold, bits.shape, rng_bits).astype(jnp.uint8)


def randomize(key: jax.Array, x: jax.Array, epsilon: float, alpha: float = DEFAULT_ALPHA,
              *, int_bits: int = 5, frac_bits: int = 4, sign_bit: bool = True,
              honour_sign: bool = True, num_features: int | None = None,
              rng_bits: int = 32) -> jax.Array:
  """OME on real features: encode, randomize (Eq. (22) of the AMI paper), decode.

  Args:
    key: a typed PRNG key.
    x: real features [..., d]; leading axes are batch axes.
    epsilon: the total privacy budget eps.
    alpha: OME's alpha (the paper uses 100).
    int_bits, frac_bits, sign_bit: the fixed-point format (default 1 + 5 + 4 = 10 bits).
    honour_sign: False reproduces the public code, whose decoder ignores the sign bit.
    num_features: r in eps / (r l); None takes d.
    rng_bits: 32 or 16.

  Returns:
    float32 [..., d].
  """
  bits, _ = fixed_point.encode(x, int_bits, frac_bits, sign_bit)
  noisy = randomize_bits(key, bits, epsilon, alpha, num_features=num_features,
                         rng_bits=rng_bits)
  return fixed_point.decode(noisy, int_bits, frac_bits, sign_bit, honour_sign)
