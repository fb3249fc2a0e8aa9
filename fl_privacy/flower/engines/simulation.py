"""Flower's Simulation Engine as Flower 1.42 runs it: `flwr run` against a SuperLink in
simulation mode.

`simulate(job, workdir)` submits the job to a `deployment.LocalDeployment(simulation=True)`
(`flower-superlink --simulation`, no SuperNodes; the one of an enclosing `dispatch.using`
block, else one started for this job and stopped after) with `--federation-config
"num-supernodes=<the job's N> ..."` (`deployment.simulation_federation`: Ray gets every core,
a ClientApp actor one CPU and no GPU). The SuperLink starts `flwr-simulation`, which runs the
ServerApp and the N virtual nodes' ClientApps (Ray actors) of the repository's Flower App; the
job travels in the run config as on the Deployment Engine, and so does the result
(`app.result_path` under the SuperLink's Flower home). Flower's deprecated
`flwr.simulation.run_simulation` is not used: nothing needs the ServerApp in this process.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import tempfile
from typing import Any

os.environ.setdefault('FLWR_TELEMETRY_ENABLED', '0')

# pylint: disable=wrong-import-position
from fl_privacy.flower.engines import deployment as deployment_lib
from fl_privacy.flower.engines import jobs as jobs_lib


def simulate(job: jobs_lib.Job, workdir: str | os.PathLike | None = None, *,
             federation: deployment_lib.LocalDeployment | None = None,
             startup_timeout: float = 120.0, run_timeout: float = 3600.0) -> Any:
  """Runs `job` on Flower's Simulation Engine (module docstring); what the job's server side
  returned (`jobs.serve`). `federation`: a running simulation-mode `LocalDeployment` (None:
  one started in `<workdir>/simulation` and stopped after)."""
  try:
    import ray  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    raise jobs_lib.EngineError(
        "engine 'simulation' needs Flower's Ray backend: pip install -e '.[flower]'") from e
  with contextlib.ExitStack() as stack:
    if workdir is None:
      workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix='flwr-sim-'))
    if federation is None:
      federation = stack.enter_context(deployment_lib.LocalDeployment(
          job.num_nodes, pathlib.Path(workdir) / 'simulation', simulation=True,
          startup_timeout=startup_timeout))
    elif not federation.simulation:
      raise ValueError('federation must be a simulation-mode LocalDeployment')
    return federation.run(job, pathlib.Path(workdir), timeout=run_timeout)
