"""Inverting gradients by optimisation: the honest-but-curious server's reconstruction.

Geiping, Bauermeister, Droege, Moeller, "Inverting Gradients - How easy is it to break privacy
in federated learning?" (NeurIPS 2020, arXiv:2003.14053): find inputs whose gradient points
the way the client's does (cosine similarity: magnitude carries the learning rate and the
number of steps, direction carries the data), regularised by total variation and boxed to the
data range, with Adam on the signed gradient and a step decay, best of several restarts.
Labels of a one-example upload come from the last layer's bias (Zhao, Mopuri, Bilen, "iDLG:
Improved Deep Leakage from Gradients", arXiv:2001.02610, Sect. 3): with cross-entropy,
dL/db_c = p_c - 1{c = y} is negative only at the true label.

Everything is pure and jit-able, and `invert` vmaps its restarts (and runs inside a vmapped
trial of `eval.runner.run_trials`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
from jax import flatten_util
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class Settings:
  """The optimisation (static).

  Attributes:
    steps: Adam iterations per restart (paper: 24,000 on ImageNet, 4,800 on CIFAR-10; a
      handful of pixels needs far fewer).
    learning_rate: Adam's step before decay (paper: 0.1), decayed by 10 at 3/8, 5/8, 7/8.
    tv_weight: alpha of the total-variation term (paper: 1e-4 to 1e-2 by dataset).
    restarts: independent random starts; the one with the lowest objective is kept.
  """
  steps: int = 200
  learning_rate: float = 0.1
  tv_weight: float = 1e-2
  restarts: int = 2


def idlg_label(last_bias_delta) -> jax.Array:
  """The label of a one-example upload: argmin of the last layer's bias change (iDLG, Sect. 3).

  The upload Delta = w_t - w_local is a positive multiple of the gradient after one SGD step
  (and keeps its signs over steps on one example while the prediction stays wrong), so the
  only negative entry of dL/db sits at the true label.
  """
  return jnp.argmin(jnp.asarray(last_bias_delta)).astype(jnp.int32)


def total_variation(x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """Anisotropic TV of images [N, H, W, C]: mean |horizontal| + mean |vertical| differences
  (Geiping et al.'s TV(x) in Eq. (4)), averaged over the rows `mask` marks real (all without
  one); 0 for inputs without two spatial axes."""
  if x.ndim < 4:
    return jnp.zeros((), x.dtype)
  per_row = (jnp.mean(jnp.abs(x[:, 1:] - x[:, :-1]), axis=(1, 2, 3)) +
             jnp.mean(jnp.abs(x[:, :, 1:] - x[:, :, :-1]), axis=(1, 2, 3)))
  if mask is None:
    return jnp.mean(per_row)
  return jnp.sum(per_row * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def cosine_distance(a: Any, b: Any) -> jax.Array:
  """1 - <a, b> / (||a|| ||b||) over every leaf of two gradient pytrees (Eq. (4)'s first term)."""
  fa, _ = flatten_util.ravel_pytree(a)
  fb, _ = flatten_util.ravel_pytree(b)
  return 1.0 - jnp.dot(fa, fb) / jnp.maximum(jnp.linalg.norm(fa) * jnp.linalg.norm(fb), 1e-30)


def objective(grad_fn: Callable, target: Any, labels, tv_weight: float,
              mask: jax.Array | None = None) -> Callable:
  """x -> 1 - cos(grad_fn(x, labels), target) + alpha TV(x): Eq. (4) of Geiping et al. (the
  number unverified; "Eq. (4)" in this module means this objective)."""
  def fn(x):
    return (cosine_distance(grad_fn(x, labels), target) +
            tv_weight * total_variation(x, mask))
  return fn


def _schedule(settings: Settings):
  s = settings.steps
  return optax.piecewise_constant_schedule(
      settings.learning_rate, {int(s * 3 / 8): 0.1, int(s * 5 / 8): 0.1, int(s * 7 / 8): 0.1})


def invert(key: jax.Array, grad_fn: Callable, target: Any, shape: tuple, labels,
           settings: Settings, value_range: tuple[float, float] = (0.0, 1.0),
           mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Inputs of `shape` whose gradient matches `target` in direction (Geiping et al., Sect. 4).

  Args:
    key: draws the restarts' starting points (uniform in the data range).
    grad_fn: `(x, labels) -> gradient pytree` of the model the client received.
    target: the upload (or gradient) the server observed, the same pytree structure.
    shape: the inputs' shape [N, ...].
    labels: the labels used in `grad_fn` (iDLG's for one example, else given).
    settings: the optimisation.
    value_range: the box the inputs are projected into after every step.
    mask: [N] real rows of a padded client (`grad_fn` must ignore the others); the padding
      rows are optimised too but touch nothing of the real ones (Adam is elementwise, each
      row's start has its own key), so a result does not depend on the padding.

  Returns:
    (best inputs [N, ...], its objective).
  """
  fn = objective(grad_fn, target, labels, settings.tv_weight, mask)
  opt = optax.adam(_schedule(settings))
  lo, hi = value_range

  def one(k):
    x0 = jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(k, i), shape[1:],
                                               minval=lo, maxval=hi))(jnp.arange(shape[0]))

    def step(carry, _):
      x, state = carry
      g = jax.grad(fn)(x)
      # The paper's signed gradients: the objective's scale varies over orders of magnitude.
      updates, state = opt.update(jnp.sign(g), state, x)
      return (jnp.clip(optax.apply_updates(x, updates), lo, hi), state), None

    (x, _), _ = jax.lax.scan(step, (x0, opt.init(x0)), None, length=settings.steps)
    return x, fn(x)

  xs, losses = jax.vmap(one)(jax.random.split(key, settings.restarts))
  best = jnp.argmin(losses)
  return xs[best], losses[best]
