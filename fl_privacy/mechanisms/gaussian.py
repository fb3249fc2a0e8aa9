"""The Gaussian mechanism and per-example clip-and-noise (DP-SGD), as in Appendix E of the
AMI paper (Nguyen et al.), after Abadi et al. (2016) and Dwork & Roth (2014).

Noise on a pytree draws leaf i with `jax.random.fold_in(key, i)` (leaves in
`jax.tree_util` order), so no key serves two draws.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from fl_privacy import validate

REDUCTIONS = ('mean', 'sum')


def sigma_for(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
  """The Gaussian mechanism's noise scale sqrt(2 ln(1.25 / delta)) * sensitivity / epsilon.

  Appendix E of the AMI paper uses this sigma for the DP-SGD noise on the chosen neuron's
  gradient (sensitivity = the clip norm).

  Formal guarantee: (epsilon, delta)-DP for a query of L2 sensitivity `sensitivity` only when
  epsilon < 1 (Dwork & Roth 2014, Theorem A.1). For epsilon >= 1, the range Appendix E
  evaluates (epsilon > 7.5), it is the paper's usage, not a DP guarantee; an exact
  calibration (the analytic Gaussian mechanism, Balle & Wang 2018) would differ.

  Args:
    epsilon: > 0.
    delta: in (0, 1).
    sensitivity: L2 sensitivity, > 0.

  Returns:
    sigma (absolute standard deviation; with sensitivity 1 it is the noise multiplier).

  Example:
    >>> round(sigma_for(0.5, 1e-5), 2)
    9.69
  """
  for field, value in (('epsilon', epsilon), ('sensitivity', sensitivity)):
    validate.require(math.isfinite(value) and value > 0, field, 'a finite number > 0',
                     value)
  validate.require(0 < delta < 1, 'delta', 'in (0, 1)', delta)
  return math.sqrt(2.0 * math.log(1.25 / delta)) * sensitivity / epsilon


def _leaf_keys(key: jax.Array, leaves: list[Any]) -> list[jax.Array]:
  return [jax.random.fold_in(key, i) for i in range(len(leaves))]


def add_noise(key: jax.Array, x: Any, sigma: float) -> Any:
  """Adds i.i.d. N(0, sigma^2) noise to every entry of an array or pytree.

  Args:
    key: a typed PRNG key.
    x: array or pytree of floating arrays.
    sigma: standard deviation (>= 0; a jax scalar is allowed under jit).

  Returns:
    x + noise, same structure and dtypes.
  """
  leaves, tree = jax.tree_util.tree_flatten(x)
  noisy = [
      leaf + sigma * jax.random.normal(k, jnp.shape(leaf), jnp.result_type(leaf))
      for k, leaf in zip(_leaf_keys(key, leaves), leaves)
  ]
  return jax.tree_util.tree_unflatten(tree, noisy)


def per_example_norms(g: Any) -> jax.Array:
  """L2 norm of each example's gradient over all leaves; leaves are [n, ...], returns [n]."""
  squares = [jnp.sum(jnp.reshape(leaf, (leaf.shape[0], -1))**2, axis=1)
             for leaf in jax.tree_util.tree_leaves(g)]
  return jnp.sqrt(sum(squares))


def clip_per_example(g: Any, clip_norm: float) -> tuple[Any, jax.Array]:
  """Scales each example's gradient to L2 norm <= clip_norm (Abadi et al. 2016, Alg. 1).

  Args:
    g: pytree of per-example gradients, every leaf [n, ...].
    clip_norm: C > 0.

  Returns:
    `(clipped, norms)`: the clipped pytree and the [n] norms before clipping.
  """
  norms = per_example_norms(g)
  # min(1, C / norm) without dividing by a zero norm
  scale = clip_norm / jnp.maximum(norms, clip_norm)
  clipped = jax.tree_util.tree_map(
      lambda leaf: leaf * scale.reshape((-1,) + (1,) * (leaf.ndim - 1)).astype(leaf.dtype),
      g)
  return clipped, norms


def clip_and_noise(key: jax.Array, g: Any, clip_norm: float, sigma: float, *,
                   reduce: str = 'mean') -> Any:
  """DP-SGD's private gradient: clip per example, sum, add N(0, (sigma C)^2) noise.

  Abadi et al. (2016), Algorithm 1; Appendix E of the AMI paper. `sigma` is the noise
  multiplier: the noise standard deviation on the sum is sigma * clip_norm (use
  `sigma_for(epsilon, delta)` for the paper's calibration).

  Args:
    key: a typed PRNG key.
    g: pytree of per-example gradients, every leaf [n, ...].
    clip_norm: C > 0.
    sigma: noise multiplier >= 0.
    reduce: 'mean' divides the noisy sum by n (the usual DP-SGD step); 'sum' returns it.

  Returns:
    pytree like one example of `g` (leading axis removed).
  """
  validate.require(reduce in REDUCTIONS, 'reduce', f'one of {REDUCTIONS}', reduce)
  clipped, _ = clip_per_example(g, clip_norm)
  summed = jax.tree_util.tree_map(lambda leaf: jnp.sum(leaf, axis=0), clipped)
  noisy = add_noise(key, summed, sigma * clip_norm)
  if reduce == 'sum':
    return noisy
  n = jax.tree_util.tree_leaves(g)[0].shape[0]
  return jax.tree_util.tree_map(lambda leaf: leaf / n, noisy)
