"""Sources that need no download: scikit-learn digits, a user .npz file, synthetic blobs."""

from __future__ import annotations

import os
import zipfile

import numpy as np

from fl_privacy.data.dataset import Dataset
from fl_privacy.data.partitions import holdout_split

DIGITS_TEST_FRACTION = 0.2
NPZ_TEST_FRACTION = 0.2
_NPZ_X = ('images', 'x')
_NPZ_Y = ('labels', 'y')
# The largest feature magnitude whose float32 square is finite: a larger one turns every
# distance, norm and logit computed from it into inf, then NaN scores after the training.
MAX_FEATURE = float(np.sqrt(np.finfo(np.float32).max))
# The most classes a file may declare (labels < MAX_CLASSES): the models' output layers and
# one-hot labels are sized by it, and a label of 1e9 made a 2.6 TB allocation mid-run.
MAX_CLASSES = 100_000


class DataFileError(ValueError):
  """A user's data file that cannot be used as it is; the message names the file and why.

  The experiments report it as one line with exit status 2 (experiments/common.py).
  """


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
  """(name, array) of the one array named one of `names` + `suffix`; (None, None) if absent."""
  found = [n + suffix for n in names if n + suffix in arrays]
  if len(found) > 1:
    raise DataFileError(f'{path}: holds both {found[0]!r} and {found[1]!r}; keep one')
  if not found:
    if required:
      raise DataFileError(f'{path}: needs an array named one of '
                       f'{[n + suffix for n in names]}; it holds {sorted(arrays)}')
    return None, None
  return found[0], np.asarray(arrays[found[0]])


def _as_examples(x: np.ndarray, path: str, name: str) -> np.ndarray:
  if x.ndim in (3, 4) and x.dtype == np.uint8 and 0 in x.shape[1:]:
    # A zero height, width or channel count ended in a traceback while hashing the data.
    raise DataFileError(f'{path}: {name!r} must hold images of positive height, width and '
                        f'channels; got shape {x.shape}')
  if x.ndim == 3 and x.dtype == np.uint8:
    return x[..., None]  # [N, H, W] greyscale.
  if x.ndim == 4 and x.dtype == np.uint8:
    return x
  if x.ndim == 2 and np.issubdtype(x.dtype, np.number) and not np.iscomplexobj(x):
    x = x.astype(np.float32)
    bad = ~np.isfinite(x)
    if bad.any():
      # A NaN or inf feature would run to the end and write meaningless results.
      rows = np.flatnonzero(bad.any(axis=1))
      raise DataFileError(f'{path}: {name!r} must hold finite numbers; {int(bad.sum())} '
                          f'NaN/inf values in {len(rows)} rows (first row {int(rows[0])})')
    if x.shape[0] == 0 or x.shape[1] == 0:
      raise DataFileError(f'{path}: {name!r} must have at least one example and one '
                          f'feature; got shape {x.shape}')
    big = np.abs(x) > MAX_FEATURE
    if big.any():
      rows = np.flatnonzero(big.any(axis=1))
      raise DataFileError(f'{path}: {name!r} must hold features of magnitude <= '
                          f'{MAX_FEATURE:.3g} (their float32 square overflows beyond); '
                          f'{int(big.sum())} values in {len(rows)} rows exceed it (largest '
                          f'{float(np.abs(x).max()):.3g}, first row {int(rows[0])})')
    return x
  raise DataFileError(f'{path}: {name!r} must be uint8 images [N, H, W] or [N, H, W, C], or '
                   f'numeric features [N, d]; got {x.dtype} {x.shape}')


def _as_labels(y: np.ndarray, n: int, path: str, name: str, x_name: str) -> np.ndarray:
  if y.ndim != 1 or len(y) != n:
    raise DataFileError(f'{path}: {name!r} (the labels of {x_name!r}) must have shape [{n}] '
                        f'(one per example), got {y.shape}')
  if not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
    raise DataFileError(f'{path}: {name!r} (the labels of {x_name!r}) must be non-negative '
                        f'integers, got {y.dtype}')
  if len(y) and y.max() >= MAX_CLASSES:
    raise DataFileError(f'{path}: {name!r} (the labels of {x_name!r}) must be < {MAX_CLASSES:,} '
                        f'(class indices size the models\' outputs); got {int(y.max())}')
  return y.astype(np.int32)


