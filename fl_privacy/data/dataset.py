"""The in-memory dataset type shared by every layer, and two small conversions."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


class DataUnavailableError(RuntimeError):
  """A dataset's files are not on this machine (and nothing will download them)."""


@dataclasses.dataclass(frozen=True)
class Dataset:
  """Examples and labels of one split, held as numpy arrays.

  Attributes:
    x: uint8 images [N, H, W, C] (NHWC, 0..255) or float32 features [N, d].
    y: int32 labels [N] in [0, num_classes).
    num_classes: Number of label values.
    name: Where the data came from, e.g. 'cifar10/train'.
    attributes: Optional per-example side information (e.g. CelebA's 40 binary
      attributes), each array with leading axis N.
  """
  x: np.ndarray
  y: np.ndarray
  num_classes: int
  name: str
  attributes: dict[str, np.ndarray] | None = None

  def __post_init__(self):
    if len(self.x) != len(self.y):
      raise ValueError(f'{self.name}: {len(self.x)} examples but {len(self.y)} labels')
    if self.x.ndim not in (2, 4):
      raise ValueError(f'{self.name}: x must be [N, H, W, C] images or [N, d] features, '
                       f'got shape {self.x.shape}')
    if self.x.ndim == 4 and self.x.dtype != np.uint8:
      raise ValueError(f'{self.name}: images must be uint8, got {self.x.dtype}')

  @property
  def is_image(self) -> bool:
    """Whether `x` holds NHWC images (rather than feature vectors)."""
    return self.x.ndim == 4

  def __len__(self) -> int:
    return len(self.y)

  def subset(self, indices) -> Dataset:
    """The examples at `indices` (index array, boolean mask or slice), same metadata."""
    if not isinstance(indices, slice):
      indices = np.asarray(indices)
    attributes = None
    if self.attributes is not None:
      attributes = {k: v[indices] for k, v in self.attributes.items()}
    return dataclasses.replace(self, x=self.x[indices], y=self.y[indices],
                               attributes=attributes)


def to_float(x) -> np.ndarray:
  """float32 copy of `x`; uint8 images are scaled from 0..255 to [0, 1]."""
  x = np.asarray(x)
  if x.dtype == np.uint8:
    return x.astype(np.float32) / np.float32(255.0)
  return x.astype(np.float32)


def rng_from_key(key) -> np.random.Generator:
  """A numpy Generator determined by a JAX key.

  The key's raw words seed a `SeedSequence`, so equal keys give equal streams and
  keys from `fold_in` give independent ones. Both typed keys (`jax.random.key`)
  and legacy uint32 keys are accepted.

  Args:
    key: A JAX PRNG key (a single one, not a batch).

  Returns:
    A PCG64-backed `np.random.Generator`.
  """
  if jnp.issubdtype(getattr(key, 'dtype', None), jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  words = np.asarray(key, dtype=np.uint32).ravel()
  return np.random.default_rng([int(w) for w in words])
