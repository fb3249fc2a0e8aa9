"""A fast, exact-in-distribution sampler for bitwise LDP channels over fixed-point codes.

Used by the AMI game (Nguyen et al., AISTATS 2023) to randomize whole batches of fixed-point
encoded features: one 32-bit word draws a group of up to 5 output bits by inverse CDF instead
of one Bernoulli per bit. Every output code's probability is within 2**-32 of the
mechanism's (1.5 * 2**-32 next to a CDF capped at 1 - 2**-32, the largest uint32 threshold);
`channel_from_bit_probs` computes and reports the exact total-variation gap.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy.mechanisms import bitrand
from fl_privacy.mechanisms import fixed_point
from fl_privacy.mechanisms import ome
from fl_privacy.mechanisms import registry

# The public code's sign bit + 5 integer + 4 fractional bits; 5-bit groups keep the per-group
# inverse-CDF tables at 32 x 31 thresholds.
DEFAULT_GROUP_SIZE = 5

MECHANISMS = ('none', 'bitrand', 'ome')

Array = jax.Array

# ----------------------------------------------------------------------------------------------
# A fast, exact-in-distribution sampler for bitwise LDP channels over fixed-point codes.


@dataclasses.dataclass(frozen=True)
class Encoding:
  """Fixed-point encoding of a feature (the public code's 1 + 5 + 4 bits by default).

  Attributes:
    int_bits: integer bits.
    frac_bits: fractional bits (quantum 2**-frac_bits).
    sign_bit: whether bit 0 is a sign bit.
    honour_sign: decode the sign bit (False reproduces the public code, which drops it).
  """
  int_bits: int = 5
  frac_bits: int = 4
  sign_bit: bool = True
  honour_sign: bool = True

  @property
  def num_bits(self) -> int:
    return self.int_bits + self.frac_bits + int(self.sign_bit)

  @property
  def max_value(self) -> float:
    return (2 ** (self.int_bits + self.frac_bits) - 1) / 2 ** self.frac_bits

  @property
  def min_value(self) -> float:
    return -self.max_value if (self.sign_bit and self.honour_sign) else 0.0

  def group_sizes(self, group_size: int = DEFAULT_GROUP_SIZE) -> tuple[int, ...]:
    n, sizes = self.num_bits, []
    while n > 0:
      sizes.append(min(group_size, n))
      n -= sizes[-1]
    return tuple(sizes)


def pack_codes(bits: Array, group_sizes: Sequence[int]) -> Array:
  """Packs bits [..., d, l] (bit 0 first) into per-group integers [..., d, G], MSB first."""
  bits = jnp.asarray(bits, jnp.uint32)
  out, start = [], 0
  for n in group_sizes:
    weights = jnp.asarray([1 << (n - 1 - i) for i in range(n)], jnp.uint32)
    out.append(jnp.sum(bits[..., start:start + n] * weights, axis=-1, dtype=jnp.uint32))
    start += n
  return jnp.stack(out, axis=-1)


def unpack_codes(codes: Array, group_sizes: Sequence[int]) -> Array:
  """Inverse of `pack_codes`: [..., d, G] -> bits [..., d, l] (uint8)."""
  out = []
  for g, n in enumerate(group_sizes):
    shifts = jnp.asarray([n - 1 - i for i in range(n)], jnp.uint32)
    out.append((codes[..., g, None] >> shifts) & 1)
  return jnp.concatenate(out, axis=-1).astype(jnp.uint8)


def codes_to_values(codes: Array, group_sizes: Sequence[int], encoding: Encoding) -> Array:
  """Decodes per-group codes to feature values (`mechanisms.fixed_point.decode_pattern`).

  Args:
    codes: [..., d, G] uint32 group codes.
    group_sizes: bits per group (sum = encoding.num_bits).
    encoding: the fixed-point encoding.

  Returns:
    [..., d] float32 values.
  """
  pattern = jnp.zeros(codes.shape[:-1], jnp.uint32)
  for g, n in enumerate(group_sizes):
    pattern = (pattern << n) | codes[..., g]
  return fixed_point.decode_pattern(pattern, encoding.int_bits, encoding.frac_bits,
                                    encoding.sign_bit, encoding.honour_sign)


class CodeChannel(NamedTuple):
  """Inverse-CDF tables of a bitwise LDP channel, one table per bit group.

  A table has one row per input code (or a single row of flip patterns when the channel is
  flip-symmetric, as BitRand is: P(out = u XOR f | u) independent of u); row entries are the
  cumulative probabilities of output codes 0 .. 2**n - 2 as integer multiples of 2**-32.

  Attributes:
    thresholds: per group, uint32 [rows, 2**n - 1].
    xor: per group, whether the table holds flip patterns (one row).
    tv_per_feature: upper bound on the total-variation distance between the realized and the
      exact channel of one feature (sum over groups of each group's worst-case TV).
  """
  thresholds: tuple
  xor: tuple
  tv_per_feature: float


def channel_from_bit_probs(p_one: np.ndarray, group_sizes: Sequence[int]) -> CodeChannel:
  """Builds the per-group inverse-CDF tables from per-bit output probabilities.

  Bits are randomized independently (true of BitRand, Eq. 23, and OME, Eq. 22, of the AMI
  paper), so the law of a group of n output bits given its n input bits is the product of the
  per-bit laws; drawing one 32-bit word per group by inverse CDF realizes every output code's
  probability as an integer multiple of 2**-32 within 2**-32 of the exact value (within
  1.5 * 2**-32 where a cumulative probability of 1 - 2**-33 or more is capped at the largest
  uint32 threshold, 1 - 2**-32). The exact worst-case TV of the realized channel is computed
  in float64 and returned.

  Args:
    p_one: [l, 2] float64, p_one[k, u] = P(output bit k = 1 | input bit k = u).
    group_sizes: bits per group, summing to l.

  Returns:
    The `CodeChannel`.
  """
  p_one = np.asarray(p_one, np.float64)
  if p_one.shape != (sum(group_sizes), 2):
    raise ValueError(f'p_one must be [{sum(group_sizes)}, 2], got {p_one.shape}')
  flip_symmetric = bool(np.allclose(p_one[:, 1], 1.0 - p_one[:, 0], rtol=0, atol=1e-15))
  tables, xors, tv, start = [], [], 0.0, 0
  scale = 2.0 ** 32
  for n in group_sizes:
    p = p_one[start:start + n]
    start += n
    size = 1 << n
    bits = (np.arange(size)[:, None] >> np.arange(n - 1, -1, -1)[None, :]) & 1  # [codes, n]
    inputs = bits[:1] if flip_symmetric else bits
    # probs[u, o] = prod_k P(out_k = o_k | in_k = u_k); in the flip form u = 0 and o = flips.
    one = p[np.arange(n)[None, :], inputs]  # [rows, n]
    probs = np.prod(np.where(bits[None, :, :] == 1, one[:, None, :], 1.0 - one[:, None, :]),
                    axis=-1)
    cdf = np.cumsum(probs, axis=-1)[:, :-1]
    thresholds = np.minimum(np.round(cdf * scale), scale - 1).astype(np.uint64)
    edges = np.concatenate([np.zeros((len(inputs), 1)), thresholds.astype(np.float64),
                            np.full((len(inputs), 1), scale)], axis=-1)
    realized = np.diff(edges, axis=-1) / scale
    tv += float(np.max(0.5 * np.sum(np.abs(realized - probs), axis=-1)))
    tables.append(thresholds.astype(np.uint32))
    xors.append(flip_symmetric)
  return CodeChannel(thresholds=tuple(tables), xor=tuple(xors), tv_per_feature=tv)


def bit_probabilities(mechanism: str, epsilon: float, num_features: int,
                      encoding: Encoding) -> np.ndarray | None:
  """p_one[k, u] = P(output bit k = 1 | input bit k = u) of an LDP mechanism, [l, 2].

  Read from the mechanisms' own probability functions (`bitrand.flip_probabilities`, Eq. 23;
  `ome.output_probabilities`, Eq. 22). Returns None when the law of a bit depends on more than
  its position within the feature (OME with an odd l, whose parity runs over the whole r*l
  vector): callers then use the mechanism itself.
  """
  l = encoding.num_bits
  if mechanism == 'bitrand':
    q = np.asarray(bitrand.flip_probabilities(epsilon, num_features, l), np.float64)
    return np.stack([q, 1.0 - q], axis=1)
  if mechanism == 'ome':
    if l % 2:
      return None
    probs = np.asarray(ome.output_probabilities(epsilon, num_features * l), np.float64)
    return probs[np.arange(l) % 2]  # [parity, input] -> [k, input]
  raise ValueError(f'no bitwise channel for mechanism {mechanism!r}')


def mechanism_fn(mechanism: str, epsilon: float | None, num_features: int,
                 encoding: Encoding) -> Callable[[Array, Array], Array]:
  """The client's randomizer `(key, x) -> x'` from `mechanisms.registry` (exact draws)."""
  if mechanism not in MECHANISMS:
    raise ValueError(f'mechanism must be one of {MECHANISMS} (got {mechanism!r})')
  if mechanism == 'none':
    return registry.as_float(registry.randomizer('none'))
  return registry.randomizer(mechanism, epsilon=epsilon, int_bits=encoding.int_bits,
                             frac_bits=encoding.frac_bits, sign_bit=encoding.sign_bit,
                             honour_sign=encoding.honour_sign, num_features=num_features)


def sample_codes(key: Array, codes: Array, thresholds: Sequence[Array],
                 xor: Sequence[bool]) -> Array:
  """Randomizes group codes [..., d, G] through the channel: one uint32 draw per group.

  Args:
    key: PRNG key (used once).
    codes: [..., d, G] uint32 input codes.
    thresholds: `CodeChannel.thresholds` (as arrays; may be traced).
    xor: `CodeChannel.xor` (static).

  Returns:
    [..., d, G] uint32 output codes.
  """
  u = jax.random.bits(key, codes.shape, jnp.uint32)
  out = []
  for g, (table, is_xor) in enumerate(zip(thresholds, xor)):
    code = codes[..., g]
    rows = table[0] if is_xor else table[code]
    drawn = jnp.sum(u[..., g, None] >= rows, axis=-1, dtype=jnp.uint32)
    out.append(code ^ drawn if is_xor else drawn)
  return jnp.stack(out, axis=-1)


