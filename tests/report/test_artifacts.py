"""The per-point artifact store and per-point keys."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from fl_privacy import report
from fl_privacy.report import artifacts


def _key_data(k):
  return np.asarray(jax.random.key_data(k))


def test_point_key_depends_only_on_params():
  key = jax.random.key(0)
  a = report.point_key(key, {'M': 4, 'optimizer': 'sgd'})
  b = report.point_key(key, {'optimizer': 'sgd', 'M': 4})  # order of the dict is irrelevant
  c = report.point_key(key, {'M': 4.0, 'optimizer': 'sgd'})  # integral float = int
  d = report.point_key(key, {'M': 8, 'optimizer': 'sgd'})
  e = report.point_key(jax.random.key(1), {'M': 4, 'optimizer': 'sgd'})
  np.testing.assert_array_equal(_key_data(a), _key_data(b))
  np.testing.assert_array_equal(_key_data(a), _key_data(c))
  assert not np.array_equal(_key_data(a), _key_data(d))
  assert not np.array_equal(_key_data(a), _key_data(e))


def test_point_key_is_stable_across_processes():
  # SHA-256 of the canonical JSON, not Python's salted hash(): a fixed value.
  assert artifacts.canonical_json({'b': 1.0, 'a': None, 'c': 'x'}) == '{"a":null,"b":1,"c":"x"}'
  assert artifacts.params_digest({'p': 0.5})[:8] == (
      __import__('hashlib').sha256(b'{"p":0.5}').hexdigest()[:8])


def test_point_key_of_numpy_values():
  key = jax.random.key(3)
  a = report.point_key(key, {'eps': np.float32(2.5), 'k': np.int64(3)})
  b = report.point_key(key, {'eps': 2.5, 'k': 3})
  np.testing.assert_array_equal(_key_data(a), _key_data(b))


def test_round_trip_and_missing(tmp_path):
  store = report.ArtifactStore(tmp_path, 'draws')
  params = {'mechanism': 'bitrand', 'epsilon': 5.0}
  assert store.load(params) is None
  arrays = {'target': np.arange(5, dtype=np.float32), 'other': np.ones((2, 3))}
  path = store.save(params, arrays)
  assert os.path.dirname(path) == os.path.join(tmp_path, 'draws')
  got = store.load(params)
  assert set(got) == {'target', 'other'}
  np.testing.assert_array_equal(got['target'], arrays['target'])
  np.testing.assert_array_equal(got['other'], arrays['other'])
  assert store.load({'mechanism': 'bitrand', 'epsilon': 6.0}) is None
  # No temp files left behind.
  assert os.listdir(os.path.join(tmp_path, 'draws')) == [os.path.basename(path)]


def test_corrupt_file_is_none_and_reported(tmp_path, caplog):
  store = report.ArtifactStore(tmp_path, 'x')
  params = {'a': 1}
  path = store.save(params, {'v': np.zeros(3)})
  with open(path, 'wb') as f:
    f.write(b'not a zip file')
  with caplog.at_level('WARNING'):
    assert store.load(params) is None
  assert 'unreadable' in caplog.text


def test_foreign_file_is_never_returned(tmp_path, caplog):
  store = report.ArtifactStore(tmp_path, 'x')
  other = store.save({'a': 2}, {'v': np.full(3, 2.0)})
  # A file of another point copied to this point's name must not be read as this point's.
  os.replace(other, store.path({'a': 1}))
  with caplog.at_level('WARNING'):
    assert store.load({'a': 1}) is None
  assert 'belongs to params' in caplog.text


def test_reserved_and_bad_names(tmp_path):
  store = report.ArtifactStore(tmp_path, 'x')
  with pytest.raises(ValueError):
    store.save({'a': 1}, {artifacts.PARAMS_ENTRY: np.zeros(1)})
  with pytest.raises(ValueError):
    report.ArtifactStore(tmp_path, '../up')
