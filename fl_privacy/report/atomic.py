"""Atomic file writes: a reader sees the old file or the new one, never a part.

On a multi-host run (`jax.process_count() > 1`) every process computes the same
results (the game runner gathers all trials on every host), so only process 0
writes; the others skip the write, which keeps hosts that share a file system from
racing on the same file.
"""

from __future__ import annotations

import json
import os
import tempfile

import jax


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
  """Writes `data` to `path` through a temp file in the same folder + os.replace.

  The temp file lives beside the target so the rename stays on one file system
  (atomic on POSIX); it is fsynced first, so a crash leaves the old file intact.
  Only process 0 of a multi-host run writes.
  """
  if jax.process_index() != 0:
    return
  path = os.fspath(path)
  folder = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=folder, prefix='.' + os.path.basename(path),
                             suffix='.tmp')
  try:
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    # mkstemp creates 0600 files; results are meant to be shared like any other.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)
  except BaseException:
    try:
      os.unlink(tmp)
    except FileNotFoundError:
      pass
    raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
  """Writes `text` (UTF-8) to `path` atomically; see `atomic_write_bytes`."""
  atomic_write_bytes(path, text.encode('utf-8'))


def read_json(path: str | os.PathLike, default):
  """The JSON object at `path` (as an atomic write left it), or `default` when there is none:
  a resumed run's side files (listings, false decisions) start from what was saved."""
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except FileNotFoundError:
    return default
