"""Mechanisms as optax-style (init, update) pairs, chosen by config name (`registry`).

A `Mechanism` bundles a stateless randomizer `randomize(key, x) -> x'` (what a jitted game
calls with its own fold_in keys) and the stateful pair `init(key) -> MechanismState`,
`update(x, state) -> (x', state)`, whose state carries the PRNG key and splits it on every
call so that no key serves two draws. `x` may be an array or a pytree; leaf i of a pytree is
randomized with `jax.random.fold_in(key, i)`.

Example:
  >>> import jax.numpy as jnp
  >>> mech = make('bitrand', epsilon=5.0)
  >>> state = mech.init(jax.random.key(0))
  >>> y, state = mech.update(jnp.ones((4, 16)), state)
  >>> y.shape
  (4, 16)
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax

from fl_privacy.mechanisms import bitrand
from fl_privacy.mechanisms import ome
from fl_privacy.mechanisms import registry

# The input mechanisms of `mechanisms.registry` (LDP-SGD randomizes gradients, not inputs).
MECHANISMS = registry.INPUT_MECHANISMS


class MechanismState(NamedTuple):
  """What a mechanism carries between calls: the key for the next draw."""
  rng_key: jax.Array


class Mechanism(NamedTuple):
  """A randomizer and its (init, update) pair.

  Attributes:
    name: one of `MECHANISMS`.
    randomize: `(key, x) -> x'`, pure.
    init: `(key) -> MechanismState`.
    update: `(x, state) -> (x', state')`.
  """
  name: str
  randomize: Callable[[jax.Array, Any], Any]
  init: Callable[[jax.Array], MechanismState]
  update: Callable[[Any, MechanismState], tuple[Any, MechanismState]]


def _per_leaf(fn: Callable[[jax.Array, jax.Array], jax.Array]):
  def randomize(key: jax.Array, x: Any) -> Any:
    leaves, tree = jax.tree_util.tree_flatten(x)
    out = [fn(jax.random.fold_in(key, i), leaf) for i, leaf in enumerate(leaves)]
    return jax.tree_util.tree_unflatten(tree, out)
  return randomize


def _stateful(name: str, randomize: Callable[[jax.Array, Any], Any]) -> Mechanism:
  def init(key: jax.Array) -> MechanismState:
    return MechanismState(rng_key=key)

  def update(x: Any, state: MechanismState) -> tuple[Any, MechanismState]:
    next_key, key = jax.random.split(state.rng_key)
    return randomize(key, x), MechanismState(rng_key=next_key)

  return Mechanism(name=name, randomize=randomize, init=init, update=update)


def identity_transform() -> Mechanism:
  """No randomization: `x' = x` (the state's key still advances)."""
  return _stateful('none', lambda key, x: x)


def bitrand_transform(epsilon: float, *, int_bits: int = 5, frac_bits: int = 4,
                      sign_bit: bool = True, honour_sign: bool = True,
                      num_features: int | None = None, alpha: float | None = None,
                      rng_bits: int = 32) -> Mechanism:
  """BitRand on real features [..., d] (Eq. (23) of the AMI paper); see `bitrand.randomize`."""
  bitrand.check_epsilon(epsilon)
  bitrand.check_rng_bits(rng_bits)
  fn = registry.randomizer('bitrand', epsilon=epsilon, int_bits=int_bits, frac_bits=frac_bits,
                           sign_bit=sign_bit, honour_sign=honour_sign,
                           num_features=num_features, alpha=alpha, rng_bits=rng_bits)
  return _stateful('bitrand', _per_leaf(fn))


def ome_transform(epsilon: float, *, alpha: float = ome.DEFAULT_ALPHA, int_bits: int = 5,
                  frac_bits: int = 4, sign_bit: bool = True, honour_sign: bool = True,
                  num_features: int | None = None, rng_bits: int = 32) -> Mechanism:
  """OME on real features [..., d] (Eq. (22) of the AMI paper); see `ome.randomize`."""
  bitrand.check_epsilon(epsilon)
  bitrand.check_rng_bits(rng_bits)
  fn = registry.randomizer('ome', epsilon=epsilon, alpha=alpha, int_bits=int_bits,
                           frac_bits=frac_bits, sign_bit=sign_bit, honour_sign=honour_sign,
                           num_features=num_features, rng_bits=rng_bits)
  return _stateful('ome', _per_leaf(fn))


def gaussian_transform(sigma: float | None = None, *, epsilon: float | None = None,
                       delta: float | None = None, sensitivity: float = 1.0) -> Mechanism:
  """Adds N(0, sigma^2) to every entry; sigma given, or `gaussian.sigma_for(epsilon, delta,
  sensitivity)` (Appendix E of the AMI paper; a DP guarantee only for epsilon < 1)."""
  # add_noise already draws leaf i with fold_in(key, i)
  return _stateful('gaussian', registry.randomizer('gaussian', sigma=sigma, epsilon=epsilon,
                                                   delta=delta, sensitivity=sensitivity))


def make(name: str, **kwargs: Any) -> Mechanism:
  """The mechanism named `name` (one of `MECHANISMS`), built with `kwargs`.

  'none' ignores its keyword arguments, so one sweep can pass the same ones to every name.

  Raises:
    ConfigError: naming field 'mechanism' for an unknown name.
  """
  registry.spec(name, 'mechanism', MECHANISMS)
  if name == 'none':
    return identity_transform()
  builders = {'bitrand': bitrand_transform, 'ome': ome_transform,
              'gaussian': gaussian_transform}
  return builders[name](**kwargs)
