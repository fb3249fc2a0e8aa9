"""Sources that need no download: scikit-learn digits, a user .npz file, synthetic blobs."""

from __future__ import annotations

import os

import numpy as np

from fl_privacy.data.dataset import Dataset
from fl_privacy.data.partitions import holdout_split

DIGITS_TEST_FRACTION = 0.2
_NPZ_X = ('images', 'x')
_NPZ_Y = ('labels', 'y')


def digits_to_uint8(values: np.ndarray) -> np.ndarray:
  """Maps load_digits' integer grey levels 0..16 linearly onto 0..255 (16 -> 255)."""
  return np.round(np.asarray(values, np.float64) * (255.0 / 16.0)).astype(np.uint8)


def load_digits() -> dict[str, Dataset]:
  """scikit-learn's 1,797 real 8x8 handwritten digits, shipped with the library.

  Images are uint8 [N, 8, 8, 1]; the original grey levels 0..16 are scaled to 0..255
  by `digits_to_uint8`. The test split is a fixed (seed 0) random 20% (359 images),
  the train split the other 1,438; the split does not depend on any experiment seed.
  """
  from sklearn.datasets import load_digits as sk_load_digits
  bunch = sk_load_digits()
  x = digits_to_uint8(bunch.images)[..., None]
  y = bunch.target.astype(np.int32)
  train, test = holdout_split(len(y), DIGITS_TEST_FRACTION, seed=0)
  return {split: Dataset(x=x[idx], y=y[idx], num_classes=10, name=f'digits/{split}')
          for split, idx in (('train', train), ('test', test))}


def _pick(arrays, names, suffix, path, required):
  found = [n + suffix for n in names if n + suffix in arrays]
  if len(found) > 1:
    raise ValueError(f'{path}: holds both {found[0]!r} and {found[1]!r}; keep one')
  if not found:
    if required:
      raise ValueError(f'{path}: needs an array named one of '
                       f'{[n + suffix for n in names]}; it holds {sorted(arrays)}')
    return None
  return np.asarray(arrays[found[0]])


def _as_examples(x: np.ndarray, path: str, name: str) -> np.ndarray:
  if x.ndim == 3 and x.dtype == np.uint8:
    return x[..., None]  # [N, H, W] greyscale.
  if x.ndim == 4 and x.dtype == np.uint8:
    return x
  if x.ndim == 2 and np.issubdtype(x.dtype, np.number):
    return x.astype(np.float32)
  raise ValueError(f'{path}: {name!r} must be uint8 images [N, H, W] or [N, H, W, C], or '
                   f'numeric features [N, d]; got {x.dtype} {x.shape}')


def _as_labels(y: np.ndarray, n: int, path: str, name: str) -> np.ndarray:
  if y.ndim != 1 or len(y) != n:
    raise ValueError(f'{path}: labels of {name!r} must have shape [{n}], got {y.shape}')
  if not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
    raise ValueError(f'{path}: labels of {name!r} must be non-negative integers, '
                     f'got {y.dtype}')
  return y.astype(np.int32)


def load_npz(path: str) -> dict[str, Dataset]:
  """A user's dataset from an .npz file.

  Arrays: `images` or `x` (uint8 [N, H, W(, C)] or numeric [N, d]) and `labels` or
  `y` (int [N]); optionally `images_test`/`x_test` with `labels_test`/`y_test`, and a
  scalar `num_classes` (default: largest label + 1). Without a test split, a fixed
  (seed 0) random 20% of the examples becomes 'test'.

  Raises:
    ValueError: A required array is missing, or shapes/dtypes do not fit.
  """
  with np.load(os.fspath(path), allow_pickle=False) as arrays:
    arrays = dict(arrays)
  x = _as_examples(_pick(arrays, _NPZ_X, '', path, True), path, 'x')
  y = _as_labels(_pick(arrays, _NPZ_Y, '', path, True), len(x), path, 'x')
  x_test = _pick(arrays, _NPZ_X, '_test', path, False)
  y_test = _pick(arrays, _NPZ_Y, '_test', path, False)
  if (x_test is None) != (y_test is None):
    raise ValueError(f'{path}: a test split needs both images/x_test and labels/y_test')
  if x_test is None:
    train, test = holdout_split(len(y), 0.2, seed=0)
    x, y, x_test, y_test = x[train], y[train], x[test], y[test]
  else:
    x_test = _as_examples(x_test, path, 'x_test')
    y_test = _as_labels(y_test, len(x_test), path, 'x_test')
    if x_test.shape[1:] != x.shape[1:] or x_test.dtype != x.dtype:
      raise ValueError(f'{path}: test examples {x_test.dtype} {x_test.shape[1:]} do not '
                       f'match train examples {x.dtype} {x.shape[1:]}')
  top = int(max(y.max(initial=-1), y_test.max(initial=-1))) + 1
  num_classes = int(arrays['num_classes']) if 'num_classes' in arrays else top
  if num_classes < top:
    raise ValueError(f'{path}: num_classes={num_classes} but a label equals {top - 1}')
  stem = os.path.splitext(os.path.basename(os.fspath(path)))[0]
  return {'train': Dataset(x=x, y=y, num_classes=num_classes, name=f'npz:{stem}/train'),
          'test': Dataset(x=x_test, y=y_test, num_classes=num_classes,
                          name=f'npz:{stem}/test')}


def synthetic_split(rng: np.random.Generator, means: np.ndarray, num_examples: int,
                    noise: float, is_image: bool) -> tuple[np.ndarray, np.ndarray]:
  """Draws num_examples class-conditional Gaussian samples around `means`."""
  y = rng.integers(0, len(means), num_examples).astype(np.int32)
  x = means[y] + noise * rng.standard_normal((num_examples,) + means.shape[1:])
  if is_image:
    return np.clip(np.round(x), 0, 255).astype(np.uint8), y
  return x.astype(np.float32), y


def load_synthetic(num_examples: int = 512, num_classes: int = 10,
                   shape: tuple[int, ...] = (8, 8, 1), seed: int = 0,
                   num_test: int | None = None) -> dict[str, Dataset]:
  """Class-conditional Gaussian blobs, for tests and smoke runs.

  shape (H, W, C) gives uint8 images: class means uniform in [64, 192] per pixel,
  per-pixel noise sd 32, rounded and clipped to 0..255. shape (d,) gives float32
  features: class means N(0, 4 I), noise N(0, I). Train and test are independent
  draws with the same means.

  Args:
    num_examples: Train examples (test gets num_test, default the same).
    num_classes: Number of blobs.
    shape: (H, W, C) or (d,).
    seed: Seeds the means and samples (data definition, not experiment randomness).
    num_test: Test examples.
  """
  rng = np.random.default_rng(seed)
  shape = tuple(int(s) for s in shape)
  is_image = len(shape) == 3
  if is_image:
    means, noise = rng.uniform(64.0, 192.0, (num_classes,) + shape), 32.0
  else:
    means, noise = 2.0 * rng.standard_normal((num_classes,) + shape), 1.0
  out = {}
  for split, n in (('train', num_examples),
                   ('test', num_examples if num_test is None else num_test)):
    x, y = synthetic_split(rng, means, n, noise, is_image)
    out[split] = Dataset(x=x, y=y, num_classes=num_classes, name=f'synthetic/{split}')
  return out
