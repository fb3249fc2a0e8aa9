"""Flower's three engines behind one call: `run_job(engine, job, ...)`.

A `jobs.Job` names what a Flower run executes (a `flower_audit` part's server side and the
ClientApp its nodes run) by data only, so any process can rebuild it. `run_job` runs it on:

- `inprocess`: `inprocess.InProcessGrid` (our own `Grid`, one process, function calls; the fast
  path of the tests).
- `simulation`: Flower's Simulation Engine, `flwr.simulation.run_simulation` with the Ray
  backend (`flwr[simulation]`): the ServerApp in a thread of this process, each ClientApp call
  in a Ray actor process with its own JAX runtime (`SIMULATION_BACKEND`: one CPU an actor, as
  many actors as cores; no GPU).
- `deployment`: Flower's Deployment Engine on loopback (`LocalDeployment`): one
  `flower-superlink` and N `flower-supernode` processes on 127.0.0.1 with `--insecure` and free
  ports, each node with `partition-id` / `num-partitions` in its `--node-config`; the job is
  submitted with `flwr run <flower_app> <connection> --run-config job=<path>`; the SuperLink
  starts the ServerApp (`flwr-serverapp`), each SuperNode one `flwr-clientapp` process a
  message; messages travel as protobuf over Flower 1.42's HTTP Fleet API (gRPC before 1.42).
  The ServerApp writes its result beside the job file; every process the run started is
  stopped on every exit path (process groups; SIGTERM -> SIGKILL).

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


_SHARED: list['deployment_lib.LocalDeployment'] = []


@contextlib.contextmanager
def using(deployment: 'deployment_lib.LocalDeployment'
          ) -> Iterator['deployment_lib.LocalDeployment']:
  """Inside the block, `run_job(engine='deployment', ...)` submits every job whose node
  count matches to `deployment` (a running `LocalDeployment`) instead of starting one a job:
  one SuperLink and one set of SuperNodes for several runs, as a deployment serves them."""
  _SHARED.append(deployment)
  try:
    yield deployment
  finally:
    _SHARED.remove(deployment)


def run_job(engine: str, job: jobs_lib.Job, workdir: str | os.PathLike | None = None, *,
            startup_timeout: float = 120.0, run_timeout: float = 3600.0,
            deployment: 'deployment_lib.LocalDeployment | None' = None) -> Any:
  """Runs `job` on `engine`; returns what the job's server side returned (`jobs.serve`).

  Args:
    engine: One of `ENGINES`.
    job: The job (its `num_nodes` nodes have partitions 0..N-1).
    workdir: Where the deployment keeps its job file, result and logs (deployment only;
      default a temporary directory, removed after).
    startup_timeout, run_timeout: Seconds the deployment may take to start, and to run.
    deployment: A running `LocalDeployment` to submit to (its nodes must match the job's);
      None: the one of an enclosing `using` block with as many nodes, else one started for
      this job and stopped after.
  """
  if engine not in ENGINES:
    raise ValueError(f'engine must be one of {ENGINES} (got {engine!r})')
  if engine == 'inprocess':
    grid = inprocess.InProcessGrid([jobs_lib.client_app_for(job)] * job.num_nodes)
    with inprocess.task_identity(grid.run.run_id, inprocess.SUPERLINK_NODE_ID):
      return jobs_lib.serve(job, grid)
  if engine == 'simulation':
    return simulation.simulate(job)
  with contextlib.ExitStack() as stack:
    if workdir is None:
      workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix='flwr-job-'))
    if deployment is None:
      deployment = next((d for d in reversed(_SHARED) if d.num_nodes == job.num_nodes), None)
    if deployment is None:
      deployment = stack.enter_context(deployment_lib.LocalDeployment(
          job.num_nodes, pathlib.Path(workdir) / 'deployment', startup_timeout=startup_timeout))
    elif deployment.num_nodes != job.num_nodes:
      raise ValueError(f'the deployment has {deployment.num_nodes} SuperNodes, the job needs '
                       f'{job.num_nodes}')
    return deployment.run(job, pathlib.Path(workdir), timeout=run_timeout)
