"""Fast rule checks of the data defenses (mixup, crop, flips, rotation, colour jitter, sampling).

Each test is a few seconds: draws are vmapped over keys, and statistical tolerances are five
binomial standard deviations of the sample counts used.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import ndimage

from fl_privacy.defenses import data


def _keys(n, seed=0):
  return jax.random.split(jax.random.key(seed), n)


def _img(h=3, w=5, c=2):
  # Distinct, positive values: every crop window and flip is recognisable.
  return np.arange(1, h * w * c + 1, dtype=np.float32).reshape(h, w, c)


def _within(count, n, p):
  return abs(count - n * p) < 5 * np.sqrt(n * p * (1 - p))


# ----------------------------------------------------------------------------------------------
# augmentation parts


@pytest.mark.parametrize('pad', [1, 2])
def test_random_crop_offsets_are_uniform_over_the_padded_windows(pad):
  img, n = _img(), 2500
  out = np.asarray(jax.vmap(lambda k: data.random_crop(k, jnp.asarray(img), pad))(_keys(n)))
  padded = np.pad(img, ((pad, pad), (pad, pad), (0, 0)))
  windows = np.stack([padded[oy:oy + 3, ox:ox + 5] for oy in range(2 * pad + 1)
                      for ox in range(2 * pad + 1)])
  match = np.all(out[:, None] == windows[None], axis=(2, 3, 4))
  assert np.all(match.sum(1) == 1)  # every crop is exactly one window of the padded image
  counts = match.sum(0)  # (oy, ox) uniform over the 25 offsets, the two independent
  p = 1 / (2 * pad + 1) ** 2
  assert all(_within(c, n, p) for c in counts), counts
  np.testing.assert_array_equal(data.random_crop(jax.random.key(0), jnp.asarray(img), 0), img)


@pytest.mark.parametrize('axis', [0, 1])
def test_maybe_flip_flips_along_its_axis_half_the_time(axis):
  img, n = _img(), 1000
  out = np.asarray(jax.vmap(lambda k: data.maybe_flip(k, jnp.asarray(img), axis))(_keys(n)))
  same = np.all(out == img, axis=(1, 2, 3))
  flipped = np.all(out == np.flip(img, axis), axis=(1, 2, 3))
  assert np.all(same ^ flipped)
  assert _within(flipped.sum(), n, 0.5)


def test_rotate_matches_scipy_and_half_turn_flips_both_axes():
  img = np.asarray(jax.random.uniform(jax.random.key(1), (7, 9, 2)))
  # 180 degrees about the centre of a non-square image: both axes reversed, exactly.
  np.testing.assert_allclose(data.rotate(jnp.asarray(img), 180.0), img[::-1, ::-1], atol=1e-5)
  np.testing.assert_allclose(data.rotate(jnp.asarray(img), 0.0), img, atol=1e-6)
  # 30 degrees: scipy's bilinear rotation about the array centre, zero outside the image
  # (scipy's 'grid-constant' mode: it too interpolates towards the fill value past the edge).
  got = np.asarray(data.rotate(jnp.asarray(img), 30.0))
  want = ndimage.rotate(img, -30.0, axes=(0, 1), reshape=False, order=1, mode='grid-constant')
  np.testing.assert_allclose(got, want, atol=1e-5)
  assert np.all(got[0, -1] == 0)  # a corner rotated in from outside the image
  # A quarter turn of a square image is np.rot90 (clockwise in array coordinates).
  sq = img[:7, :7]
  np.testing.assert_allclose(data.rotate(jnp.asarray(sq), 90.0), np.rot90(sq, -1), atol=1e-5)


def _jitter_reference(img, b, c, s, lo, hi):
  img = np.clip(img * b, lo, hi)
  luma = np.array([0.299, 0.587, 0.114])
  grey = (img @ luma)[..., None] if img.shape[2] == 3 else img
  img = np.clip(grey.mean() + c * (img - grey.mean()), lo, hi)
  if img.shape[2] == 3:
    grey = (img @ luma)[..., None]
    img = np.clip(grey + s * (img - grey), lo, hi)
  return img


@pytest.mark.parametrize('channels', [1, 3])
def test_colour_jitter_is_torchvisions_formulas(channels):
  img = np.asarray(jax.random.uniform(jax.random.key(2), (4, 5, channels)), np.float64)
  strength, (lo, hi) = 0.4, (0.1, 0.9)
  clipped_above = False
  for seed in range(6):  # several draws, so that each clip (low and high) is reached
    key = jax.random.key(seed)
    got = np.asarray(data.colour_jitter(key, jnp.asarray(img, jnp.float32), strength, (lo, hi)))
    factors = [float(jax.random.uniform(k, (), minval=1 - strength, maxval=1 + strength))
               for k in jax.random.split(key, 3)]
    np.testing.assert_allclose(got, _jitter_reference(img, *factors, lo, hi), atol=1e-5)
    assert got.min() >= lo and got.max() <= hi
    clipped_above |= bool(np.any(img * factors[0] > hi))
  assert clipped_above
  # The factors are uniform on [1 - j, 1 + j]: brightness alone (contrast and saturation of a
  # constant image do nothing) scales a constant image by factor in [0.6, 1.4].
  flat = jnp.full((2, 2, channels), 0.5)
  scale = np.asarray(jax.vmap(lambda k: data.colour_jitter(k, flat, 0.4, (0.0, 10.0))[0, 0, 0])(
      _keys(2000))) / 0.5
  assert scale.min() >= 0.6 - 1e-6 and scale.max() <= 1.4 + 1e-6
  assert abs(scale.mean() - 1.0) < 5 * (0.8 / np.sqrt(12)) / np.sqrt(2000)
  assert scale.min() < 0.62 and scale.max() > 1.38


def _augment_reference(key, img, level, pad, jitter, value_range):
  keys = jax.random.split(key, 6)
  out = data.random_crop(keys[0], jnp.asarray(img, jnp.float32), pad)
  if level >= 2:
    out = data.maybe_flip(keys[1], out, 1)
  if level >= 3:
    out = data.maybe_flip(keys[2], out, 0)
    out = data.rotate(out, jax.random.uniform(keys[3], (), minval=-45.0, maxval=45.0))
  if level >= 4:
    out = data.colour_jitter(keys[4], out, jitter, value_range)
  return np.asarray(out)


@pytest.mark.parametrize('level', [1, 2, 3, 4])
def test_augment_composes_the_levels_per_example(level):
  # Flat [B, 12] inputs of image_shape (3, 4, 1) through the hook, bfloat16 kept.
  x = jax.random.uniform(jax.random.key(4), (3, 12)).astype(jnp.bfloat16)
  y = jnp.arange(3)
  key, jitter, value_range = jax.random.key(5), 0.2, (-0.5, 0.8)
  hook = data.augment_hook(level, 1, (3, 4, 1), jitter, value_range)
  got, y_out, mask = hook(key, x, y, 'mask', None)
  assert got.dtype == jnp.bfloat16 and got.shape == x.shape and y_out is y and mask == 'mask'
  for i in range(3):  # example i uses fold_in(key, i)
    want = _augment_reference(jax.random.fold_in(key, i), x[i].reshape(3, 4, 1), level, 1,
                              jitter, value_range)
    np.testing.assert_array_equal(np.asarray(got[i], np.float32),
                                  np.asarray(jnp.asarray(want).astype(jnp.bfloat16),
                                             np.float32).reshape(-1))
  # Its transformation does not depend on the batch size; [B, H, W] images get a channel.
  np.testing.assert_array_equal(
      data.augment(key, x[:2], level=level, pad=1, image_shape=(3, 4, 1), jitter=jitter,
                   value_range=value_range), got[:2])
  imgs = x.reshape(3, 3, 4)
  np.testing.assert_array_equal(
      data.augment(key, imgs, level=level, pad=1, jitter=jitter, value_range=value_range),
      got.reshape(3, 3, 4))
  np.testing.assert_array_equal(  # [B, H, W, C] images as they are
      data.augment(key, imgs[..., None], level=level, pad=1, jitter=jitter,
                   value_range=value_range), got.reshape(3, 3, 4, 1))


def test_augment_rejects_flat_inputs_without_a_matching_shape():
  x = jnp.zeros((2, 12))
  for shape in (None, (3, 3, 1), (2, 3, 1)):
    with pytest.raises(ValueError, match=rf'^flat inputs of 12 features need image_shape with '
                                         rf'that many entries \(got {re.escape(str(shape))}\)$'):
      data.augment(jax.random.key(0), x, level=1, pad=1, image_shape=shape)


# ----------------------------------------------------------------------------------------------
# mixup


def _partners(xm):
  """The partner of each row of x' = lam eye + (1 - lam) eye[perm], read off the matrix."""
  off = np.where(np.eye(len(xm)) > 0, -1.0, np.asarray(xm, np.float64))
  return np.where(off.max(1) > 1e-4, np.argmax(off, axis=1), np.arange(len(xm)))


