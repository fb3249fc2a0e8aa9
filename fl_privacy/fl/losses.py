"""Classification losses and a helper that binds a model into `loss_fn`.

Everywhere in `fl_privacy.fl` a loss is `loss_fn(params, x, y) -> scalar`; the losses made
here also take an optional `mask` [B] (1 for real rows, 0 for padding) and accept soft labels
(class distributions [B, C], e.g. after mixup) as well as integer labels [B].
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

LossFn = Callable[[Any, jnp.ndarray, jnp.ndarray], jnp.ndarray]


def per_example_cross_entropy(logits: jnp.ndarray,
                              labels: jnp.ndarray) -> jnp.ndarray:
  """Softmax cross-entropy [N] of logits [N, C] against integer labels [N] or soft labels [N, C]."""
  if labels.ndim == logits.ndim:
    return optax.softmax_cross_entropy(logits, labels)
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def true_label_margin(logits: jnp.ndarray, labels: jnp.ndarray) -> jnp.ndarray:
  """z_y - logsumexp_{j != y} z_j [N] of logits [N, C] and integer labels [N].

  The logit-scaled confidence of the true label, log(p_y / (1 - p_y)) with p = softmax(z),
  computed from the logits as Carlini et al. do ("Membership Inference Attacks From First
  Principles", IEEE S&P 2022, arXiv:2112.03570, Sect. VI-A (unverified)): a difference of
  two logit-sized numbers, accurate to float32 rounding of the logits at every margin, where
  log(p / (1 - p)) from the float32 cross-entropy loses digits from a margin of about 10 and
  is undefined once the loss rounds to 0 (margin about 17). With C = 1 (no other class) the
  margin is +inf.
  """
  logits = jnp.asarray(logits)
  y = jnp.asarray(labels)
  true = jnp.take_along_axis(logits, y[:, None], axis=-1)[:, 0]
  others = jnp.where(jax.nn.one_hot(y, logits.shape[-1], dtype=bool), -jnp.inf, logits)
  return true - jax.nn.logsumexp(others, axis=-1)


def masked_mean(values: jnp.ndarray, mask: jnp.ndarray | None) -> jnp.ndarray:
  """Mean of `values` [N] over the rows with mask 1 (plain mean when `mask` is None).

  An all-padding batch gives 0 (the sum of masked terms over max(count, 1)), so its gradient
  is exactly zero rather than NaN.
  """
  if mask is None:
    return jnp.mean(values)
  mask = mask.astype(values.dtype)
  return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def cross_entropy(logits: jnp.ndarray, labels: jnp.ndarray,
                  mask: jnp.ndarray | None = None) -> jnp.ndarray:
  """Mean softmax cross-entropy over the batch's real rows."""
  return masked_mean(per_example_cross_entropy(logits, labels), mask)


def make_loss_fn(apply_fn: Callable[[Any, jnp.ndarray], jnp.ndarray]) -> LossFn:
  """`loss_fn(params, x, y)`: mean cross-entropy of `apply_fn(params, x)`.

  Args:
    apply_fn: Maps (params, inputs) to logits, e.g. `model.apply` (then
      `params` is the variables dict `{'params': ...}`).

  Returns:
    The loss function used by `grads`, `local` and `rounds`.
  """
  def loss_fn(params, x, y, mask=None):
    return cross_entropy(apply_fn(params, x), y, mask)
  return loss_fn
