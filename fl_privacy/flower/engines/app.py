"""The Flower App's components (`flower_app/pyproject.toml` names them):
`fl_privacy.flower.engines.app:server_app` and `fl_privacy.flower.engines.app:client_app`.

Under `flwr run flower_app <connection> --run-config "job='<path>'"` the SuperLink's
`flwr-serverapp` runs `server_app`: it loads the `jobs.Job` pickled at `job`, runs
`jobs.serve` on the Grid Flower hands it and writes the return (or the exception) next to the
job as `<job>.result.pkl` (atomically; `engines.LocalDeployment.run` reads it). Each
SuperNode's `flwr-clientapp` runs `client_app`, which builds the part's ClientApp from the same
job (the run config reaches every node) and its node config's `partition-id`.
`python -m experiments.flower_audit --config.flower_audit.engine=deployment` writes the jobs
and starts the processes; docs/experiments/flower_audit.md has the recipe for a deployment of
one's own.
"""

from __future__ import annotations

import os
import pathlib

os.environ.setdefault('FLWR_TELEMETRY_ENABLED', '0')

# pylint: disable=wrong-import-position
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fl_privacy.flower.engines import jobs


client_app = jobs.client_app_for('')
server_app = ServerApp()


def result_path(job_path: str | os.PathLike) -> pathlib.Path:
  """Where the ServerApp writes the result of the job pickled at `job_path`."""
  return pathlib.Path(job_path).with_suffix('.result.pkl')


@server_app.main()
def main(grid: Grid, context: Context) -> None:
  path = str(context.run_config.get('job', ''))
  if not path:
    raise ValueError("the run config has no 'job': run `python -m experiments.flower_audit "
                     "--config.flower_audit.engine=deployment`, or pass --run-config "
                     "\"job='<path of a pickled fl_privacy.flower.engines.jobs.Job>'\"")
  job = jobs.load(path)
  try:
    out = jobs.serve(job, grid)
  except Exception as e:  # pylint: disable=broad-except
    jobs.write_pickle(jobs.EngineError(f'the ServerApp raised {type(e).__name__}: {e}'),
                      result_path(path))
    raise
  jobs.write_pickle(out, result_path(path))
