"""Fixed-point bit encoding of real feature vectors, the input of BitRand and OME.

A feature x becomes `l = sign_bit + int_bits + frac_bits` bits: an optional sign bit, then
the magnitude code `round(|x| * 2**frac_bits)` written most significant bit first. The AMI
paper's public code uses 1 + 5 + 4 = 10 bits per feature (range [0, 31.9375], quantum 1/16).

Bit order matters to BitRand, whose flip probability grows with the position k of a bit in
its l-bit group (Eq. (23) of the AMI paper, Nguyen et al.): k = 0 is the sign bit (when
present), k = l - 1 the least significant bit.

Magnitudes above the largest code are clipped to it and counted, never wrapped around (the
public code's string encoding overflows for values >= 32). Without a sign bit, negative
values cannot be written: they encode as 0 and are counted as clipped unless they round to 0.

The public code decodes the sign bit by comparing a character with a byte, so it never takes
effect: every decoded value is >= 0 and flips of the sign bit change nothing. `decode(...,
honour_sign=False)` reproduces that behaviour so both numbers can be reported.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fl_privacy import validate

# Codes are held in int32; one bit of headroom keeps `max_code + 1` representable.
_MAX_MAGNITUDE_BITS = 30


def check_format(int_bits: int, frac_bits: int, section: str = '') -> None:
  """Raises `ConfigError` unless the fixed-point format is representable.

  Args:
    int_bits: number of integer bits, >= 0.
    frac_bits: number of fractional bits, >= 0.
    section: the config section holding the two fields (e.g. 'ldp_audit'), so the error
      names `config.<section>.int_bits`; '' for bare field names.
  """
  prefix = f'{section}.' if section else ''
  for field, value in (('int_bits', int_bits), ('frac_bits', frac_bits)):
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    validate.require(ok, prefix + field, 'an integer >= 0', value)
  total = int_bits + frac_bits
  validate.require(1 <= total <= _MAX_MAGNITUDE_BITS, prefix + 'int_bits',
                   f'such that 1 <= int_bits + frac_bits <= {_MAX_MAGNITUDE_BITS}',
                   (int_bits, frac_bits))


def bits_per_feature(int_bits: int = 5, frac_bits: int = 4,
                     sign_bit: bool = True) -> int:
  """The number l of bits one feature occupies."""
  return int(sign_bit) + int_bits + frac_bits


def max_value(int_bits: int = 5, frac_bits: int = 4) -> float:
  """The largest magnitude the format can hold: (2**(int+frac) - 1) / 2**frac."""
  return (2**(int_bits + frac_bits) - 1) / 2**frac_bits


def quantum(frac_bits: int = 4) -> float:
  """The spacing of representable values, 2**-frac_bits."""
  return 2.0**-frac_bits


def encode(x: jax.Array, int_bits: int = 5, frac_bits: int = 4,
           sign_bit: bool = True) -> tuple[jax.Array, jax.Array]:
  """Encodes real features as fixed-point bits (sign, then most to least significant).

  Args:
    x: real array [..., d].
    int_bits: integer bits of the magnitude.
    frac_bits: fractional bits of the magnitude.
    sign_bit: whether bit 0 of each group holds the sign (1 = negative).

  Returns:
    `(bits, num_clipped)`: `bits` uint8 [..., d, l] with l = `bits_per_feature(...)`;
    `num_clipped` int32 scalar, how many entries of x fell outside the representable
    range (including NaN, which encodes as 0, and +-inf, which clip to the largest code).

  Example:
    >>> bits, n = encode(jnp.array([-1.5, 40.0]), 5, 4)
    >>> decode(bits, 5, 4).tolist(), int(n)
    ([-1.5, 31.9375], 1)
  """
  check_format(int_bits, frac_bits)
  x = jnp.asarray(x, jnp.float32)
  num_magnitude_bits = int_bits + frac_bits
  max_code = 2**num_magnitude_bits - 1
  is_nan = jnp.isnan(x)
  magnitude = jnp.abs(x) if sign_bit else x
  scaled = jnp.round(jnp.where(is_nan, 0.0, magnitude) * 2.0**frac_bits)
  clipped = is_nan | (scaled > max_code) | (scaled < 0)
  code = jnp.clip(scaled, 0, max_code).astype(jnp.int32)
  shifts = jnp.arange(num_magnitude_bits - 1, -1, -1, dtype=jnp.int32)
  magnitude_bits = (code[..., None] >> shifts) & 1
  if sign_bit:
    negative = (x < 0)[..., None].astype(jnp.int32)
    magnitude_bits = jnp.concatenate([negative, magnitude_bits], axis=-1)
  return magnitude_bits.astype(jnp.uint8), jnp.sum(clipped, dtype=jnp.int32)


# Jitted with the format static: called eagerly (the pipelines' setup, certification,
# copies), its dozen ops would otherwise each compile once per input shape (about 60 eager
# XLA compilations of the AMI main job). Wrapped here rather than decorated, so that mutation
# testing (mutmut skips decorated functions) still reaches the body.
encode = jax.jit(encode, static_argnames=('int_bits', 'frac_bits', 'sign_bit'))


def bit_weights(int_bits: int = 5, frac_bits: int = 4,
                sign_bit: bool = True) -> jax.Array:
  """The value of each magnitude bit of a group (0 for the sign bit), float32 [l]."""
  exponents = jnp.arange(int_bits - 1, -frac_bits - 1, -1, dtype=jnp.float32)
  weights = 2.0**exponents
  if sign_bit:
    weights = jnp.concatenate([jnp.zeros((1,), jnp.float32), weights])
  return weights


def decode(bits: jax.Array, int_bits: int = 5, frac_bits: int = 4,
           sign_bit: bool = True, honour_sign: bool = True) -> jax.Array:
  """Decodes fixed-point bits back to real features.

  Args:
    bits: {0, 1} array [..., d, l] as written by `encode` (any integer or bool dtype).
    int_bits: integer bits of the magnitude.
    frac_bits: fractional bits of the magnitude.
    sign_bit: whether bit 0 of each group is a sign bit.
    honour_sign: if False, ignore the sign bit as the AMI paper's public code does (every
      decoded value is >= 0 and sign-bit flips have no effect).

  Returns:
    float32 [..., d].
  """
  check_format(int_bits, frac_bits)
  l = bits_per_feature(int_bits, frac_bits, sign_bit)
  if bits.shape[-1] != l:
    raise ValueError(f'bits has {bits.shape[-1]} bits per feature; the format '
                     f'({int(sign_bit)} + {int_bits} + {frac_bits}) has {l}')
  b = bits.astype(jnp.float32)
  # Exact for int_bits + frac_bits <= 24 (float32 significand); HIGHEST keeps TF32 from
  # rounding on GPUs.
  magnitude = jnp.matmul(b, bit_weights(int_bits, frac_bits, sign_bit),
                         precision=jax.lax.Precision.HIGHEST)
  if sign_bit and honour_sign:
    magnitude = magnitude * (1.0 - 2.0 * b[..., 0])
  return magnitude


decode = jax.jit(decode, static_argnames=('int_bits', 'frac_bits', 'sign_bit', 'honour_sign'))


def decode_pattern(pattern: jax.Array, int_bits: int = 5, frac_bits: int = 4,
                   sign_bit: bool = True, honour_sign: bool = True) -> jax.Array:
  """Decodes codes held as integers: the l bits of a feature packed MSB first (bit 0 on top).

  The same rule as `decode` on the unpacked bits (`codes.codes_to_values` packs a feature's
  bit groups into this integer and decodes it here): the magnitude is the low
  int_bits + frac_bits bits times 2**-frac_bits, exact in float32 for up to 24 bits; the top bit
  is the sign when `sign_bit` and `honour_sign`.

  Args:
    pattern: uint32 [...], one integer per feature.
    int_bits, frac_bits, sign_bit, honour_sign: as in `decode`.

  Returns:
    float32 [...].
  """
  check_format(int_bits, frac_bits)
  magnitude_bits = int_bits + frac_bits
  pattern = pattern.astype(jnp.uint32)
  magnitude = (pattern & ((1 << magnitude_bits) - 1)).astype(jnp.float32) * quantum(frac_bits)
  if not (sign_bit and honour_sign):
    return magnitude
  negative = ((pattern >> magnitude_bits) & 1) == 1
  return jnp.where(negative, -magnitude, magnitude)