@pytest.mark.parametrize('masked', [False, True])
def test_mixup_mixes_inputs_and_labels_with_one_beta_weight(masked):
  alpha, b = 0.4, 6
  mask = jnp.asarray([1, 1, 0, 1, 1, 0], jnp.float32) if masked else None
  real = [0, 1, 3, 4] if masked else list(range(b))
  # Row i = e_i (and two zero columns, so that x is not square): its partner is readable.
  x = jnp.concatenate([jnp.eye(b), jnp.zeros((b, 2))], axis=1).astype(jnp.bfloat16)
  for seed in range(3):
    key = jax.random.key(seed)
    xm, ym, mm, lam = data.mixup(key, x, jnp.arange(b), mask, alpha=alpha, num_classes=b)
    assert mm is mask and xm.dtype == jnp.bfloat16 and ym.dtype == jnp.float32
    lam = float(lam)
    # lambda is the documented Beta(alpha, alpha) draw of the first half of the key.
    assert lam == float(jax.random.beta(jax.random.split(key)[0], alpha, alpha))
    assert 1e-3 < lam < 1 - 1e-3 and abs(lam - 0.5) > 1e-2
    assert xm.shape == (b, b + 2)
    perm = _partners(np.asarray(xm, np.float32)[:, :b])
    want = lam * np.eye(b) + (1 - lam) * np.eye(b)[perm]
    np.testing.assert_allclose(np.asarray(xm, np.float32)[:, :b], want, atol=1e-2)  # bfloat16
    assert np.all(np.asarray(xm, np.float32)[:, b:] == 0)
    np.testing.assert_allclose(ym, want, atol=1e-6)
    assert sorted(perm[real]) == real
    assert all(perm[i] == i for i in range(b) if i not in real)


