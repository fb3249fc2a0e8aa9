"""Every Flower name fl_privacy uses exists in the installed Flower, and the pin agrees.

Read from the sources (every `from flwr... import X` and `import flwr...` under
fl_privacy/flower/, function-level imports included), so a new use is checked without
editing this file; a Flower release that moves or drops a name fails here by name, before a
deployment does.
"""

from __future__ import annotations

import ast
import configparser
import importlib
import pathlib

import flwr

from fl_privacy import flower

REPO = pathlib.Path(__file__).resolve().parents[2]


def _flower_imports() -> list[tuple[str, str, str | None]]:
  """(file, module, name or None) of every Flower import under fl_privacy/flower/."""
  found = []
  for path in sorted((REPO / 'fl_privacy' / 'flower').rglob('*.py')):
    name = str(path.relative_to(REPO / 'fl_privacy' / 'flower'))
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and (node.module or '').split('.')[0] == 'flwr':
        found += [(name, node.module, a.name) for a in node.names]
      elif isinstance(node, ast.Import):
        found += [(name, a.name, None) for a in node.names
                  if a.name.split('.')[0] == 'flwr']
  return found


def test_the_scan_finds_the_dp_names():
  names = {(m, n) for _, m, n in _flower_imports()}
  # Guards the scan itself: an empty list would make the next test vacuous.
  assert ('flwr.clientapp.mod', 'LocalDpMod') in names
  assert ('flwr.serverapp', 'RdpAccountant') in names
  assert len(names) >= 25


def test_every_flower_name_we_use_is_importable():
  missing = []
  for file, module, name in _flower_imports():
    try:
      mod = importlib.import_module(module)
    except ImportError as e:
      missing.append(f'{file}: {module} ({e})')
      continue
    if name is not None and not hasattr(mod, name):
      try:
        importlib.import_module(f'{module}.{name}')
      except ImportError:
        missing.append(f'{file}: {module}.{name}')
  assert not missing, f'Flower {flwr.__version__} lacks {missing}'


def test_setup_cfg_pins_the_tested_flower_in_every_extra_that_installs_it():
  cfg = configparser.ConfigParser()
  cfg.read(REPO / 'setup.cfg')
  extras = cfg['options.extras_require']
  for extra in ('test', 'dev', 'flower'):
    pins = [line.strip() for line in extras[extra].splitlines()
            if line.strip().startswith('flwr')]
    # With the Simulation Engine's Ray backend (flwr's own `simulation` extra pins Ray).
    assert pins == [flower.FLWR_REQUIREMENT.replace('flwr', 'flwr[simulation]', 1)], (extra, pins)
  low, high = flower.FLWR_RANGE
  assert flower.FLWR_REQUIREMENT == f'flwr>={low[0]}.{low[1]},<{high[0]}.{high[1]}'
  major, minor = (int(v) for v in flwr.__version__.split('.')[:2])
  assert low <= (major, minor) < high
