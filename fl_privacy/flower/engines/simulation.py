"""Flower's Simulation Engine (`flwr.simulation.run_simulation`, Ray backend) for a job.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import tempfile
from typing import Any, Iterator

os.environ.setdefault('FLWR_TELEMETRY_ENABLED', '0')

# pylint: disable=wrong-import-position

from fl_privacy.flower.engines import jobs as jobs_lib


def simulation_backend(num_cpus: int | None = None) -> dict[str, Any]:
  """`backend_config` for `run_simulation` on this machine: Ray gets every core, each
  ClientApp actor one CPU and no GPU (so as many actors as cores run at once)."""
  cpus = int(num_cpus or os.cpu_count() or 1)
  return {'init_args': {'num_cpus': cpus, 'num_gpus': 0, 'logging_level': 'error',
                        'log_to_driver': False},
          'client_resources': {'num_cpus': 1, 'num_gpus': 0}}


def simulate(job: jobs_lib.Job) -> Any:
  # pylint: disable=import-outside-toplevel
  try:
    import ray  # noqa: F401  (flwr exits the process without it; say so in one line instead)
  except ImportError as e:
    raise jobs_lib.EngineError(
        "engine 'simulation' needs Flower's Ray backend: pip install -e '.[flower]'") from e
  from flwr.simulation import run_simulation
  sink: dict[str, Any] = {}
  with tempfile.TemporaryDirectory(prefix='flwr-sim-') as tmp:
    path = jobs_lib.save(job, pathlib.Path(tmp) / 'job.pkl')
    try:
      with _quiet_deprecation():
        run_simulation(jobs_lib.server_app_for(job, sink), jobs_lib.client_app_for(str(path)),
                       num_supernodes=job.num_nodes, backend_config=simulation_backend())
    finally:
      if ray.is_initialized():
        ray.shutdown()
  if 'error' in sink:
    raise sink['error']
  if 'result' not in sink:
    raise jobs_lib.EngineError('the Simulation Engine stopped before the ServerApp returned')
  return sink['result']


@contextlib.contextmanager
def _quiet_deprecation() -> Iterator[None]:
  # `run_simulation` warns that it is deprecated (in favour of `flwr run`) on every call.
  import logging  # pylint: disable=import-outside-toplevel
  logger = logging.getLogger('flwr')
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    logger.setLevel(level)
