"""Per-point arrays on disk, and per-point keys, both keyed by a point's params.

A sweep point is named by a flat dict of params (what `ResultsStore` stores). Two things derive
from that dict here, so that neither depends on the order or the subset of a sweep:

- `point_key(key, params)`: the point's PRNG key, `fold_in(key, h)` with h a stable 31-bit hash
  (SHA-256) of the canonical JSON of `params`. Equal params give equal keys in every run, on
  every machine and Python version (`hash()` is salted per process; SHA-256 is not).
- `ArtifactStore(workdir, name)`: one `.npz` file per point under `<workdir>/<name>/` (AMI's
  Monte Carlo draws, recorded FL statistics), written atomically, so re-scoring or resuming a
  sweep never recomputes them. The file carries its own params, and `load` returns None (with a
  warning) for a missing, unreadable or foreign file: never another point's arrays.

Canonical JSON: `json_safe` (numpy and jax values become Python ones), keys sorted, no spaces,
and a float with an integral value written as the int (so `{'M': 4}` and `{'M': 4.0}`, which
`ResultsStore.get` treats as the same point, get the same key and file).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import zipfile
from typing import Any, Mapping

from absl import logging
import jax
import numpy as np

from fl_privacy.report import atomic
from fl_privacy.report.store import json_safe

# The npz entry holding the canonical params of the point the file belongs to.
PARAMS_ENTRY = '__params__'


def _canonical_value(v: Any) -> Any:
  if isinstance(v, dict):
    return {k: _canonical_value(x) for k, x in v.items()}
  if isinstance(v, list):
    return [_canonical_value(x) for x in v]
  if isinstance(v, float) and v.is_integer():
    return int(v)
  return v


def canonical_json(params: Mapping[str, Any]) -> str:
  """The canonical JSON text of `params` (see the module docstring)."""
  if not isinstance(params, Mapping):
    raise TypeError(f'params must be a dict (got {type(params).__name__})')
  return json.dumps(_canonical_value(json_safe(dict(params))), sort_keys=True,
                    separators=(',', ':'), allow_nan=False)


def params_digest(params: Mapping[str, Any]) -> str:
  """SHA-256 hex digest of `canonical_json(params)`."""
  return hashlib.sha256(canonical_json(params).encode('utf-8')).hexdigest()


def point_key(key: jax.Array, params: Mapping[str, Any]) -> jax.Array:
  """The PRNG key of the sweep point named by `params`: `fold_in(key, hash(params))`.

  The hash is the first 31 bits of the SHA-256 of the params' canonical JSON, so the key
  depends only on the params (not on the point's position in the sweep). A pipeline that wants
  common random numbers across some parameters (e.g. the same client data for every M) passes
  only the params that should change the draws.

  Args:
    key: the run key.
    params: flat dict of JSON-able values.

  Returns:
    A key derived deterministically from (key, params).
  """
  h = int(params_digest(params)[:8], 16) & 0x7FFFFFFF
  return jax.random.fold_in(key, h)


def _slug(params: Mapping[str, Any]) -> str:
  text = '_'.join(f'{k}-{v}' for k, v in sorted(json_safe(dict(params)).items()))
  return re.sub(r'[^A-Za-z0-9.+-]+', '_', text)[:80].strip('_')


class ArtifactStore:
  """Arrays of sweep points as `<workdir>/<name>/<slug>-<digest>.npz`, atomic and resumable.

  Args:
    workdir: the run folder.
    name: a subfolder for one kind of artifact (e.g. 'draws', 'recorded').
  """

  def __init__(self, workdir: str | os.PathLike, name: str):
    if not name or os.sep in name or name in ('.', '..'):
      raise ValueError(f'name must be a plain folder name (got {name!r})')
    self.workdir = os.fspath(workdir)
    self.name = name
    self.folder = os.path.join(self.workdir, name)

  def path(self, params: Mapping[str, Any]) -> str:
    """The file of the point `params` (a readable slug plus 16 hex digits of its digest)."""
    slug = _slug(params)
    digest = params_digest(params)[:16]
    return os.path.join(self.folder, f'{slug}-{digest}.npz' if slug else f'{digest}.npz')

  def load(self, params: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
    """The arrays saved for `params`, or None when the file is missing, corrupt or foreign.

    A corrupt file, or one whose stored params differ from `params` (a digest collision or a
    file copied in by hand), is reported with a warning and treated as missing.
    """
    path = self.path(params)
    if not os.path.exists(path):
      return None
    try:
      with np.load(path, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
      logging.warning('artifact %s is unreadable (%s): recomputing it', path, e)
      return None
    stored = arrays.pop(PARAMS_ENTRY, None)
    want = canonical_json(params)
    if stored is None or str(stored) != want:
      logging.warning('artifact %s belongs to params %s, not %s: recomputing it', path,
                      None if stored is None else str(stored), want)
      return None
    return arrays

  def save(self, params: Mapping[str, Any], arrays: Mapping[str, Any]) -> str:
    """Writes `arrays` (name -> array) for `params` atomically; returns the path."""
    arrays = {str(k): np.asarray(v) for k, v in arrays.items()}
    if PARAMS_ENTRY in arrays:
      raise ValueError(f'{PARAMS_ENTRY!r} is reserved')
    for k, v in arrays.items():
      if v.dtype == object:
        raise TypeError(f'array {k!r} has dtype object (not storable without pickle)')
    buf = io.BytesIO()
    np.savez(buf, **arrays, **{PARAMS_ENTRY: np.asarray(canonical_json(params))})
    os.makedirs(self.folder, exist_ok=True)
    path = self.path(params)
    atomic.atomic_write_bytes(path, buf.getvalue())
    return path
