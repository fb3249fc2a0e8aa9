"""Defenses on the client's training data: mixup, augmentation, data sampling.

- `mixup` (Zhang et al. 2018, "mixup: Beyond Empirical Risk Minimization"; the FedMIA paper's
  MixUp defense): per minibatch one lambda ~ Beta(alpha, alpha); every real row i is paired
  with row pi(i) of a uniformly random permutation of the batch's real rows, and
  x' = lambda x_i + (1 - lambda) x_pi(i), y' = lambda onehot(y_i) + (1 - lambda)
  onehot(y_pi(i)) (soft labels, which `fl.losses` accepts). `public_code=True` reproduces the
  FedMIA code (`trainer_private.py:195`), which mixes the labels but feeds the *unmixed* inputs
  to the model: a named variant, not the default.
- `augment` level 1-4, cumulative (FedMIA code `utils/datasets.py:57-68`; the paper's
  Appendix "Data Augmentation"): 1 random crop after zero padding (4 px; 1 px suits 8x8
  digits), 2 + horizontal flip (p 1/2), 3 + vertical flip (p 1/2) and a rotation by a uniform
  angle in [-45, 45] degrees (bilinear, zero fill), 4 + colour jitter (brightness, contrast and,
  for 3 channels, saturation factors uniform in [1 - j, 1 + j], torchvision's ColorJitter
  formulas; j = 0.4 by default), values clipped to `value_range`. Every example draws its own
  transformation. Flat feature vectors (the digits MLP's 64 features) are reshaped to
  `image_shape` (e.g. (8, 8, 1)), transformed, and flattened back: the caller names the shape,
  since a flat vector does not carry it.
- `sampling` (the FedMIA paper's "Data Sampling", after Hu et al.): each round the client
  trains on a uniformly random subset of max(1, round(p n)) of its n real rows, through the
  `data` hook's mask.

All functions are pure and jit-able and keep shapes; labels are untouched except by mixup.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp

AUGMENT_LEVELS = (1, 2, 3, 4)
MAX_ROTATION_DEGREES = 45.0
DEFAULT_JITTER = 0.4


# ----------------------------------------------------------------------------------------------
# mixup


def real_permutation(key: jax.Array, mask: jax.Array) -> jax.Array:
  """A uniformly random permutation of the real rows (mask > 0); padding rows map to padding.

  Two independent random orders of the real rows, r and s, pair r_i with s_i: a uniform
  permutation of the real rows that never pulls a padding row into a real one.
  """
  n = mask.shape[0]
  real = mask > 0
  k1, k2 = jax.random.split(key)
  big = jnp.asarray(2.0, jnp.float32)
  r = jnp.argsort(jnp.where(real, jax.random.uniform(k1, (n,)), big))
  s = jnp.argsort(jnp.where(real, jax.random.uniform(k2, (n,)), big))
  # Position i of the sorted orders holds real rows for i < n_real, padding after; padding
  # rows are sorted by index in both (ties of `big`), so they map to themselves.
  return jnp.zeros(n, jnp.int32).at[r].set(s.astype(jnp.int32))


def one_hot_labels(y: jax.Array, num_classes: int) -> jax.Array:
  """Integer labels [B] -> one-hot [B, C]; soft labels [B, C] pass through."""
  if y.ndim == 2:
    return y.astype(jnp.float32)
  return jax.nn.one_hot(y, num_classes, dtype=jnp.float32)


def mixup(key: jax.Array, x: jax.Array, y: jax.Array, mask: jax.Array | None, *,
          alpha: float, num_classes: int, public_code: bool = False):
  """mixup of one minibatch (Zhang et al. 2018, Eq. 1): inputs and labels with one lambda.

  Args:
    key: the step's `batch` key.
    x: inputs [B, ...].
    y: integer labels [B] or soft labels [B, C].
    mask: [B] real rows, or None (all real).
    alpha: Beta(alpha, alpha) parameter, > 0.
    num_classes: C.
    public_code: mix the labels only and return the unmixed inputs (FedMIA's code).

  Returns:
    (x', y' [B, C] soft labels, mask) and lambda as a 4th element.
  """
  m = jnp.ones(x.shape[0], jnp.float32) if mask is None else mask
  k_lam, k_perm = jax.random.split(key)
  lam = jax.random.beta(k_lam, alpha, alpha).astype(jnp.float32)
  perm = real_permutation(k_perm, m)
  soft = one_hot_labels(y, num_classes)
  y_mixed = lam * soft + (1.0 - lam) * soft[perm]
  if public_code:
    x_mixed = x
  else:
    xf = x.astype(jnp.float32)
    x_mixed = (lam * xf + (1.0 - lam) * xf[perm]).astype(x.dtype)
  return x_mixed, y_mixed, mask, lam


def mixup_hook(alpha: float, num_classes: int, public_code: bool = False):
  """`batch` hook of `mixup`. A closure over alpha, not a traced operand like `sampling_hook`:
  with alpha traced the Beta draws differ from a baked-in alpha in the last bits (XLA folds
  the constant's part of the sampler), which changes every number of a mixup run."""
  def batch(key, x, y, mask, aux):
    del aux
    x, y, mask, _ = mixup(key, x, y, mask, alpha=alpha, num_classes=num_classes,
                          public_code=public_code)
    return x, y, mask
  return batch


# ----------------------------------------------------------------------------------------------
# augmentation


def random_crop(key: jax.Array, img: jax.Array, pad: int) -> jax.Array:
  """Zero-pad by `pad` px on each side, then cut an HxW window at a uniform offset."""
  if pad <= 0:
    return img
  h, w = img.shape[0], img.shape[1]
  padded = jnp.pad(img, ((pad, pad), (pad, pad), (0, 0)))
  off = jax.random.randint(key, (2,), 0, 2 * pad + 1)
  return jax.lax.dynamic_slice(padded, (off[0], off[1], 0), (h, w, img.shape[2]))


def maybe_flip(key: jax.Array, img: jax.Array, axis: int) -> jax.Array:
  """Flip along `axis` (1 horizontal, 0 vertical) with probability 1/2."""
  return jnp.where(jax.random.bernoulli(key), jnp.flip(img, axis=axis), img)


def rotate(img: jax.Array, degrees: jax.Array) -> jax.Array:
  """Rotation about the image centre, bilinear, zero outside (torchvision's RandomRotation)."""
  h, w = img.shape[0], img.shape[1]
  theta = jnp.deg2rad(degrees)
  cy, cx = (h - 1) / 2.0, (w - 1) / 2.0
  yy, xx = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32), jnp.arange(w, dtype=jnp.float32),
                        indexing='ij')
  # Output pixel (y, x) samples the input at the inversely rotated position.
  cos, sin = jnp.cos(theta), jnp.sin(theta)
  src_y = cos * (yy - cy) - sin * (xx - cx) + cy
  src_x = sin * (yy - cy) + cos * (xx - cx) + cx

  def channel(c):
    return jax.scipy.ndimage.map_coordinates(c, [src_y, src_x], order=1, mode='constant',
                                             cval=0.0)
  return jnp.moveaxis(jax.vmap(channel, in_axes=2)(img.astype(jnp.float32)), 0, 2)


