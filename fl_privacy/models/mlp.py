"""A multilayer perceptron on flat features (or flattened images)."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp


class MLP(nn.Module):
  """Dense ReLU layers `fc1 ... fcK` then the classifier `fc{K+1}`.

  There is no learned trunk: `embed(x)` only flattens, and `head` is the whole
  network, so the model offers the same `embed`/`head` interface as the CNNs.

  Attributes:
    hidden: Widths of the hidden layers (may be empty: logistic regression).
    num_classes: Number of output logits.
  """
  hidden: Sequence[int] = (128,)
  num_classes: int = 10

  def setup(self):
    for i, width in enumerate(tuple(self.hidden) + (self.num_classes,)):
      setattr(self, f'fc{i + 1}', nn.Dense(width))

  def embed(self, x: jnp.ndarray) -> jnp.ndarray:
    """Features [N, d]: `x` flattened after the batch axis."""
    return x.reshape((x.shape[0], -1))

  def head(self, h: jnp.ndarray) -> jnp.ndarray:
    """Logits [N, num_classes] from flat features `h` [N, d]."""
    depth = len(self.hidden) + 1
    for i in range(1, depth):
      h = nn.relu(getattr(self, f'fc{i}')(h))
    return getattr(self, f'fc{depth}')(h)

  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    return self.head(self.embed(x))
