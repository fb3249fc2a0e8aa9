"""Classification losses and a helper that binds a model into `loss_fn`.

Everywhere in `fl_privacy.fl` a loss is `loss_fn(params, x, y) -> scalar`.
"""

from __future__ import annotations

from typing import Any, Callable

import jax.numpy as jnp
import optax

LossFn = Callable[[Any, jnp.ndarray, jnp.ndarray], jnp.ndarray]


def per_example_cross_entropy(logits: jnp.ndarray,
                              labels: jnp.ndarray) -> jnp.ndarray:
  """Softmax cross-entropy [N] of logits [N, C] against integer labels [N]."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def cross_entropy(logits: jnp.ndarray, labels: jnp.ndarray) -> jnp.ndarray:
  """Mean softmax cross-entropy over the batch."""
  return jnp.mean(per_example_cross_entropy(logits, labels))


def make_loss_fn(apply_fn: Callable[[Any, jnp.ndarray], jnp.ndarray]) -> LossFn:
  """`loss_fn(params, x, y)`: mean cross-entropy of `apply_fn(params, x)`.

  Args:
    apply_fn: Maps (params, inputs) to logits, e.g. `model.apply` (then
      `params` is the variables dict `{'params': ...}`).

  Returns:
    The loss function used by `grads`, `local` and `rounds`.
  """
  def loss_fn(params, x, y):
    return cross_entropy(apply_fn(params, x), y)
  return loss_fn