def load_npz(path: str) -> dict[str, Dataset]:
  """A user's dataset from an .npz file.

  Arrays: `images` or `x` (uint8 [N, H, W(, C)] or numeric [N, d]) and `labels` or
  `y` (int [N]); optionally `images_test`/`x_test` with `labels_test`/`y_test`, and a
  scalar `num_classes` (default: largest label + 1). Without a test split, a fixed
  (seed 0) random 20% of the examples becomes 'test'.

  Raises:
    DataFileError: the file is not a readable .npz of plain arrays (object arrays are
      refused: loading them would run pickled code), a required array is missing,
      shapes/dtypes do not fit, labels are not one per example, features hold NaN/inf or
      values whose float32 square overflows (> MAX_FEATURE), a split would be empty, or
      the labels hold fewer than 2 classes. Messages name the arrays the file holds.
  """
  arrays, name = {}, None
  try:
    loaded = np.load(os.fspath(path), allow_pickle=False)
    if not hasattr(loaded, 'files'):
      raise DataFileError(f'{path}: must be an .npz archive of named arrays (np.savez); '
                          'got a single .npy array')
    with loaded as npz:
      for name in npz.files:
        arrays[name] = npz[name]
  except DataFileError:
    raise
  except ValueError as e:
    if 'allow_pickle' in str(e) and name is not None:
      raise DataFileError(f'{path}: array {name!r} must be a plain numeric array; got an '
                          'object (pickled) array, which is refused') from e
    raise DataFileError(f'{path}: must be an .npz archive of named arrays (np.savez); '
                        'got a file numpy cannot read as one') from e
  except (OSError, EOFError, zipfile.BadZipFile) as e:
    raise DataFileError(f'{path}: must be a readable .npz archive ({type(e).__name__}: '
                        f'{e})') from e
  # Messages name the arrays the file holds ('images' or 'x', 'labels' or 'y').
  x_name, x = _pick(arrays, _NPZ_X, '', path, True)
  y_name, y = _pick(arrays, _NPZ_Y, '', path, True)
  x = _as_examples(x, path, x_name)
  y = _as_labels(y, len(x), path, y_name, x_name)
  xt_name, x_test = _pick(arrays, _NPZ_X, '_test', path, False)
  yt_name, y_test = _pick(arrays, _NPZ_Y, '_test', path, False)
  if (x_test is None) != (y_test is None):
    raise DataFileError(f'{path}: a test split needs both images/x_test and labels/y_test')
  if x_test is None:
    # Three examples is the least that leaves one in the held-out test split and two (a
    # member and another example) in train; every experiment needs far more.
    train, test = holdout_split(len(y), NPZ_TEST_FRACTION, seed=0)
    if len(train) < 2 or len(test) < 1:
      raise DataFileError(f'{path}: too small: {x_name!r} holds {len(y)} examples; needs at '
                          f'least 3 ({NPZ_TEST_FRACTION:.0%} are held out as the test split)')
    x, y, x_test, y_test = x[train], y[train], x[test], y[test]
  else:
    x_test = _as_examples(x_test, path, xt_name)
    y_test = _as_labels(y_test, len(x_test), path, yt_name, xt_name)
    if x_test.shape[1:] != x.shape[1:] or x_test.dtype != x.dtype:
      raise DataFileError(f'{path}: test examples {x_test.dtype} {x_test.shape[1:]} do not '
                       f'match train examples {x.dtype} {x.shape[1:]}')
    for name, n, least in ((x_name, len(x), 2), (xt_name, len(x_test), 1)):
      if n < least:
        raise DataFileError(f'{path}: too small: {name!r} holds {n} examples; needs at '
                            f'least {least}')
  classes = np.unique(np.concatenate([y, y_test]))
  if len(classes) < 2:
    # One class makes every membership score and accuracy trivial (accuracy 1.000).
    raise DataFileError(f'{path}: {y_name!r} must hold at least 2 classes; got only label '
                        f'{int(classes[0])} in all {len(y) + len(y_test)} examples')
  top = int(max(y.max(initial=-1), y_test.max(initial=-1))) + 1
  num_classes = top
  if 'num_classes' in arrays:
    nc = arrays['num_classes']
    if nc.shape != () or not np.issubdtype(nc.dtype, np.integer):
      raise DataFileError(f'{path}: num_classes must be a scalar integer, got {nc.dtype} '
                          f'{nc.shape}')
    num_classes = int(nc)
    if num_classes > MAX_CLASSES:
      raise DataFileError(f'{path}: num_classes must be at most {MAX_CLASSES:,} (it sizes the '
                          f'models\' outputs and one-hot labels); got {num_classes}')
  if num_classes < top:
    raise DataFileError(f'{path}: num_classes={num_classes} but a label equals {top - 1}')
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
