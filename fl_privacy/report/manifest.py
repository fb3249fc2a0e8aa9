"""The run manifest: what produced a results file (versions, code, devices, time)."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess

_PACKAGES = ('jax', 'jaxlib', 'flax', 'optax', 'numpy')
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def utc_now() -> str:
  """The current time as an ISO 8601 UTC string (seconds)."""
  return datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec='seconds')


def git_revision(repo: str = _REPO_ROOT) -> str | None:
  """`git rev-parse HEAD` of the fl-privacy checkout, or None if unavailable."""
  try:
    out = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=repo,
                         capture_output=True, text=True, timeout=10,
                         check=False)
  except (OSError, subprocess.SubprocessError):
    return None
  rev = out.stdout.strip()
  return rev if out.returncode == 0 and rev else None


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def _devices() -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  return {
      'platform': jax.default_backend(),
      'process_count': jax.process_count(),
      'local': [str(d) for d in jax.local_devices()],
      'global_count': jax.device_count(),
  }


def collect(start_time: str | None = None) -> dict:
  """A JSON-safe manifest: versions, python, git revision, devices, start time.

  `end_time` is None until the run finishes (`ResultsStore.finish`).
  """
  return {
      'versions': {p: _version(p) for p in _PACKAGES},
      'python': platform.python_version(),
      'git_revision': git_revision(),
      'devices': _devices(),
      'start_time': start_time or utc_now(),
      'end_time': None,
  }
