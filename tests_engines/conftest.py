"""The engine tests: Flower's Simulation Engine (Ray) and a local Deployment Engine (SuperLink
and SuperNode processes on 127.0.0.1).

They start processes and take minutes, so they sit outside the README's `pytest` paths and
run as a CI step of their own (`.ci/run`): `pytest -q -p no:xdist tests_engines`. The
processes import this repository's `tests_engines.toy_part`, so the repository root goes on
their PYTHONPATH.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib

os.environ['FLWR_TELEMETRY_ENABLED'] = '0'

# pylint: disable=wrong-import-position
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
os.environ['PYTHONPATH'] = os.pathsep.join(
    [str(REPO)] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])

# own_app_part.py is a user's task module, copied into a temporary app folder beside the
# vendored in-app files it imports relatively; imported here (--doctest-modules) it cannot run.
collect_ignore = ['own_app_part.py']
if importlib.util.find_spec('flwr') is None or importlib.util.find_spec('ray') is None:
  collect_ignore_glob = ['test_*.py']


def alive(pid: int) -> bool:
  """Whether process `pid` exists and is not a zombie."""
  try:
    with open(f'/proc/{pid}/stat', encoding='utf-8') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except FileNotFoundError:
    return False


def flower_processes(marker: str) -> list[int]:
  """Pids of live processes whose command line or environment mentions `marker` (a test's
  own directory: its FLWR_HOME)."""
  out = []
  for entry in pathlib.Path('/proc').iterdir():
    if not entry.name.isdigit() or int(entry.name) == os.getpid():
      continue
    try:
      blob = (entry / 'cmdline').read_bytes() + (entry / 'environ').read_bytes()
    except (PermissionError, FileNotFoundError, ProcessLookupError):
      continue
    if marker.encode() in blob and alive(int(entry.name)):
      out.append(int(entry.name))
  return out


@pytest.fixture
def no_leftovers(tmp_path):
  """The test's directory; after the test, no process that carries it may still run."""
  yield tmp_path
  left = flower_processes(str(tmp_path))
  assert not left, f'processes outlived the run: {left}'
