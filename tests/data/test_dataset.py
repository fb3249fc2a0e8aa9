"""Dataset container, to_float and rng_from_key."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fl_privacy.data import Dataset, rng_from_key, to_float


def _images(n=6):
  x = np.arange(n * 4 * 4 * 3, dtype=np.int64).reshape(n, 4, 4, 3) % 256
  return Dataset(x=x.astype(np.uint8), y=np.arange(n, dtype=np.int32) % 2, num_classes=2,
                 name='toy', attributes={'a': np.arange(n) % 3 == 0})


def test_image_dataset_properties_and_subset():
  ds = _images()
  assert ds.is_image and len(ds) == 6
  sub = ds.subset(np.array([4, 1]))
  np.testing.assert_array_equal(sub.x, ds.x[[4, 1]])
  np.testing.assert_array_equal(sub.y, ds.y[[4, 1]])
  np.testing.assert_array_equal(sub.attributes['a'], ds.attributes['a'][[4, 1]])
  assert (sub.num_classes, sub.name) == (2, 'toy')
  assert len(ds.subset(slice(0, 3))) == 3


def test_feature_dataset_is_not_image():
  ds = Dataset(x=np.zeros((3, 5), np.float32), y=np.zeros(3, np.int32), num_classes=1,
               name='f')
  assert not ds.is_image and ds.attributes is None


@pytest.mark.parametrize('x,y', [
    (np.zeros((3, 4, 4, 1), np.uint8), np.zeros(2, np.int32)),  # Length mismatch.
    (np.zeros((3, 4, 4, 1), np.float32), np.zeros(3, np.int32)),  # Float images.
    (np.zeros((3, 4, 4), np.uint8), np.zeros(3, np.int32)),  # Not NHWC.
])
def test_dataset_rejects_bad_arrays(x, y):
  with pytest.raises(ValueError):
    Dataset(x=x, y=y, num_classes=2, name='bad')


def test_to_float_scales_uint8_only():
  x = np.array([0, 51, 255], np.uint8)
  np.testing.assert_allclose(to_float(x), [0.0, 0.2, 1.0], rtol=1e-6)
  assert to_float(x).dtype == np.float32
  np.testing.assert_array_equal(to_float(np.array([3.0, -2.0])), [3.0, -2.0])


def test_rng_from_key_is_a_function_of_the_key():
  key = jax.random.key(7)
  a = rng_from_key(key).integers(0, 2**31, 8)
  b = rng_from_key(jax.random.key(7)).integers(0, 2**31, 8)
  c = rng_from_key(jax.random.fold_in(key, 1)).integers(0, 2**31, 8)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  # Legacy raw uint32 keys carry the same words as typed ones.
  legacy = rng_from_key(jax.random.key_data(key)).integers(0, 2**31, 8)
  np.testing.assert_array_equal(a, legacy)
