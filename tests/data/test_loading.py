"""Every loader: digits, synthetic, npz, TFDS (on tfds.testing.mock_data), offline failure."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow_datasets as tfds
from sklearn.datasets import load_digits as sk_load_digits
from tensorflow_datasets.core import dataset_builder

from fl_privacy.data import DATASETS, DataUnavailableError, load, validate_data_config
from fl_privacy.data import local_sources, tfds_source
from fl_privacy.validate import ConfigError


def test_digits_are_the_real_1797_images():
  splits = load({'name': 'digits'})
  train, test = splits['train'], splits['test']
  assert (len(train), len(test)) == (1438, 359)
  assert train.x.shape[1:] == (8, 8, 1) and train.x.dtype == np.uint8
  assert train.num_classes == 10 and train.y.dtype == np.int32
  # Together the two splits are exactly sklearn's images (0..16 scaled to 0..255).
  sk = sk_load_digits()
  ours = np.concatenate([train.x, test.x])[..., 0].reshape(1797, -1)
  np.testing.assert_array_equal(
      np.sort(ours.view(np.dtype((np.void, 64))).ravel()),
      np.sort(local_sources.digits_to_uint8(sk.data).astype(np.uint8)
              .view(np.dtype((np.void, 64))).ravel()))
  np.testing.assert_array_equal(np.bincount(np.concatenate([train.y, test.y])),
                                np.bincount(sk.target))
  assert train.x.max() == 255 and train.x.min() == 0
  np.testing.assert_array_equal(local_sources.digits_to_uint8(np.array([0, 8, 16])),
                                [0, 128, 255])


def test_digits_split_is_deterministic_and_capped():
  a, b = load({'name': 'digits'}), load({'name': 'digits', 'max_examples': 100})
  np.testing.assert_array_equal(a['test'].x, load({'name': 'digits'})['test'].x)
  assert len(b['train']) == 100 and len(b['test']) == 100
  np.testing.assert_array_equal(b['train'].x, a['train'].x[:100])


def test_image_size_resizes_local_sources():
  splits = load({'name': 'digits', 'image_size': 16, 'max_examples': 5})
  assert splits['train'].x.shape == (5, 16, 16, 1)


def test_synthetic_images_and_features():
  img = load({'name': 'synthetic', 'num_examples': 64, 'num_classes': 3,
              'shape': (6, 6, 2), 'seed': 1})
  assert img['train'].x.shape == (64, 6, 6, 2) and img['train'].x.dtype == np.uint8
  assert set(np.unique(img['train'].y)) <= {0, 1, 2}
  feats = load({'name': 'synthetic', 'num_examples': 300, 'num_classes': 2,
                'shape': (4,), 'seed': 1})
  tr, te = feats['train'], feats['test']
  assert tr.x.shape == (300, 4) and tr.x.dtype == np.float32
  # Blobs are class-conditional: nearest class mean (estimated on train) beats chance.
  means = np.stack([tr.x[tr.y == c].mean(0) for c in range(2)])
  pred = np.argmin(((te.x[:, None] - means[None]) ** 2).sum(-1), 1)
  assert np.mean(pred == te.y) > 0.7
  again = load({'name': 'synthetic', 'num_examples': 300, 'num_classes': 2,
                'shape': (4,), 'seed': 1})
  np.testing.assert_array_equal(again['train'].x, tr.x)


def test_npz_with_and_without_test_split(tmp_path):
  rng = np.random.default_rng(0)
  x = rng.integers(0, 256, (20, 5, 5), dtype=np.uint8)
  y = np.arange(20) % 4
  path = tmp_path / 'mine.npz'
  np.savez(path, images=x, labels=y, images_test=x[:3], labels_test=y[:3])
  splits = load({'name': 'npz', 'path': str(path)})
  assert splits['train'].x.shape == (20, 5, 5, 1) and len(splits['test']) == 3
  assert splits['train'].num_classes == 4
  path2 = tmp_path / 'feats.npz'
  np.savez(path2, x=rng.standard_normal((10, 3)), y=np.arange(10) % 2, num_classes=5)
  splits = load({'name': 'npz', 'path': str(path2)})
  assert (len(splits['train']), len(splits['test'])) == (8, 2)
  assert splits['train'].x.dtype == np.float32 and splits['train'].num_classes == 5


@pytest.mark.parametrize('arrays,match', [
    ({'labels': np.zeros(3, int)}, 'images'),
    ({'images': np.zeros((3, 4, 4), np.uint8)}, 'labels'),
    ({'images': np.zeros((3, 4, 4), np.uint8), 'labels': np.zeros(2, int)}, 'shape'),
    ({'x': np.zeros((3, 4, 4), np.float32), 'y': np.zeros(3, int)}, 'uint8'),
    ({'x': np.zeros((3, 2)), 'y': np.zeros(3, int), 'x_test': np.zeros((2, 2))}, 'both'),
    ({'x': np.zeros((3, 2)), 'y': np.zeros(3, int), 'x_test': np.zeros((2, 5)),
      'y_test': np.zeros(2, int)}, 'match'),
    ({'x': np.zeros((3, 2)), 'y': np.array([0.5, 1, 0])}, 'integers'),
    ({'x': np.zeros((3, 2)), 'y': np.zeros(3, int), 'images': np.zeros((3, 2))}, 'keep one'),
])
def test_npz_bad_files_raise_clear_errors(tmp_path, arrays, match):
  path = tmp_path / 'bad.npz'
  np.savez(path, **arrays)
  with pytest.raises(ValueError, match=match):
    load({'name': 'npz', 'path': str(path)})


@pytest.mark.parametrize('cfg,field', [
    ({'name': 'mnist2'}, 'data.name'),
    ({}, 'data.name'),
    ({'name': 'npz'}, 'data.path'),
    ({'name': 'npz', 'path': '/no/such/file.npz'}, 'data.path'),
    ({'name': 'digits', 'max_examples': 0}, 'data.max_examples'),
    ({'name': 'digits', 'image_size': 2.5}, 'data.image_size'),
    ({'name': 'celeb_a', 'attribute': 'Grinning'}, 'data.attribute'),
    ({'name': 'synthetic', 'num_classes': 1}, 'data.num_classes'),
    ({'name': 'synthetic', 'shape': (4, 4)}, 'data.shape'),
    ({'name': 'cifar10', 'data_dir': 3}, 'data.data_dir'),
    ({'name': 'digits', 'path': 'x.npz'}, 'data.path'),
    ({'name': 'digits', 'data_dir': '/tfds'}, 'data.data_dir'),
    ({'name': 'npz', 'path': 'x.npz', 'data_dir': '/tfds'}, 'data.data_dir'),
])
def test_validate_data_config_names_the_field(cfg, field):
  with pytest.raises(ConfigError) as err:
    validate_data_config(cfg)
  assert err.value.field == field


def test_validate_accepts_every_known_name_with_defaults(tmp_path):
  path = tmp_path / 'ok.npz'
  np.savez(path, x=np.zeros((2, 2)), y=np.zeros(2, int))
  for name in DATASETS:
    validate_data_config({'name': name, 'path': str(path)} if name == 'npz' else {'name': name})


def test_validate_accepts_config_dict():
  ml_collections = pytest.importorskip('ml_collections')
  cfg = ml_collections.ConfigDict({'name': 'digits', 'data_dir': None, 'max_examples': 10})
  validate_data_config(cfg)
  assert len(load(cfg)['train']) == 10


@pytest.fixture
def prepared(monkeypatch):
  # mock_data serves data_source but leaves the builder unprepared (no files); mark
  # it prepared so load() takes its normal path.
  monkeypatch.setattr(dataset_builder.DatasetBuilder, 'is_prepared', lambda self: True)


@pytest.mark.parametrize('name,shape', [('mnist', (28, 28, 1)), ('cifar10', (32, 32, 3)),
                                        ('svhn_cropped', (32, 32, 3))])
def test_tfds_loader_on_mock_data(prepared, name, shape):
  with tfds.testing.mock_data(num_examples=6):
    splits = load({'name': name, 'data_dir': '/tmp/fl_privacy_mock'})
  assert set(splits) == set(tfds_source.SPLITS[name])
  for split, ds in splits.items():
    assert ds.x.shape == (6,) + shape and ds.x.dtype == np.uint8
    assert ds.y.dtype == np.int32 and ds.num_classes == 10
    assert ds.y.min() >= 0 and ds.y.max() < 10
    assert ds.name == f'{name}/{split}'


def test_tfds_celeb_a_keeps_attributes_and_resizes(prepared):
  with tfds.testing.mock_data(num_examples=4):
    splits = load({'name': 'celeb_a', 'attribute': 'Male', 'image_size': 16,
                   'max_examples': 3})
  assert set(splits) == {'train', 'validation', 'test'}
  ds = splits['train']
  assert ds.x.shape == (3, 16, 16, 3) and ds.num_classes == 2
  assert set(ds.attributes) == set(tfds_source.CELEBA_ATTRIBUTES)
  assert len(ds.attributes) == 40
  np.testing.assert_array_equal(ds.y, ds.attributes['Male'].astype(np.int32))


def test_tfds_imagenette_resizes_to_default(prepared):
  with tfds.testing.mock_data(num_examples=2):
    splits = load({'name': 'imagenette'})
  assert set(splits) == {'train', 'validation'}
  assert splits['train'].x.shape == (2, 64, 64, 3)


def test_unprepared_tfds_dataset_fails_without_downloading(tmp_path, monkeypatch):
  def no_network(*args, **kwargs):
    raise AssertionError('a download was attempted')
  monkeypatch.setattr(dataset_builder.DatasetBuilder, 'download_and_prepare', no_network)
  monkeypatch.setattr(tfds, 'data_source', no_network)
  for name in ('cifar10', 'celeb_a'):
    with pytest.raises(DataUnavailableError) as err:
      load({'name': name, 'data_dir': str(tmp_path)})
    message = str(err.value)
    assert name in message and str(tmp_path) in message and 'tfds build' in message
  assert isinstance(err.value, RuntimeError)
