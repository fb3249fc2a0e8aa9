"""Jobs and their results as data: a tagged JSON encoding, no pickle.

A Flower run carries its `jobs.Job` inside the run (the run config's `job` entry, which
Flower hands the ServerApp and every node's ClientApp) and its ServerApp's return back as a
file of the same encoding: nothing is unpickled, and nothing is read from a path a job
names. `dumps(obj)` is JSON (zlib-compressed, base64 text, so that it fits a TOML string);
`loads(text)` rebuilds it from these types only:

- None, bool, int, float (NaN and infinities kept), str, list, and dict with str keys;
- tuple, bytes, dict with other keys (as [key, value] pairs);
- numpy arrays and scalars (`np.save` bytes, `allow_pickle=False`: bit for bit; a JAX
  array comes back as numpy);
- dataclass instances and `ml_collections.ConfigDict`s, by their init fields: a dataclass is
  rebuilt only when its module sits in one of `TRUSTED_PACKAGES` (this repository's
  packages), so a payload can name no other callable.

Anything else raises TypeError naming where it sits.
"""

from __future__ import annotations

import base64
import dataclasses
import importlib
import io
import json
import zlib
from typing import Any, Mapping

import numpy as np

# Packages whose dataclasses (and job parts) a payload may name.
TRUSTED_PACKAGES = ('fl_privacy', 'tests_engines', 'benchmarks')
_TAG = '__t'


def trusted_module(name: str) -> bool:
  """Whether `name` is a module of `TRUSTED_PACKAGES` (a dotted identifier path)."""
  parts = str(name).split('.')
  return parts[0] in TRUSTED_PACKAGES and all(p.isidentifier() for p in parts)


def _array(value: np.ndarray) -> str:
  if value.dtype == object:
    raise TypeError('object arrays are not encoded')
  buf = io.BytesIO()
  np.save(buf, value, allow_pickle=False)
  return base64.b64encode(buf.getvalue()).decode('ascii')


def encode(obj: Any, where: str = 'job') -> Any:
  """`obj` as JSON-able values (module docstring)."""
  if obj is None or isinstance(obj, (bool, str)):
    return obj
  if isinstance(obj, np.generic):
    return {_TAG: 'scalar', 'v': _array(np.asarray(obj))}
  if isinstance(obj, (int, float)):
    return obj
  if isinstance(obj, np.ndarray) or type(obj).__module__.startswith(('jax', 'jaxlib')):
    try:
      return {_TAG: 'array', 'v': _array(np.asarray(obj))}
    except TypeError as e:
      raise TypeError(f'{where}: {e}') from e
  if isinstance(obj, bytes):
    return {_TAG: 'bytes', 'v': base64.b64encode(obj).decode('ascii')}
  if isinstance(obj, list):
    return [encode(v, f'{where}[{i}]') for i, v in enumerate(obj)]
  if isinstance(obj, tuple):
    return {_TAG: 'tuple', 'v': [encode(v, f'{where}[{i}]') for i, v in enumerate(obj)]}
  if type(obj).__module__.startswith('ml_collections'):
    return {_TAG: 'config', 'v': {str(k): encode(v, f'{where}.{k}') for k, v in obj.items()}}
  if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
    cls = type(obj)
    return {_TAG: 'dataclass', 'type': f'{cls.__module__}:{cls.__qualname__}',
            'v': {f.name: encode(getattr(obj, f.name), f'{where}.{f.name}')
                  for f in dataclasses.fields(obj) if f.init}}
  if isinstance(obj, Mapping):
    if all(isinstance(k, str) and k != _TAG for k in obj):
      return {k: encode(v, f'{where}[{k!r}]') for k, v in obj.items()}
    return {_TAG: 'dict', 'v': [[encode(k, f'{where} key'), encode(v, f'{where}[{k!r}]')]
                                for k, v in obj.items()]}
  raise TypeError(f'{where}: a {type(obj).__module__}.{type(obj).__qualname__} cannot be '
                  'encoded (None, bool, int, float, str, bytes, list, tuple, dict, numpy '
                  'arrays, ConfigDicts and dataclasses of this repository can)')


def _dataclass(name: str) -> type:
  module, _, qualname = str(name).partition(':')
  if not trusted_module(module):
    raise ValueError(f'a payload names {name!r}: only dataclasses of {TRUSTED_PACKAGES} are '
                     'rebuilt')
  obj: Any = importlib.import_module(module)
  for attr in qualname.split('.'):
    obj = getattr(obj, attr)
  if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
    raise ValueError(f'a payload names {name!r}, which is not a dataclass')
  return obj


def decode(obj: Any) -> Any:
  """The inverse of `encode`."""
  if isinstance(obj, list):
    return [decode(v) for v in obj]
  if not isinstance(obj, dict):
    return obj
  tag = obj.get(_TAG)
  if tag is None:
    return {k: decode(v) for k, v in obj.items()}
  value = obj['v']
  if tag in ('array', 'scalar'):
    array = np.load(io.BytesIO(base64.b64decode(value)), allow_pickle=False)
    return array[()] if tag == 'scalar' else array
  if tag == 'bytes':
    return base64.b64decode(value)
  if tag == 'tuple':
    return tuple(decode(v) for v in value)
  if tag == 'dict':
    return {_hashable(decode(k)): decode(v) for k, v in value}
  if tag == 'config':
    import ml_collections  # pylint: disable=import-outside-toplevel
    return ml_collections.ConfigDict({k: decode(v) for k, v in value.items()})
  if tag == 'dataclass':
    return _dataclass(obj['type'])(**{k: decode(v) for k, v in value.items()})
  raise ValueError(f'unknown tag {tag!r} in a payload')


def _hashable(key: Any) -> Any:
  return key.item() if isinstance(key, np.generic) else key


def dumps(obj: Any) -> str:
  """`obj` encoded (module docstring): zlib-compressed JSON as base64 text."""
  text = json.dumps(encode(obj), separators=(',', ':'), allow_nan=True)
  return base64.b64encode(zlib.compress(text.encode('utf-8'), 6)).decode('ascii')


def loads(text: str) -> Any:
  """The object `dumps` encoded."""
  try:
    raw = zlib.decompress(base64.b64decode(str(text).encode('ascii'), validate=True))
  except (ValueError, zlib.error) as e:
    raise ValueError(f'not a payload of fl_privacy.flower.engines.codec ({e})') from e
  return decode(json.loads(raw.decode('utf-8')))
