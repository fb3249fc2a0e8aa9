"""Small models and data of the Flower tests."""

from __future__ import annotations

import jax
import numpy as np
import optax

from fl_privacy import models

NUM_CLASSES = 3
DIM = 8
SGD = optax.sgd(0.1)


def synthetic(seed: int, n: int, dim: int = DIM) -> tuple[np.ndarray, np.ndarray]:
  """n Gaussian examples [n, dim] float32 with labels in [0, NUM_CLASSES)."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, dim)).astype(np.float32)
  return x, rng.integers(0, NUM_CLASSES, n).astype(np.int32)


def shards(num_nodes: int = 3, per_node: int = 16, seed: int = 0):
  """Equal IID shards of synthetic data, one per node."""
  x, y = synthetic(seed, num_nodes * per_node)
  return [(x[i * per_node:(i + 1) * per_node], y[i * per_node:(i + 1) * per_node])
          for i in range(num_nodes)]


def mlp(hidden=(8, 4)):
  """MLP with dense layers fc1, fc2, fc3 (the detector's three layers)."""
  return models.MLP(hidden=hidden, num_classes=NUM_CLASSES)


def init(model, seed: int = 0):
  return model.init(jax.random.key(seed), np.zeros((1, DIM), np.float32))
