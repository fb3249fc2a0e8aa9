"""Server aggregation of client trees stacked on axis 0."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def mean(trees: Any) -> Any:
  """Plain average over the leading (client) axis of every leaf."""
  return jax.tree_util.tree_map(lambda t: jnp.mean(t, axis=0), trees)


def weighted_mean(trees: Any, weights: jnp.ndarray) -> Any:
  """Average over the leading axis with non-negative weights [K].

  FedAvg's server step weights client k by its number of examples n_k
  (McMahan et al., 2017): sum_k n_k w_k / sum_k n_k. Weights need not sum to 1. All
  weights 0 (no client with examples took part) gives the zero update, not 0 / 0.
  """
  weights = jnp.asarray(weights, jnp.float32)
  total = jnp.sum(weights)
  weights = jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0), 0.0)
  return jax.tree_util.tree_map(
      lambda t: jnp.tensordot(weights.astype(t.dtype), t, axes=1), trees)
