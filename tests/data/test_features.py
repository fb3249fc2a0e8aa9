"""Feature extractors: shapes, batching, caching, ResNet-18 weights loading."""

from __future__ import annotations

import logging

import jax
import numpy as np
import pytest

from fl_privacy.data import Dataset, extractors, features, load


def _images(n=10, size=16, channels=3, seed=0):
  rng = np.random.default_rng(seed)
  return Dataset(x=rng.integers(0, 256, (n, size, size, channels), dtype=np.uint8),
                 y=(np.arange(n) % 3).astype(np.int32), num_classes=3, name=f'toy{seed}')


def test_identity_flattens_and_scales():
  ds = _images(4)
  f = features.extract(ds, 'identity', key=jax.random.key(0), scale=2.0)
  assert f.shape == (4, 16 * 16 * 3) and f.dtype == np.float32
  np.testing.assert_allclose(f, ds.x.reshape(4, -1) / 255.0 * 2.0, rtol=1e-6)
  vec = Dataset(x=np.ones((3, 5), np.float32), y=np.zeros(3, np.int32), num_classes=1,
                name='v')
  assert features.extract(vec, 'identity', key=jax.random.key(0)).shape == (3, 5)


def test_unknown_extractor_and_missing_public_raise():
  with pytest.raises(ValueError):
    features.extract(_images(2), 'vgg', key=jax.random.key(0))
  with pytest.raises(ValueError, match='public'):
    features.extract(_images(2), 'cnn', key=jax.random.key(0))


def test_cnn_features_learn_and_are_cached_per_key(tmp_path, monkeypatch):
  splits = load({'name': 'digits'})
  public, target = splits['train'], splits['test']
  kw = dict(key=jax.random.key(1), cache_dir=str(tmp_path), public=public, epochs=3,
            embed_dim=16, batch_size=64)
  first = features.extract(target, 'cnn', **kw)
  assert first.shape == (len(target), 16) and first.dtype == np.float32
  assert np.all(first >= 0)  # ReLU layer.
  assert len(list(tmp_path.glob('cnn-*.npy'))) == 1
  # Features of a network trained on public digits separate held-out classes far
  # above chance (0.1) with a nearest-class-mean rule fitted on half of them.
  fit, ev = np.arange(len(target)) % 2 == 0, np.arange(len(target)) % 2 == 1
  means = np.stack([first[fit & (target.y == c)].mean(0) for c in range(10)])
  pred = np.argmin(((first[ev][:, None] - means[None]) ** 2).sum(-1), 1)
  assert np.mean(pred == target.y[ev]) > 0.5

  def fail(*args, **kwargs):
    raise AssertionError('recomputed despite a cached result')
  with monkeypatch.context() as m:
    m.setattr(features, '_compute', fail)
    np.testing.assert_array_equal(features.extract(target, 'cnn', **kw), first)
  # Another key trains another network: a new cache entry, not the old one.
  kw['key'] = jax.random.key(2)
  other = features.extract(target, 'cnn', **kw)
  assert len(list(tmp_path.glob('cnn-*.npy'))) == 2
  assert not np.allclose(other, first)
  assert not list(tmp_path.glob('*.tmp'))


def test_resnet18_has_torchvision_parameter_count():
  # torchvision resnet18: 11,689,512 parameters, of which fc holds 512*1000 + 1000.
  shapes = extractors.resnet18_shapes()
  n = sum(int(np.prod(s)) for k, s in shapes.items() if k.startswith('params/'))
  assert n == 11_689_512 - 513_000


def _to_torchvision(flat):
  """Inverse of extractors.from_torchvision, written independently for the test."""
  out = {}
  for name, value in flat.items():
    collection, *module, leaf = name.split('/')
    module = '.'.join(module).replace('_', '.').replace('downsample.conv', 'downsample.0')
    module = module.replace('downsample.bn', 'downsample.1')
    if leaf == 'kernel':
      out[f'{module}.weight'] = value.transpose(3, 2, 0, 1)
    else:
      out[f'{module}.' + {'scale': 'weight', 'bias': 'bias', 'mean': 'running_mean',
                          'var': 'running_var'}[leaf]] = value
  out['fc.weight'] = np.zeros((1000, 512), np.float32)
  out['bn1.num_batches_tracked'] = np.array(1)
  return out


def test_resnet18_loads_both_weight_conventions(tmp_path):
  ds = _images(3, size=16, channels=1)
  variables = extractors.init_resnet18(jax.random.key(5))
  # Non-trivial running statistics so that a mix-up of mean/var would show.
  flat = extractors.flatten_variables(variables)
  rng = np.random.default_rng(0)
  for k in flat:
    if k.endswith('/mean'):
      flat[k] = rng.normal(0, 0.1, flat[k].shape).astype(np.float32)
    if k.endswith('/var'):
      flat[k] = rng.uniform(0.5, 2.0, flat[k].shape).astype(np.float32)
  expected = features.resnet18_features(ds.x, extractors.unflatten_variables(flat), 2)
  assert expected.shape == (3, 512)
  np.savez(tmp_path / 'flax.npz', **flat)
  np.savez(tmp_path / 'torch.npz', **_to_torchvision(flat))
  for name in ('flax.npz', 'torch.npz'):
    got = features.extract(ds, 'resnet18', key=jax.random.key(0),
                           weights=str(tmp_path / name), batch_size=2)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
  del flat['params/conv1/kernel']
  np.savez(tmp_path / 'bad.npz', **flat)
  with pytest.raises(ValueError, match='lack'):
    features.extract(ds, 'resnet18', key=jax.random.key(0), weights=str(tmp_path / 'bad.npz'))


def test_resnet18_without_weights_warns_and_is_batch_size_invariant(tmp_path, caplog):
  ds = _images(5, size=16)
  with caplog.at_level(logging.WARNING):
    a = features.extract(ds, 'resnet18', key=jax.random.key(0), batch_size=2,
                         cache_dir=str(tmp_path))
  assert any('UNTRAINED' in r.getMessage() for r in caplog.records)
  assert a.shape == (5, 512) and np.all(np.isfinite(a))
  b = features.resnet18_features(ds.x, extractors.init_resnet18(jax.random.key(0)), 8)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert len(list(tmp_path.glob('resnet18-*.npy'))) == 1


def test_cache_key_depends_on_content_not_identity():
  a, b = _images(4, seed=0), _images(4, seed=1)
  same = Dataset(x=a.x.copy(), y=a.y, num_classes=3, name=a.name)
  k = jax.random.key(0)
  assert features.cache_key(a, 'cnn', {}, key=k) == features.cache_key(same, 'cnn', {}, key=k)
  b = Dataset(x=b.x, y=b.y, num_classes=3, name=a.name)
  assert features.cache_key(a, 'cnn', {}, key=k) != features.cache_key(b, 'cnn', {}, key=k)
  assert (features.cache_key(a, 'cnn', {'epochs': 1}, key=k)
          != features.cache_key(a, 'cnn', {'epochs': 2}, key=k))
