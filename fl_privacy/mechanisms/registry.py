"""The one name -> randomizer registry of the privacy mechanisms.

Every place that picks a mechanism by its config name goes through here: the AMI client
(`codes.mechanism_fn`), the (init, update) wrappers (`transforms.make`), the LDP audit's bit
game (`bit_randomizer`), and `fl_privacy.defenses.make`, which wraps the same randomizers as
client hooks (input mechanisms as a `batch` hook, LDP-SGD as an `upload` hook).

A spec names the mechanism's kind and builds its randomizer from keyword parameters:

| name | kind | randomizer | source |
|---|---|---|---|
| `none` | input | x -> x | |
| `bitrand` | input (bitwise) | `bitrand.randomize` | Eq. (23) of the AMI paper (Nguyen et al.) |
| `ome` | input (bitwise) | `ome.randomize` | Eq. (22) of the AMI paper (Lyu et al.'s OME) |
| `gaussian` | input | `gaussian.add_noise` | Appendix E of the AMI paper |
| `ldp_sgd` | gradient | `ldp_sgd.randomize` on a flat vector | Algorithm 1 of the LDP-audit paper |
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fl_privacy import validate
from fl_privacy.mechanisms import bitrand
from fl_privacy.mechanisms import gaussian
from fl_privacy.mechanisms import ldp_sgd
from fl_privacy.mechanisms import ome

Randomizer = Callable[[jax.Array, Any], Any]


class MechanismSpec(NamedTuple):
  """One registered mechanism.

  Attributes:
    name: the config name.
    kind: 'input' (randomizes features [..., d]) or 'gradient' (a flat vector [..., d]).
    build: `build(**params) -> (key, x) -> x'`.
    build_bits: bitwise mechanisms only: `build_bits(epsilon, **params) -> (key, bits) ->
      bits` on fixed-point codes [..., d, l]; None otherwise.
    source: where the mechanism is defined.
  """
  name: str
  kind: str
  build: Callable[..., Randomizer]
  build_bits: Callable[..., Callable[[jax.Array, jax.Array], jax.Array]] | None
  source: str


def _none(**unused) -> Randomizer:
  del unused
  return lambda key, x: x


def _bitrand(epsilon: float, *, int_bits: int = 5, frac_bits: int = 4, sign_bit: bool = True,
             honour_sign: bool = True, num_features: int | None = None,
             alpha: float | None = None, rng_bits: int = 32) -> Randomizer:
  return lambda key, x: bitrand.randomize(
      key, x, epsilon, int_bits=int_bits, frac_bits=frac_bits, sign_bit=sign_bit,
      honour_sign=honour_sign, num_features=num_features, alpha=alpha, rng_bits=rng_bits)


def _bitrand_bits(epsilon: float, *, num_features: int | None = None,
                  alpha: float | None = None, rng_bits: int = 32):
  return lambda key, bits: bitrand.randomize_bits(key, bits, epsilon,
                                                  num_features=num_features, alpha=alpha,
                                                  rng_bits=rng_bits)


def _ome(epsilon: float, *, alpha: float | None = None, int_bits: int = 5, frac_bits: int = 4,
         sign_bit: bool = True, honour_sign: bool = True, num_features: int | None = None,
         rng_bits: int = 32) -> Randomizer:
  alpha = ome.DEFAULT_ALPHA if alpha is None else alpha
  return lambda key, x: ome.randomize(
      key, x, epsilon, alpha, int_bits=int_bits, frac_bits=frac_bits, sign_bit=sign_bit,
      honour_sign=honour_sign, num_features=num_features, rng_bits=rng_bits)


def _ome_bits(epsilon: float, *, alpha: float | None = None, num_features: int | None = None,
              rng_bits: int = 32):
  alpha = ome.DEFAULT_ALPHA if alpha is None else alpha
  return lambda key, bits: ome.randomize_bits(key, bits, epsilon, alpha,
                                              num_features=num_features, rng_bits=rng_bits)


def _gaussian(sigma: float | None = None, *, epsilon: float | None = None,
              delta: float | None = None, sensitivity: float = 1.0) -> Randomizer:
  if sigma is None:
    validate.require(epsilon is not None and delta is not None, 'sigma',
                     'given, or epsilon and delta given', sigma)
    sigma = gaussian.sigma_for(epsilon, delta, sensitivity)
  validate.require(sigma >= 0, 'sigma', 'a number >= 0', sigma)
  return lambda key, x: gaussian.add_noise(key, x, sigma)


def _ldp_sgd(epsilon: float, *, clip_norm: float) -> Randomizer:
  return lambda key, g: ldp_sgd.randomize(key, g, epsilon, clip_norm)


REGISTRY: dict[str, MechanismSpec] = {
    spec.name: spec for spec in (
        MechanismSpec('none', 'input', _none, None, 'no randomization'),
        MechanismSpec('bitrand', 'input', _bitrand, _bitrand_bits,
                      'BitRand, Eq. (23) of the AMI paper'),
        MechanismSpec('ome', 'input', _ome, _ome_bits, 'OME, Eq. (22) of the AMI paper'),
        MechanismSpec('gaussian', 'input', _gaussian, None,
                      'Gaussian mechanism, Appendix E of the AMI paper'),
        MechanismSpec('ldp_sgd', 'gradient', _ldp_sgd, None,
                      'LDP-SGD, Algorithm 1 of the LDP-audit paper'),
    )
}
NAMES = tuple(REGISTRY)
INPUT_MECHANISMS = tuple(n for n, s in REGISTRY.items() if s.kind == 'input')
BITWISE_MECHANISMS = tuple(n for n, s in REGISTRY.items() if s.build_bits is not None)


def spec(name: str, field: str = 'mechanism', allowed: tuple[str, ...] = NAMES
         ) -> MechanismSpec:
  """The spec of `name`; ConfigError naming `field` when it is not one of `allowed`."""
  validate.require(name in allowed and name in REGISTRY, field, f'one of {allowed}', name)
  return REGISTRY[name]


def randomizer(name: str, **params: Any) -> Randomizer:
  """`(key, x) -> x'` of mechanism `name` built with `params` (see each mechanism's module).

  'none' ignores its parameters, so one sweep can pass the same ones to every name.
  """
  return spec(name).build(**params)


def bit_randomizer(name: str, epsilon: float, **params: Any
                   ) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """`(key, bits) -> bits` of a bitwise mechanism on fixed-point codes [..., d, l]."""
  return spec(name, allowed=BITWISE_MECHANISMS).build_bits(epsilon, **params)


def as_float(fn: Randomizer) -> Randomizer:
  """`fn` with its input cast to float32 first (what the AMI client randomizes)."""
  return lambda key, x: fn(key, jnp.asarray(x, jnp.float32))
