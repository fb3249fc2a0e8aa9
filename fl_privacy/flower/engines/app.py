"""The Flower App's components (`flower_app/pyproject.toml` names them):
`fl_privacy.flower.engines.app:server_app` and `fl_privacy.flower.engines.app:client_app`.

The job travels inside the run: `flwr run flower_app <connection> --run-config <file.toml>`,
the file holding `job = "<jobs.dumps text>"` (JSON, compressed, base64: `codec`), which the
`flwr` CLI reads and sends to the SuperLink with the run; Flower hands the run config to the
ServerApp and to every node's ClientApp. The SuperLink's ServerApp process runs `server_app`:
it rebuilds the job from the run config, runs `jobs.serve` on the Grid Flower hands it and
writes the return (or the error, one line) as `codec` text to `result_path(run_id)` under the
SuperLink's Flower home (`$FLWR_HOME`; `deployment.LocalDeployment.run` reads it). Each
SuperNode's `flwr-clientapp` runs `client_app`, which builds the part's ClientApp from the same
run config and its node config's `partition-id`. Nothing is unpickled and no path is read from
the run config: a SuperNode needs no folder it shares with the submitter.
`python -m experiments.flower_audit --config.flower_audit.engine=deployment` submits the jobs
and starts the processes; docs/experiments/flower_audit.md has the recipe for a deployment of
one's own.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import tempfile

os.environ.setdefault('FLWR_TELEMETRY_ENABLED', '0')

# pylint: disable=wrong-import-position
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.utils import get_flwr_home

from fl_privacy.flower.engines import codec
from fl_privacy.flower.engines import jobs

RESULTS = 'fl_privacy_results'
client_app = jobs.client_app_for()
server_app = ServerApp()


def result_path(run_id: int, home: str | os.PathLike | None = None) -> pathlib.Path:
  """Where the ServerApp of run `run_id` writes its result: `<home>/fl_privacy_results/
  run_<id>.txt` (`home`: the SuperLink's Flower home, default this process's `$FLWR_HOME`)."""
  return pathlib.Path(home or get_flwr_home()) / RESULTS / f'run_{int(run_id)}.txt'


def write_result(path: pathlib.Path, payload: dict) -> None:
  """`codec.dumps(payload)` to `path`, atomically."""
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix='.tmp')
  try:
    with os.fdopen(fd, 'w', encoding='ascii') as f:
      f.write(codec.dumps(payload))
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    raise


@server_app.main()
def main(grid: Grid, context: Context) -> None:
  job = jobs.from_run_config(context)
  path = result_path(context.run_id)
  try:
    out = jobs.serve(job, grid)
  except Exception as e:  # pylint: disable=broad-except
    write_result(path, {'error': f'the ServerApp raised {type(e).__name__}: {e}'})
    raise
  write_result(path, {'result': out})
