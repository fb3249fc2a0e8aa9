"""Gradients per example and per client, vectorised with `vmap`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fl_privacy.fl.losses import LossFn


def per_example_grads(loss_fn: LossFn, params: Any, x: jnp.ndarray,
                      y: jnp.ndarray) -> Any:
  """Gradient of the loss of each example on its own.

  Args:
    loss_fn: `loss_fn(params, x, y) -> scalar` on a batch.
    params: Parameter pytree.
    x: Inputs [N, ...].
    y: Labels [N].

  Returns:
    A pytree like `params` with a leading axis N: entry i is
    `grad(loss_fn)(params, x[i:i+1], y[i:i+1])`.
  """
  def one(xi, yi):
    return jax.grad(loss_fn)(params, xi[None], yi[None])
  return jax.vmap(one)(x, y)


def client_grads(loss_fn: LossFn, params: Any, xs: jnp.ndarray,
                 ys: jnp.ndarray) -> Any:
  """Full-batch gradient of each client's data at shared `params`.

  Args:
    loss_fn: `loss_fn(params, x, y) -> scalar` on a batch.
    params: Parameter pytree shared by all clients.
    xs: Inputs stacked by client [K, N, ...].
    ys: Labels [K, N].

  Returns:
    A pytree like `params` with a leading axis K.
  """
  return jax.vmap(jax.grad(loss_fn), in_axes=(None, 0, 0))(params, xs, ys)