def colour_jitter(key: jax.Array, img: jax.Array, strength: float,
                  value_range: tuple[float, float]) -> jax.Array:
  """Brightness, contrast and (3 channels) saturation factors uniform in [1 - j, 1 + j].

  torchvision's ColorJitter formulas: brightness scales, contrast blends with the mean grey
  level, saturation blends with the grey image; results clipped to `value_range`.
  """
  lo, hi = value_range
  kb, kc, ks = jax.random.split(key, 3)
  factor = lambda k: jax.random.uniform(k, (), minval=1 - strength, maxval=1 + strength)
  img = jnp.clip(img * factor(kb), lo, hi)
  grey = (jnp.tensordot(img, jnp.asarray([0.299, 0.587, 0.114]), axes=([2], [0]))[..., None]
          if img.shape[2] == 3 else img)
  img = jnp.clip(jnp.mean(grey) + factor(kc) * (img - jnp.mean(grey)), lo, hi)
  if img.shape[2] == 3:
    grey = jnp.tensordot(img, jnp.asarray([0.299, 0.587, 0.114]), axes=([2], [0]))[..., None]
    img = jnp.clip(grey + factor(ks) * (img - grey), lo, hi)
  return img


def augment_image(key: jax.Array, img: jax.Array, *, level: int, pad: int,
                  jitter: float = DEFAULT_JITTER,
                  value_range: tuple[float, float] = (0.0, 1.0)) -> jax.Array:
  """One image [H, W, C] through augmentation level 1-4 (cumulative; module docstring)."""
  keys = jax.random.split(key, 6)
  dtype = img.dtype
  img = img.astype(jnp.float32)
  img = random_crop(keys[0], img, pad)
  if level >= 2:
    img = maybe_flip(keys[1], img, axis=1)
  if level >= 3:
    img = maybe_flip(keys[2], img, axis=0)
    angle = jax.random.uniform(keys[3], (), minval=-MAX_ROTATION_DEGREES,
                               maxval=MAX_ROTATION_DEGREES)
    img = rotate(img, angle)
  if level >= 4:
    img = colour_jitter(keys[4], img, jitter, value_range)
  return img.astype(dtype)