def test_real_permutation_is_uniform_over_the_real_rows():
  n = 2000
  mask = jnp.asarray([1, 0, 1, 1, 0, 1, 1], jnp.float32)
  perms = np.asarray(jax.vmap(lambda k: data.real_permutation(k, mask))(_keys(n)))
  assert perms.dtype == np.int32
  real = [0, 2, 3, 5, 6]
  assert all(sorted(p[real]) == real for p in perms)
  np.testing.assert_array_equal(perms[:, [1, 4]], np.tile([1, 4], (n, 1)))
  pairs = np.zeros((7, 7))
  np.add.at(pairs, (np.tile(np.arange(7), n), perms.ravel()), 1)
  assert all(_within(pairs[i, j], n, 1 / 5) for i in real for j in real), pairs
  # Without padding every row is real.
  full = np.asarray(jax.vmap(lambda k: data.real_permutation(k, jnp.ones(4)))(_keys(400)))
  assert np.all(np.sort(full, axis=1) == np.arange(4))
  assert all(_within(c, 400, 1 / 4) for c in np.bincount(full[:, 0], minlength=4))


def test_mixup_soft_labels_hook_and_public_code():
  soft = np.asarray(jax.nn.softmax(jax.random.normal(jax.random.key(6), (6, 3))))
  key = jax.random.key(1)
  xm, ym, _, lam = data.mixup(key, jnp.eye(6), jnp.asarray(soft), None, alpha=1.0,
                              num_classes=3)
  perm, lam = _partners(xm), float(lam)
  np.testing.assert_allclose(ym, lam * soft + (1 - lam) * soft[perm], atol=1e-6)
  assert data.one_hot_labels(jnp.asarray(soft), 3).dtype == jnp.float32
  np.testing.assert_array_equal(data.one_hot_labels(jnp.asarray(soft, jnp.bfloat16), 3),
                                jnp.asarray(soft, jnp.bfloat16).astype(jnp.float32))
  np.testing.assert_array_equal(data.one_hot_labels(jnp.asarray([2, 0]), 4),
                                np.eye(4, dtype=np.float32)[[2, 0]])
  # The hook passes every parameter on: the same draw as mixup itself.
  x, y = jax.random.uniform(jax.random.key(7), (5, 3)), jnp.asarray([0, 2, 1, 1, 0])
  mask = jnp.asarray([1.0, 1.0, 1.0, 0.0, 1.0])
  for public in (False, True):
    got = data.mixup_hook(0.3, 4, public)(key, x, y, mask, None)
    want = data.mixup(key, x, y, mask, alpha=0.3, num_classes=4, public_code=public)[:3]
    for g, w in zip(got, want):
      np.testing.assert_array_equal(g, w)
  # By default the hook mixes the inputs too (public_code False).
  np.testing.assert_array_equal(data.mixup_hook(0.3, 4)(key, x, y, mask, None)[0],
                                data.mixup(key, x, y, mask, alpha=0.3, num_classes=4)[0])
  xs, ys, _, _ = data.mixup(key, x, y, mask, alpha=0.3, num_classes=4, public_code=True)
  assert xs is x and ys.shape == (5, 4)


# ----------------------------------------------------------------------------------------------
# sampling


def test_sample_rows_is_uniform_over_real_rows_and_keeps_mask_values():
  mask = jnp.asarray([0.5, 0.0, 2.0, 1.0, 0.0, 1.0, 1.0, 3.0, 1.0, 0.0])
  real = np.asarray(mask) > 0
  n = 700
  for fraction, keep in ((0.3, 2), (0.01, 1), (1.0, 7), (0.5, 4)):  # round(3.5) = 4 (to even)
    kept = np.asarray(jax.vmap(lambda k, f=fraction: data.sample_rows(k, mask, f))(_keys(n)))
    assert np.all((kept == 0) | (kept == np.asarray(mask)))
    assert np.all((kept > 0).sum(1) == keep)
    counts = (kept > 0).sum(0)
    assert np.all(counts[~real] == 0)
    if keep < 7:
      assert all(_within(c, n, keep / 7) for c in counts[real]), (fraction, counts)
  hook = data.sampling_hook(0.3)
  key = jax.random.key(9)
  x, y = jnp.zeros((10, 2)), jnp.zeros(10)
  xo, yo, mo = hook(key, x, y, mask, None)
  assert xo is x and yo is y
  np.testing.assert_array_equal(mo, data.sample_rows(key, mask, 0.3))
