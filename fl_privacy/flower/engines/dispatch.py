"""Flower's three engines behind one call: `run_job(engine, job, ...)`.

A `jobs.Job` names what a Flower run executes (a `flower_audit` part's server side and the
ClientApp its nodes run) by data only, so any process can rebuild it. `run_job` runs it on:

- `inprocess`: `inprocess.InProcessGrid` (our own `Grid`, one process, function calls; the
  fast path of the tests).
- `simulation`: Flower's Simulation Engine as Flower 1.42 runs it (`simulation.simulate`):
  `flwr run` against a SuperLink in simulation mode, `num-supernodes` = the job's N; the
  ServerApp and each ClientApp call (in one of Ray's actor processes, one CPU each, as many as
  cores) run in the SuperLink's `flwr-simulation` process tree.
- `deployment`: Flower's Deployment Engine on loopback (`deployment.LocalDeployment`): one
  `flower-superlink` and N `flower-supernode` processes on 127.0.0.1 with `--insecure` and
  free ports, each node with `partition-id` / `num-partitions` in its `--node-config`; the
  SuperLink starts the ServerApp (`flwr-serverapp`), each SuperNode one `flwr-clientapp`
  process a message; messages travel as protobuf over Flower 1.42's HTTP Fleet API (gRPC
  before 1.42).

On both Flower engines the job travels inside the run (`flwr run flower_app <connection>
--run-config <file.toml>`, the file holding `job = "<jobs.dumps text>"`), the ServerApp writes
its return as `codec` text under the SuperLink's Flower home, and every process the run
started is stopped on every exit path (SIGTERM, then SIGKILL; a watchdog process when the
driver itself is killed).

Whatever the engine, the server side gets the Grid through `jobs.serve`, which first asks
every node its `partition-id` (a `query` message) and hands the job an `OrderedGrid`: node ids
listed by partition and replies sorted by partition, so that FedAvg samples and sums in the
same order on every engine (Flower's own grids return replies in arrival order and its node
ids are random), and that records what each round lost (error replies, no reply).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import tempfile
from typing import Any, Iterator

os.environ.setdefault('FLWR_TELEMETRY_ENABLED', '0')

# pylint: disable=wrong-import-position
from fl_privacy.flower.engines import deployment as deployment_lib
from fl_privacy.flower.engines import inprocess
from fl_privacy.flower.engines import jobs as jobs_lib
from fl_privacy.flower.engines import simulation

ENGINES = ('inprocess', 'simulation', 'deployment')

_SHARED: list[deployment_lib.LocalDeployment] = []


@contextlib.contextmanager
def using(deployment: deployment_lib.LocalDeployment
          ) -> Iterator[deployment_lib.LocalDeployment]:
  """Inside the block, `run_job` submits to `deployment` (a running `LocalDeployment`)
  instead of starting one a job: engine 'deployment' every job whose node count matches its
  SuperNodes, engine 'simulation' every job when it is a simulation-mode SuperLink (each run
  gets the job's node count). One SuperLink (and one set of SuperNodes) for several runs, as
  a deployment serves them."""
  _SHARED.append(deployment)
  try:
    yield deployment
  finally:
    _SHARED.remove(deployment)


def shared(engine: str, num_nodes: int) -> deployment_lib.LocalDeployment | None:
  """The deployment of the innermost `using` block that serves a job of `num_nodes` nodes on
  `engine`, or None."""
  sim = engine == 'simulation'
  return next((d for d in reversed(_SHARED)
               if d.simulation == sim and (sim or d.num_nodes == int(num_nodes))), None)


def run_job(engine: str, job: jobs_lib.Job, workdir: str | os.PathLike | None = None, *,
            startup_timeout: float = 120.0, run_timeout: float = 3600.0,
            deployment: deployment_lib.LocalDeployment | None = None) -> Any:
  """Runs `job` on `engine`; returns what the job's server side returned (`jobs.serve`).

  Args:
    engine: One of `ENGINES`.
    job: The job (its `num_nodes` nodes have partitions 0..N-1).
    workdir: Where a Flower engine keeps the run config file and its logs (default a
      temporary directory, removed after).
    startup_timeout, run_timeout: Seconds the SuperLink and nodes may take to start, and
      the run to finish.
    deployment: A running `LocalDeployment` to submit to (SuperNodes: as many as the job's
      nodes; simulation mode: engine 'simulation'); None: the one of an enclosing `using`
      block (`shared`), else one started for this job and stopped after.
  """
  if engine not in ENGINES:
    raise ValueError(f'engine must be one of {ENGINES} (got {engine!r})')
  if engine == 'inprocess':
    grid = inprocess.InProcessGrid([jobs_lib.client_app_for(job)] * job.num_nodes)
    with inprocess.task_identity(grid.run.run_id, inprocess.SUPERLINK_NODE_ID):
      return jobs_lib.serve(job, grid)
  if deployment is None:
    deployment = shared(engine, job.num_nodes)
  if engine == 'simulation':
    return simulation.simulate(job, workdir, federation=deployment,
                               startup_timeout=startup_timeout, run_timeout=run_timeout)
  with contextlib.ExitStack() as stack:
    if workdir is None:
      workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix='flwr-job-'))
    if deployment is None:
      deployment = stack.enter_context(deployment_lib.LocalDeployment(
          job.num_nodes, pathlib.Path(workdir) / 'deployment', startup_timeout=startup_timeout))
    return deployment.run(job, pathlib.Path(workdir), timeout=run_timeout)
