"""The run manifest: what produced a results file (command, code, versions, devices, time).

Shape (`results.json["manifest"]`)::

  {"command": "python -m experiments.ami --config=...",   # as typed (sys.orig_argv)
   "cwd": str,
   "git_revision": str | null, "git_dirty": bool | null,  # uncommitted changes to tracked files
   "versions": {"fl_privacy", "jax", "jaxlib", "flax", "optax", "numpy", "scipy",
                "ml_collections", "matplotlib", "scikit-learn"},
   "python": str, "devices": {"platform", "process_count", "local", "global_count"},
   "start_time": str, "end_time": str | null,
   "earlier_runs": [{"command", "git_revision", "git_dirty", "start_time", "end_time"}]}

`earlier_runs` lists the earlier invocations that wrote to the same workdir (a resumed
sweep), so points computed by different code or commands can be told apart.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys

_PACKAGES = ('fl_privacy', 'jax', 'jaxlib', 'flax', 'optax', 'numpy', 'scipy', 'ml_collections',
             'matplotlib', 'scikit-learn')
_EARLIER_FIELDS = ('command', 'git_revision', 'git_dirty', 'start_time', 'end_time')
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


def git_dirty(repo: str = _REPO_ROOT) -> bool | None:
  """Whether tracked files differ from the checked-out revision (None if unknown).

  Untracked files are left out: run folders and caches live in the checkout.
  """
  try:
    out = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=repo,
                         capture_output=True, text=True, timeout=10, check=False)
  except (OSError, subprocess.SubprocessError):
    return None
  return bool(out.stdout.strip()) if out.returncode == 0 else None


def command_line() -> str:
  """The command as typed (`python -m experiments.ami --config=...`), shell-quoted."""
  argv = getattr(sys, 'orig_argv', None) or [sys.executable] + sys.argv
  argv = list(argv)
  if argv and os.path.basename(argv[0]).startswith('python'):
    argv[0] = os.path.basename(argv[0])
  return shlex.join(argv)


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


def collect(start_time: str | None = None, previous: dict | None = None) -> dict:
  """A JSON-safe manifest of this invocation (shape: the module docstring).

  Args:
    start_time: the start of the run (kept from the first invocation on resume).
    previous: the manifest stored by an earlier invocation in the same workdir; it and
      its own `earlier_runs` become this one's `earlier_runs`.

  `end_time` is None until the run finishes (`ResultsStore.finish`).
  """
  earlier = []
  if previous:
    earlier = list(previous.get('earlier_runs') or [])
    earlier.append({k: previous.get(k) for k in _EARLIER_FIELDS})
  return {
      'command': command_line(),
      'cwd': os.getcwd(),
      'git_revision': git_revision(),
      'git_dirty': git_dirty(),
      'versions': {p: _version(p) for p in _PACKAGES},
      'python': platform.python_version(),
      'devices': _devices(),
      'start_time': start_time or utc_now(),
      'end_time': None,
      'earlier_runs': earlier,
  }
