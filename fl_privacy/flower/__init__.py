"""Auditing a real Flower deployment (Flower >= 1.42, Message API): an optional extra.

`pip install -e '.[flower]'` installs Flower; nothing else in fl_privacy imports this package.

- `bridge`: Flax parameter pytrees <-> Flower `ArrayRecord` (fixed order, checked against a
  template, bit-exact round trip).
- `strategies`: `RecordingStrategy` (wraps any Message-API strategy, records every client's
  upload per round) with `recording_from_uploads` (the `fl.recording` format through
  `fl.queries.measure`), and `DishonestStrategy` (the 2M+1 detector of
  `attacks.dishonest` sent to target nodes, decided from their uploads), and
  `ReconstructionStrategy` (the imprint block of `attacks.reconstruction.imprint` crafted into
  the model sent to target nodes, their inputs recovered from their replies).
- `client`: a JAX/Flax `ClientApp` (local FedAvg steps with `fl.local.fedavg`).
- `runner`: `InProcessGrid` and `run`: a ServerApp strategy and N ClientApps in one process,
  no network, no Ray.
- `jobs`, `engines`, `app`: each deployment of `flower_audit` as a `jobs.Job`, run in process,
  on Flower's Simulation Engine (Ray) or on a local Deployment Engine (SuperLink and SuperNode
  processes, `flwr run flower_app`) by `engines.run_job`; `app` holds the Flower App's
  ServerApp and ClientApp.
- `own_app`: the canary audit of a user's own Flower app (canary SuperNodes beside theirs).

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

# pylint: disable=wrong-import-position
from fl_privacy.flower import bridge
from fl_privacy.flower import client
from fl_privacy.flower import runner
from fl_privacy.flower import strategies
from fl_privacy.flower.bridge import from_array_record
from fl_privacy.flower.bridge import param_names
from fl_privacy.flower.bridge import to_array_record
from fl_privacy.flower.client import make_client_app
from fl_privacy.flower.runner import InProcessGrid
from fl_privacy.flower.runner import run
from fl_privacy.flower.strategies import DishonestStrategy
from fl_privacy.flower.strategies import ReconstructionStrategy
from fl_privacy.flower.strategies import RecordingStrategy
from fl_privacy.flower.strategies import recording_from_uploads

__all__ = [
    'DishonestStrategy', 'INSTALL_HINT', 'InProcessGrid', 'ReconstructionStrategy',
    'RecordingStrategy', 'bridge',
    'client', 'from_array_record', 'make_client_app', 'param_names', 'recording_from_uploads',
    'run', 'runner', 'strategies', 'to_array_record',
]
