"""Auditing a real Flower deployment (Flower >= 1.42, Message API): an optional extra.

`pip install -e '.[flower]'` installs Flower; nothing else in fl_privacy imports this package.
Importing it checks the Flower version and imports neither JAX nor a subpackage: the public
names below load on first use (PEP 562).

- `bridge`: Flax parameter pytrees <-> Flower `ArrayRecord` (fixed order, checked against a
  template, bit-exact round trip). `client`: a JAX/Flax `ClientApp` (`fl.local.fedavg` steps).
- `strategies/`: server-side strategies wrapping any Message-API strategy (`base`):
  `recording` (`RecordingStrategy`, `recording_from_uploads`), `dishonest`
  (`DishonestStrategy`, the 2M+1 detector of `attacks.dishonest`), `reconstruction`
  (`ReconstructionStrategy`, the imprint block of `attacks.reconstruction.imprint`).
- `engines/`: where a deployment runs. `inprocess` (`InProcessGrid`, `run`: strategy and
  ClientApps in one process), `jobs` (a deployment of `flower_audit` as a picklable `Job`),
  `dispatch.run_job` (a job in process, on `simulation` (Flower's Simulation Engine) or on a
  local `deployment` (SuperLink and SuperNodes, `flwr run flower_app`)), `app` (the Flower
  App's ServerApp and ClientApp).
- `audits/`: privacy audits of Flower's own code. `dp_setting` + `dp_games` (Flower's DP
  wrappers as canary games), `canaries` (one-run canary audit of a whole deployment:
  `canary_design`, `canary_deploy`, `canary_stats`), `user_app` + `user_strategy` +
  `user_rounds` (the same audit added to a user's own Flower app).
- `parts/`: the `flower_audit` experiment: `pipeline` (its plan), `config_checks`, `common`,
  one module a part (`fedmia`, `dishonest`, `reconstruction`) and `tables`.
- `inapp/`: owned separately (see its own docstring).

Flower's telemetry is switched off (`FLWR_TELEMETRY_ENABLED=0`, unless the environment already
says otherwise) before Flower is imported here.
"""

from __future__ import annotations

import os

from fl_privacy.validate import MissingExtraError

INSTALL_HINT = "pip install -e '.[flower]'"
# The Flower versions this package is tested against (setup.cfg's extras pin the same: the DP
# audit cites Flower 1.42's lines, and `tests/flower/test_flower_names.py` imports every
# Flower name used here).
FLWR_REQUIREMENT = 'flwr>=1.42,<1.43'
FLWR_RANGE = ((1, 42), (1, 43))

os.environ.setdefault('FLWR_TELEMETRY_ENABLED', '0')

try:
  import flwr  # pylint: disable=unused-import
  from flwr import app as _flwr_app  # pylint: disable=unused-import
  from flwr import serverapp as _flwr_serverapp  # pylint: disable=unused-import
except ImportError as e:  # flwr missing (or sys.modules['flwr'] = None)
  raise MissingExtraError(
      f'fl_privacy.flower needs Flower ({FLWR_REQUIREMENT}), which is not installed; install '
      f'the optional extra with `{INSTALL_HINT}` (or `pip install "{FLWR_REQUIREMENT}"`).'
  ) from e


def _version(text: str) -> tuple[int, int]:
  major, minor = (text.split('.') + ['0'])[:2]
  return int(major), int(''.join(c for c in minor if c.isdigit()) or 0)


if not FLWR_RANGE[0] <= _version(getattr(flwr, '__version__', '0.0')) < FLWR_RANGE[1]:
  raise MissingExtraError(
      f'fl_privacy.flower needs {FLWR_REQUIREMENT} (the version it is tested against); '
      f'found flwr {getattr(flwr, "__version__", "?")}. Install the extra with `{INSTALL_HINT}`.')

import importlib  # pylint: disable=wrong-import-position

# Public name -> the module that defines it (or, for a module, its dotted path).
_LAZY = {
    'bridge': 'fl_privacy.flower.bridge',
    'client': 'fl_privacy.flower.client',
    'from_array_record': 'fl_privacy.flower.bridge',
    'param_names': 'fl_privacy.flower.bridge',
    'to_array_record': 'fl_privacy.flower.bridge',
    'make_client_app': 'fl_privacy.flower.client',
    'InProcessGrid': 'fl_privacy.flower.engines.inprocess',
    'run': 'fl_privacy.flower.engines.inprocess',
    'RecordingStrategy': 'fl_privacy.flower.strategies.recording',
    'recording_from_uploads': 'fl_privacy.flower.strategies.recording',
    'DishonestStrategy': 'fl_privacy.flower.strategies.dishonest',
    'ReconstructionStrategy': 'fl_privacy.flower.strategies.reconstruction',
}
_MODULES = ('bridge', 'client')

__all__ = ['INSTALL_HINT', *sorted(_LAZY)]


def __getattr__(name: str):
  """Loads a public name on first use (PEP 562), so importing the package (or a subpackage
  such as `inapp`) does not import JAX."""
  if name not in _LAZY:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  module = importlib.import_module(_LAZY[name])
  value = module if name in _MODULES else getattr(module, name)
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_LAZY))
