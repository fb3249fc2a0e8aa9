"""Data defenses (mixup, augmentation, sampling), combine, and the one registry."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl_privacy import defenses
from fl_privacy import validate
from fl_privacy.defenses import data
from fl_privacy.fl import client
from fl_privacy.mechanisms import registry


def _batch(b=12, d=64, classes=4, seed=0):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.uniform(size=(b, d)), jnp.float32),
          jnp.asarray(rng.integers(0, classes, b), jnp.int32))


@pytest.mark.parametrize('jit', [False, True])
def test_mixup_mixes_labels_with_the_inputs_weight(jit):
  x, y = _batch()
  mask = jnp.asarray([1.0] * 9 + [0.0] * 3)
  fn = lambda k: data.mixup(k, x, y, mask, alpha=0.4, num_classes=4)
  xm, ym, mm, lam = (jax.jit(fn) if jit else fn)(jax.random.key(3))
  lam = float(lam)
  assert 0 < lam < 1
  np.testing.assert_array_equal(mm, mask)
  onehot = np.eye(4)[np.asarray(y)]
  xs, ys = np.asarray(x), onehot
  for i in range(9):
    # Find the partner j: the row whose mix with lambda reproduces row i (same weight for both).
    resid = [np.abs(np.asarray(xm[i]) - (lam * xs[i] + (1 - lam) * xs[j])).max()
             for j in range(12)]
    j = int(np.argmin(resid))
    assert resid[j] < 1e-5 and j < 9  # partners are real rows
    np.testing.assert_allclose(ym[i], lam * ys[i] + (1 - lam) * ys[j], atol=1e-6)
  np.testing.assert_allclose(np.asarray(ym).sum(1), 1.0, rtol=1e-6)


def test_mixup_public_code_keeps_inputs():
  x, y = _batch()
  hooks = defenses.make('mixup', alpha=1.0, num_classes=4, public_code=True)
  xm, ym, _ = hooks.batch(jax.random.key(0), x, y, None, None)
  np.testing.assert_array_equal(xm, x)
  assert ym.shape == (12, 4) and not np.allclose(ym, np.eye(4)[np.asarray(y)])


def test_real_permutation_is_a_permutation_of_real_rows():
  mask = jnp.asarray([1, 0, 1, 1, 0, 1, 1], jnp.float32)
  perms = [np.asarray(data.real_permutation(jax.random.key(i), mask)) for i in range(200)]
  real = np.flatnonzero(np.asarray(mask))
  for p in perms:
    assert sorted(p[real]) == list(real)
    np.testing.assert_array_equal(p[[1, 4]], [1, 4])
  # Uniform: row 0's partner takes each of the 5 real rows ~ 1/5 of the time.
  counts = np.bincount([p[0] for p in perms], minlength=7)[real]
  assert counts.min() > 200 / 5 - 5 * np.sqrt(200 * 0.2 * 0.8)


@pytest.mark.parametrize('level', [1, 2, 3, 4])
@pytest.mark.parametrize('jit', [False, True])
def test_augment_keeps_shapes_and_labels(level, jit):
  x, y = _batch()
  hooks = defenses.make('augment', level=level, pad=1, image_shape=(8, 8, 1))
  fn = jax.jit(hooks.batch) if jit else hooks.batch
  xa, ya, ma = fn(jax.random.key(level), x, y, None, None)
  assert xa.shape == x.shape and xa.dtype == x.dtype
  np.testing.assert_array_equal(ya, y)
  assert ma is None
  assert not np.allclose(xa, x)
  assert float(xa.min()) >= 0.0 and float(xa.max()) <= 1.0 + 1e-6


def test_augment_images_and_rotation_identity():
  imgs = jax.random.uniform(jax.random.key(0), (3, 16, 16, 3))
  out = data.augment(jax.random.key(1), imgs, level=4, pad=4)
  assert out.shape == imgs.shape
  np.testing.assert_allclose(data.rotate(imgs[0], 0.0), imgs[0], atol=1e-6)
  with pytest.raises(ValueError):
    data.augment(jax.random.key(1), jnp.zeros((2, 10)), level=1, pad=1, image_shape=(3, 3, 1))


@pytest.mark.parametrize('fraction', [0.1, 0.5, 1.0])
@pytest.mark.parametrize('jit', [False, True])
def test_sampling_keeps_the_fraction_of_real_rows(fraction, jit):
  mask = jnp.asarray([1.0] * 37 + [0.0] * 11)
  hooks = defenses.make('sampling', fraction=fraction)
  fn = jax.jit(hooks.data) if jit else hooks.data
  x = jnp.zeros((48, 3))
  _, _, kept = fn(jax.random.key(0), x, jnp.zeros(48, jnp.int32), mask, None)
  kept = np.asarray(kept)
  assert kept.sum() == max(1, round(fraction * 37))
  assert np.all(kept[37:] == 0)
  assert set(np.unique(kept)) <= {0.0, 1.0}


def test_combine_applies_both_and_identity_is_neutral():
  x, y = _batch()
  aug = defenses.make('augment', level=2, pad=1, image_shape=(8, 8, 1))
  samp = defenses.make('sampling', fraction=0.5)
  noise = defenses.make('update_noise', sigma=0.1)
  both = defenses.combine(aug, samp, noise, defenses.make('none'))
  assert both.batch is aug.batch and both.data is samp.data and both.upload is noise.upload
  key = jax.random.key(4)
  np.testing.assert_array_equal(both.batch(key, x, y, None, None)[0],
                                aug.batch(key, x, y, None, None)[0])
  two = defenses.combine(noise, noise)
  delta = {'w': jnp.zeros(1000)}
  out = np.asarray(two.upload(key, delta, None)['w'])
  assert abs(out.std() / (0.1 * np.sqrt(2)) - 1) < 5 / np.sqrt(2 * 1000)
  mixed = defenses.combine(aug, defenses.make('mixup', alpha=1.0, num_classes=4))
  xm, ym, _ = jax.jit(mixed.batch)(key, x, y, None, None)
  assert xm.shape == x.shape and ym.shape == (12, 4)
  with pytest.raises(ValueError):
    defenses.combine(defenses.make('dp_sgd', clip_norm=1.0, noise_multiplier=1.0),
                     defenses.make('dp_sgd', clip_norm=1.0, noise_multiplier=1.0))
  assert client.is_identity(defenses.combine(defenses.make('none')))


def test_every_name_builds_and_the_registry_covers_the_mechanisms():
  assert set(registry.NAMES) <= set(defenses.NAMES)
  for name in ('none', 'update_noise', 'sparsify', 'quantize', 'mixup', 'augment', 'sampling',
               'dp_sgd', 'update_dp', 'central_dp', 'weak_dp'):
    assert name in defenses.NAMES
  x, y = _batch()
  for name in ('bitrand', 'ome', 'gaussian'):
    kw = {'sigma': 0.5} if name == 'gaussian' else {'epsilon': 3.0}
    xb, yb, _ = defenses.make(name, **kw).batch(jax.random.key(0), x, y, None, None)
    ref = registry.randomizer(name, **kw)(jax.random.key(0), x)
    np.testing.assert_array_equal(xb, ref)  # the same draws as the mechanism itself
    np.testing.assert_array_equal(yb, y)


def test_bad_parameters_name_the_field():
  cases = [('nope', {}, 'defense.name'),
           ('sparsify', {'sparsity': 0.0}, 'defense.sparsity'),
           ('sparsify', {'sparsity': 1.5}, 'defense.sparsity'),
           ('quantize', {'bits': 0}, 'defense.bits'),
           ('dp_sgd', {'clip_norm': -1.0, 'noise_multiplier': 1.0}, 'defense.clip_norm'),
           ('dp_sgd', {'clip_norm': 1.0, 'noise_multiplier': -1.0}, 'defense.noise_multiplier'),
           ('sampling', {'fraction': 0.0}, 'defense.fraction'),
           ('augment', {'level': 5}, 'defense.level'),
           ('mixup', {'alpha': 0.0, 'num_classes': 3}, 'defense.alpha'),
           ('update_noise', {'sigma': 1.0, 'bits': 3}, 'defense.bits'),
           ('update_noise', {}, 'defense.sigma')]
  for name, kw, field in cases:
    with pytest.raises(validate.ConfigError, match=field.replace('.', r'\.')):
      defenses.make(name, **kw)
