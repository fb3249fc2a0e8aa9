"""A local Flower SuperLink, with N SuperNodes (Flower's Deployment Engine) or in simulation
mode (Flower's Simulation Engine), started with Flower's CLI; jobs submitted with `flwr run`.

`LocalDeployment(N, workdir)` starts `flower-superlink --insecure` on a free port of
127.0.0.1 and N `flower-supernode --insecure` processes (node k: `--node-config
"partition-id=k num-partitions=N"`); `LocalDeployment(N, workdir, simulation=True)` starts a
SuperLink with `--simulation` only: each `flwr run` then runs on Flower's Simulation Engine
(Ray) with `--federation-config num-supernodes=<the job's N>` virtual nodes.

`run(job)` submits the job as data (`flwr run flower_app <connection> --run-config
<file.toml>`, the file holding `job = "<jobs.dumps text>"`: the `flwr` CLI reads it and sends
the run config with the run), polls `flwr ls --run-id <id>` until the run is finished and
reads the result the ServerApp wrote under the SuperLink's Flower home (`app.result_path`).
Readiness is read from Flower's CLI: the SuperLink is up when `flwr ls` answers, the nodes
when `flwr supernode ls` lists N of them online.

Processes: each in a session of its own, with a private `FLWR_HOME` whose `config.toml` names
the SuperLink as the connection `CONNECTION`. Leaving the block (an exception, Ctrl-C, SIGTERM
included) stops them all (SIGTERM, then SIGKILL after `grace` seconds, then whatever still
carries the home: `processes.kill_all`). A driver killed with SIGKILL runs no `finally`: the
watchdog it starts first (`watchdog.py`, in a session of its own) sees it gone and kills every
process carrying the home. Logs: `<workdir>/superlink.log`, `supernode_<k>.log`.
Runtime dependency installation is disabled: the apps run in this environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import warnings
from typing import Any, Sequence

os.environ.setdefault('FLWR_TELEMETRY_ENABLED', '0')

# pylint: disable=wrong-import-position
from fl_privacy.flower.engines import app as app_lib
from fl_privacy.flower.engines import codec
from fl_privacy.flower.engines import jobs as jobs_lib
from fl_privacy.flower.engines import processes
from fl_privacy.flower.engines.sizes import max_deployment_nodes, NODE_BYTES  # noqa: F401

# The repository's Flower App (pyproject.toml with [tool.flwr.app]); `flwr run` builds it.
APP_DIR = pathlib.Path(__file__).resolve().parents[3] / 'flower_app'
CONNECTION = 'fl-privacy-local'
# Failed `flwr ls` calls in a row after which `wait` gives up on a run.
CLI_FAILURES = 10


def _flwr(*args: str) -> list[str]:
  return [os.path.join(os.path.dirname(sys.executable), 'flwr'), *args]


def simulation_federation(num_nodes: int, num_cpus: int | None = None) -> dict[str, Any]:
  """`--federation-config` of a simulation run: `num_nodes` virtual SuperNodes; Ray gets
  every core, a ClientApp actor one CPU and no GPU (as many actors as cores at once)."""
  return {'num-supernodes': int(num_nodes),
          'init-args-num-cpus': int(num_cpus or os.cpu_count() or 1),
          'init-args-num-gpus': 0, 'client-resources-num-cpus': 1,
          'client-resources-num-gpus': 0, 'init-args-logging-level': 'error',
          'init-args-log-to-driver': False}


def toml_value(value: Any) -> str:
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, (int, float)):
    return repr(value)
  return json.dumps(str(value))  # a TOML basic string


def toml_table(values: dict[str, Any]) -> str:
  return ''.join(f'{k} = {toml_value(v)}\n' for k, v in values.items())


class LocalDeployment:
  """A local SuperLink and its SuperNodes (module docstring); a context manager.

  Args:
    num_nodes: N SuperNodes (simulation: the default node count of `submit`; `run` uses the
      job's).
    workdir: Logs, the Flower home (`<workdir>/flwr_home`) and the run config files.
    node_configs: Per node extra `--node-config` entries (merged over `partition-id`,
      `num-partitions`).
    startup_timeout: Seconds the processes may take to be ready.
    grace: Seconds between SIGTERM and SIGKILL when stopping.
    simulation: A simulation-mode SuperLink and no SuperNodes.
    node_root: Give SuperNode k a Flower home and working directory of its own,
      `<node_root>/node_<k>/home` and `.../cwd` (None: the deployment's home and workdir),
      as a node on a machine of its own would have: it reads nothing of the submitter's.
  """

  def __init__(self, num_nodes: int, workdir: str | os.PathLike, *,
               node_configs: Sequence[dict] | None = None, startup_timeout: float = 120.0,
               grace: float = 3.0, simulation: bool = False,
               node_root: str | os.PathLike | None = None):
    if int(num_nodes) < 1:
      raise ValueError(f'num_nodes must be >= 1 (got {num_nodes})')
    self.num_nodes = int(num_nodes)
    self.workdir = pathlib.Path(workdir)
    self.node_configs = list(node_configs or [{}] * self.num_nodes)
    if len(self.node_configs) != self.num_nodes:
      raise ValueError(f'{len(self.node_configs)} node_configs for {self.num_nodes} nodes')
    self.startup_timeout = float(startup_timeout)
    self.grace = float(grace)
    self.simulation = bool(simulation)
    if self.simulation and (node_configs or node_root):
      raise ValueError('a simulation federation has no SuperNodes to configure')
    self.node_root = None if node_root is None else pathlib.Path(node_root)
    self.superlink: subprocess.Popen | None = None
    self.supernodes: list[subprocess.Popen | None] = []
    self.port: int | None = None
    self.home = self.workdir / 'flwr_home'
    self.env: dict[str, str] = {}
    self._logs: list[Any] = []
    self._saved_sigterm = None
    self._watchdog: subprocess.Popen | None = None
    self._submitted = 0
    self.cli_error = ''

  # --- lifecycle ------------------------------------------------------------------------------

  def __enter__(self) -> 'LocalDeployment':
    try:
      self.start()
    except BaseException:
      self.stop()
      raise
    return self

  def __exit__(self, *exc) -> None:
    self.stop()

  def _spawn(self, args: list[str], log_name: str, env: dict[str, str] | None = None,
             cwd: pathlib.Path | None = None) -> subprocess.Popen:
    log = open(self.workdir / log_name, 'wb')  # pylint: disable=consider-using-with
    self._logs.append(log)
    with warnings.catch_warnings():
      # JAX warns on every fork; Popen forks only to exec the command at once.
      warnings.filterwarnings('ignore', message=r'os\.fork\(\) was called')
      return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, env=env or self.env, cwd=cwd,
                              start_new_session=True)

  def start(self, attempts: int = 3) -> None:
    """Starts the watchdog, the SuperLink and the SuperNodes; returns when all nodes are
    online. A process that exits while starting (a port taken between `free_ports` and its
    bind) is retried on fresh ports, `attempts` times in all."""
    self.workdir.mkdir(parents=True, exist_ok=True)
    self.home.mkdir(parents=True, exist_ok=True)
    if self._watchdog is None:
      self._watchdog = processes.start_watchdog(self.marker)
    if _is_main_thread():
      self._saved_sigterm = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    for attempt in range(int(attempts)):
      try:
        return self._start_once()
      except _Exited:
        self._stop_processes()
        self.superlink, self.supernodes = None, []
        if attempt == int(attempts) - 1:
          raise

  def _start_once(self) -> None:
    self.env = processes.environment(self.home)
    ports = processes.free_ports(1 + self.num_nodes)
    self.port = ports[0]
    (self.home / 'config.toml').write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
        f'address = "127.0.0.1:{self.port}"\ninsecure = true\n', encoding='utf-8')
    bin_dir = os.path.dirname(sys.executable)
    self.superlink = self._spawn(
        [os.path.join(bin_dir, 'flower-superlink'), '--insecure',
         '--disable-runtime-dependency-installation', '--host', '127.0.0.1',
         '--port', str(self.port)] + (['--simulation'] if self.simulation else []),
        'superlink.log', cwd=self.workdir)
    self._wait(lambda: self._cli_json('ls') is not None, 'the SuperLink to answer `flwr ls`')
    if self.simulation:
      return  # the simulation runtime starts its virtual nodes with each run
    for k in range(self.num_nodes):
      config = {'partition-id': k, 'num-partitions': self.num_nodes, **self.node_configs[k]}
      node_config = ' '.join(f'{key}={toml_value(v)}' for key, v in config.items())
      env, cwd = self.env, self.workdir
      if self.node_root is not None:
        own = self.node_root / f'node_{k}'
        (own / 'home').mkdir(parents=True, exist_ok=True)
        (own / 'cwd').mkdir(parents=True, exist_ok=True)
        env = dict(self.env, FLWR_HOME=str(own / 'home'))
        cwd = own / 'cwd'
      self.supernodes.append(self._spawn(
          [os.path.join(bin_dir, 'flower-supernode'), '--insecure',
           '--superlink', f'127.0.0.1:{self.port}', '--host', '127.0.0.1',
           '--port', str(ports[1 + k]), '--node-config', node_config],
          f'supernode_{k}.log', env=env, cwd=cwd))
    self._wait(lambda: self.online() >= self.num_nodes,
               f'{self.num_nodes} SuperNodes to be online (`flwr supernode ls`)')

  def _cli_json(self, *args: str, timeout: float = 120.0) -> dict | None:
    """`flwr <args> CONNECTION --format json` parsed, None when it fails (`self.cli_error`
    says how)."""
    try:
      out = subprocess.run(_flwr(*args, CONNECTION, '--format', 'json'), env=self.env,
                           capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
      self.cli_error = f'flwr {args[0]} took more than {timeout:.0f} s'
      return None
    try:
      payload = json.loads(out.stdout[out.stdout.index('{'):])
    except ValueError:
      payload = None
    if out.returncode == 0 and isinstance(payload, dict) and payload.get('success', True):
      return payload
    self.cli_error = (f'flwr {args[0]} exited {out.returncode}: '
                      f'{(out.stdout + out.stderr).strip()[-300:]}')
    return None

  def online(self) -> int:
    """The SuperNodes `flwr supernode ls` lists online."""
    payload = self._cli_json('supernode', 'ls')
    if payload is None:
      return 0
    return sum(1 for node in payload.get('nodes', []) if node.get('status') == 'online')

  def _wait(self, ready, what: str) -> None:
    deadline = time.monotonic() + self.startup_timeout
    while not ready():
      dead = [p for p in [self.superlink, *self.supernodes] if p is not None and
              p.poll() is not None]
      if dead:
        raise _Exited(
            f'waiting for {what}: process {dead[0].args[0]} exited with code '
            f'{dead[0].returncode} (logs in {self.workdir})')
      if time.monotonic() > deadline:
        raise jobs_lib.EngineError(f'waiting for {what}: not ready after '
                                   f'{self.startup_timeout:.0f} s (logs in {self.workdir})')
      time.sleep(0.5)

  def pids(self) -> list[int]:
    """Process ids of the SuperLink and the SuperNodes still running."""
    return [p.pid for p in [self.superlink, *self.supernodes]
            if p is not None and p.poll() is None]

  @property
  def marker(self) -> str:
    """The environment entry every process of this deployment carries."""
    return processes.marker_entry(self.home)

  def kill_node(self, k: int, sig: int = signal.SIGKILL) -> None:
    """Kills SuperNode k and its process group (its running ClientApp too)."""
    proc = self.supernodes[k]
    if proc is not None and proc.poll() is None:
      processes.signal_group(proc, sig)
      proc.wait(timeout=30)

  def _stop_processes(self) -> None:
    procs = [p for p in [*self.supernodes, self.superlink] if p is not None]
    for p in procs:
      processes.signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + self.grace
    for p in procs:
      with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=max(0.0, deadline - time.monotonic()))
    groups = {p.pid for p in procs}
    processes.kill_all(self.marker, groups)
    for p in procs:
      with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=10)

  def stop(self) -> None:
    """Stops every process this deployment started (idempotent), then its watchdog."""
    self._stop_processes()
    processes.stop_watchdog(self._watchdog)
    self._watchdog = None
    for log in self._logs:
      log.close()
    self._logs = []
    if self._saved_sigterm is not None and _is_main_thread():
      signal.signal(signal.SIGTERM, self._saved_sigterm)
      self._saved_sigterm = None

  # --- runs -----------------------------------------------------------------------------------

  def submit(self, run_config: dict[str, Any], app_dir: str | os.PathLike = APP_DIR, *,
             num_nodes: int | None = None, config_dir: str | os.PathLike | None = None
             ) -> int:
    """`flwr run <app_dir> CONNECTION --run-config <file.toml>` (the file in the workdir
    holds `run_config`; a simulation run gets `num_nodes` virtual nodes, default N): the
    run id."""
    args = _flwr('run', str(app_dir), CONNECTION, '--format', 'json')
    if self.simulation:
      federation = simulation_federation(num_nodes or self.num_nodes)
      args += ['--federation-config', ' '.join(f'{k}={toml_value(v)}'
                                               for k, v in federation.items())]
    if run_config:
      self._submitted += 1
      folder = pathlib.Path(config_dir or self.workdir)
      folder.mkdir(parents=True, exist_ok=True)
      path = folder / f'run_config_{os.getpid()}_{self._submitted}.toml'
      path.write_text(toml_table(run_config), encoding='utf-8')
      args += ['--run-config', str(path)]
    out = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=300,
                         check=False)
    try:
      payload = json.loads(out.stdout[out.stdout.index('{'):])
      return int(payload['run-id'])
    except (ValueError, KeyError, TypeError) as e:
      raise jobs_lib.EngineError(f'flwr run failed (exit {out.returncode}): '
                                 f'{(out.stdout + out.stderr).strip()[-400:]}') from e

  def status(self, run_id: int) -> dict[str, Any] | None:
    """The run's entry of `flwr ls --run-id <id> --format json`; None when the call failed
    (`self.cli_error`) or does not list the run."""
    payload = self._cli_json('ls', '--run-id', str(run_id))
    runs = payload.get('runs', []) if payload is not None else []
    return next((r for r in runs if int(r['run-id']) == int(run_id)), None)

  def wait(self, run_id: int, timeout: float, poll: float = 2.0) -> dict[str, Any]:
    """Polls the run's status until it is finished; its entry. EngineError when the SuperLink
    dies or `timeout` passes (the run is stopped with `flwr stop` first)."""
    deadline = time.monotonic() + float(timeout)
    failures = 0
    while True:
      if self.superlink is None or self.superlink.poll() is not None:
        raise jobs_lib.EngineError(f'the SuperLink exited during run {run_id} (logs in '
                                   f'{self.workdir})')
      entry = self.status(run_id)
      if entry is None:
        # A loaded machine can make one CLI call fail or time out: give up only after
        # `CLI_FAILURES` failures in a row.
        failures += 1
        if failures >= CLI_FAILURES:
          raise jobs_lib.EngineError(f'`flwr ls --run-id {run_id}` failed {failures} times in '
                                     f'a row: {self.cli_error} (logs in {self.workdir})')
      else:
        failures = 0
        if str(entry.get('status', '')).startswith('finished'):
          return entry
      if time.monotonic() > deadline:
        subprocess.run(_flwr('stop', str(run_id), CONNECTION), env=self.env,
                       capture_output=True, timeout=60, check=False)
        raise jobs_lib.EngineError(f'run {run_id} did not finish within {timeout:.0f} s '
                                   '(stopped)')
      time.sleep(poll)

  def run(self, job: jobs_lib.Job, workdir: str | os.PathLike | None = None,
          timeout: float = 3600.0) -> Any:
    """Submits `job` (as data in the run config: `submit_job`), waits, and returns the
    result the ServerApp wrote (`result`)."""
    run_id = self.submit_job(job, workdir)
    return self.result(run_id, self.wait(run_id, timeout))

  def submit_job(self, job: jobs_lib.Job, workdir: str | os.PathLike | None = None) -> int:
    """`submit` with the run config {'job': `jobs.dumps(job)`} (its TOML file in `workdir`,
    default the deployment's; read by the `flwr` CLI only); the run id."""
    if not self.simulation and job.num_nodes != self.num_nodes:
      raise ValueError(f'the deployment has {self.num_nodes} SuperNodes, the job needs '
                       f'{job.num_nodes}')
    return self.submit({'job': jobs_lib.dumps(job)}, num_nodes=job.num_nodes,
                       config_dir=workdir)

  def result(self, run_id: int, entry: dict[str, Any]) -> Any:
    """What run `run_id`'s ServerApp returned (read from `app.result_path` under this
    SuperLink's Flower home, `codec` text); EngineError (one line: the ServerApp's error, or
    the run's status details) when it failed."""
    path = app_lib.result_path(run_id, self.home)
    if path.exists():
      out = codec.loads(path.read_text(encoding='ascii'))
      if 'error' in out:
        raise jobs_lib.EngineError(f"run {run_id}: {out['error']}")
      if entry.get('status') == 'finished:completed':
        return out['result']
    details = str(entry.get('status-details', '')).strip().splitlines()
    raise jobs_lib.EngineError(f"run {run_id} {entry.get('status')}: "
                               f"{details[-1] if details else 'no result written'} "
                               f'(logs in {self.workdir})')


class _Exited(jobs_lib.EngineError):
  """A process of the deployment exited while it was starting."""


def _is_main_thread() -> bool:
  import threading  # pylint: disable=import-outside-toplevel
  return threading.current_thread() is threading.main_thread()


def _raise_on_sigterm(signum, frame) -> None:
  """SIGTERM while a deployment runs: one line, then unwind (the `with` blocks stop every
  process), exit status 128 + 15."""
  del frame
  sys.stderr.write('error: terminated (SIGTERM) during a Flower deployment: its processes are '
                   'stopped; the same command with the same --workdir resumes at the first '
                   'point not stored\n')
  raise SystemExit(128 + signum)
