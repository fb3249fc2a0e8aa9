"""Client-side training: FedSGD and FedAvg (McMahan et al., 2017).

All functions are pure and take their key, so a batch of independent clients is
`jax.vmap` over stacked data and keys.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from fl_privacy.fl.losses import LossFn


def fedsgd(loss_fn: LossFn, params: Any, x: jnp.ndarray,
           y: jnp.ndarray) -> Any:
  """FedSGD: the client's full-batch gradient at the global `params`."""
  return jax.grad(loss_fn)(params, x, y)


def fedsgd_step(loss_fn: LossFn, params: Any, x: jnp.ndarray, y: jnp.ndarray,
                *, key=None, learning_rate) -> Any:
  """Local params after one full-batch SGD step (FedSGD as a `local_fn`).

  Args:
    loss_fn: `loss_fn(params, x, y) -> scalar`.
    params: Global parameters.
    x: Client inputs [N, ...].
    y: Client labels [N].
    key: Unused; accepted so that this fits `rounds.run`'s `local_fn`.
    learning_rate: Step size.

  Returns:
    `params - learning_rate * fedsgd(...)`.
  """
  del key
  grads = fedsgd(loss_fn, params, x, y)
  return jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params,
                                grads)


def batch_order(key, num_examples: int, *, epochs: int, batch_size: int,
                shuffle: bool = True) -> jnp.ndarray:
  """Example indices of every local step, [epochs * J, batch_size].

  J = num_examples // batch_size minibatches per epoch; epoch e uses the
  permutation drawn with `fold_in(key, e)` (identity order when not shuffling)
  and drops its last `num_examples % batch_size` entries.

  Args:
    key: Client key.
    num_examples: N.
    epochs: E.
    batch_size: B, at most N.
    shuffle: Whether each epoch draws a fresh permutation.

  Returns:
    int32 indices [E * J, B].
  """
  if not 0 < batch_size <= num_examples:
    raise ValueError(f'batch_size must be in [1, {num_examples}] '
                     f'(got {batch_size})')
  if epochs < 1:
    raise ValueError(f'epochs must be >= 1 (got {epochs})')
  steps = num_examples // batch_size
  used = steps * batch_size

  def one_epoch(epoch):
    if shuffle:
      order = jax.random.permutation(jax.random.fold_in(key, epoch),
                                     num_examples)
    else:
      order = jnp.arange(num_examples)
    return order[:used].reshape(steps, batch_size)

  orders = jax.vmap(one_epoch)(jnp.arange(epochs))
  return orders.reshape(epochs * steps, batch_size).astype(jnp.int32)


def fedavg(loss_fn: LossFn, params: Any, x: jnp.ndarray, y: jnp.ndarray, *,
           key, optimizer: optax.GradientTransformation, epochs: int,
           batch_size: int, shuffle: bool = True) -> Any:
  """FedAvg client update: E epochs of minibatch training from `params`.

  Algorithm 1 (ClientUpdate) of McMahan et al. (2017), with any optax
  optimizer: each epoch splits the N examples into J = N // B minibatches of
  size B (see `batch_order`), one optimizer step per minibatch, E * J steps in
  one `lax.scan`. The optimizer state starts fresh on each call, as a client
  re-creates its optimizer every round in the seed papers' code. Vmappable over
  clients (stack `x`, `y` and keys).

  Args:
    loss_fn: `loss_fn(params, x, y) -> scalar` (a mean over the batch).
    params: Global parameters the client starts from.
    x: Client inputs [N, ...].
    y: Client labels [N].
    key: Client key (shuffling only).
    optimizer: optax transformation, e.g. from `optimizers.make`.
    epochs: E (static).
    batch_size: B (static).
    shuffle: Fresh permutation each epoch; False walks the data in order.

  Returns:
    The client's local parameters after E * J steps.
  """
  order = batch_order(key, x.shape[0], epochs=epochs, batch_size=batch_size,
                      shuffle=shuffle)
  grad_fn = jax.grad(loss_fn)

  def step(carry, idx):
    p, state = carry
    updates, state = optimizer.update(grad_fn(p, x[idx], y[idx]), state, p)
    return (optax.apply_updates(p, updates), state), None

  (params, _), _ = jax.lax.scan(step, (params, optimizer.init(params)), order)
  return params