def augment(key: jax.Array, x: jax.Array, *, level: int, pad: int,
            image_shape: Sequence[int] | None = None, jitter: float = DEFAULT_JITTER,
            value_range: tuple[float, float] = (0.0, 1.0)) -> jax.Array:
  """Augments a batch [B, H, W, C] (or [B, d] flat, reshaped to `image_shape`) per example.

  Example i uses `fold_in(key, i)`, so its transformation does not depend on the batch size.
  """
  b = x.shape[0]
  flat = x.ndim == 2
  if flat:
    if image_shape is None or math.prod(image_shape) != x.shape[1]:
      raise ValueError(f'flat inputs of {x.shape[1]} features need image_shape with that many '
                       f'entries (got {image_shape})')
    imgs = x.reshape((b,) + tuple(image_shape))
  else:
    imgs = x if x.ndim == 4 else x[..., None]
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(b))
  out = jax.vmap(lambda k, im: augment_image(k, im, level=level, pad=pad, jitter=jitter,
                                             value_range=value_range))(keys, imgs)
  return out.reshape(x.shape)


def augment_hook(level: int, pad: int, image_shape: Sequence[int] | None = None,
                 jitter: float = DEFAULT_JITTER,
                 value_range: tuple[float, float] = (0.0, 1.0)):
  """`batch` hook of `augment` (labels and mask unchanged)."""
  def batch(key, x, y, mask, aux):
    del aux
    return augment(key, x, level=level, pad=pad, image_shape=image_shape, jitter=jitter,
                   value_range=value_range), y, mask
  return batch


# ----------------------------------------------------------------------------------------------
# data sampling


def sample_rows(key: jax.Array, mask: jax.Array, fraction: float) -> jax.Array:
  """The mask of a uniform subset of max(1, round(fraction n)) of the n real rows."""
  real = mask > 0
  n = jnp.sum(real.astype(jnp.int32))
  keep = jnp.maximum(1, jnp.round(fraction * n).astype(jnp.int32))
  u = jnp.where(real, jax.random.uniform(key, mask.shape), 2.0)
  rank = jnp.argsort(jnp.argsort(u))
  return jnp.where(real & (rank < keep), mask, jnp.zeros_like(mask))


def _sampling_data(fraction, key, x, y, mask, aux):
  del aux
  return x, y, sample_rows(key, mask, fraction)


def sampling_hook(fraction: float):
  """`data` hook of `sampling`: once per round, on the whole shard; a `jax.tree_util.Partial`
  over the fraction as a weakly typed array, so a jitted training that takes the hook as an
  operand (`fl.recording`) compiles once for every fraction of a sweep."""
  return jax.tree_util.Partial(_sampling_data, jnp.asarray(float(fraction)))
