"""A local Deployment Engine (`LocalDeployment`: one SuperLink and N SuperNodes started
with Flower's CLI) running jobs with `flwr run` on the repository's Flower App.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import pickle
import signal
import socket
import subprocess
import sys
import time
import warnings
from typing import Any, Sequence

os.environ.setdefault('FLWR_TELEMETRY_ENABLED', '0')

# pylint: disable=wrong-import-position

from fl_privacy.flower.engines import jobs as jobs_lib


# The repository's Flower App (pyproject.toml with [tool.flwr.app]); `flwr run` builds it.
APP_DIR = pathlib.Path(__file__).resolve().parents[2] / 'flower_app'
CONNECTION = 'fl-privacy-local'
RESULT_FILE = 'result.pkl'


# Memory a node of the local deployment holds while a round runs: its `flower-supernode`
# (~130 MB resident, measured) and the `flwr-clientapp` process it starts for the message
# (JAX, Flower, fl_privacy and the node's data: ~0.45 GB at its peak here). Every node of a
# round runs at once (the SuperLink hands all of them their message together).
NODE_BYTES = int(0.6e9)


def max_deployment_nodes(available: int | None = None) -> int:
  """The most nodes a local deployment can run on this machine: 80% of the available memory
  (`MemAvailable`, or `available` bytes) over `NODE_BYTES`."""
  if available is None:
    available = _available_memory()
  return max(1, int(0.8 * available) // NODE_BYTES)


def _available_memory() -> int:
  try:
    with open('/proc/meminfo', encoding='utf-8') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return int(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))


# ------------------------------------------------------------------------ local deployment ---

def free_ports(count: int) -> list[int]:
  """`count` distinct TCP ports free on 127.0.0.1 now (bound together, then released)."""
  socks = []
  try:
    for _ in range(count):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      s.bind(('127.0.0.1', 0))
      socks.append(s)
    return [s.getsockname()[1] for s in socks]
  finally:
    for s in socks:
      s.close()


def _listening(port: int) -> bool:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.settimeout(0.5)
    return s.connect_ex(('127.0.0.1', port)) == 0


def _environment(flwr_home: pathlib.Path) -> dict[str, str]:
  env = dict(os.environ)
  # The SuperLink and SuperNodes start `flwr-serverapp` / `flwr-clientapp` by name: this
  # interpreter's scripts first, whether or not its virtual environment is activated.
  env['PATH'] = os.pathsep.join([os.path.dirname(sys.executable), env.get('PATH', '')])
  env['FLWR_HOME'] = str(flwr_home)
  env['FLWR_TELEMETRY_ENABLED'] = '0'
  env.setdefault('FLWR_DISABLE_UPDATE_CHECK', '1')
  return env


def _flwr(*args: str) -> list[str]:
  return [os.path.join(os.path.dirname(sys.executable), 'flwr'), *args]


class LocalDeployment:
  """Flower's Deployment Engine on loopback: one SuperLink and `num_nodes` SuperNodes (or,
  with `simulation=True`, one SuperLink in simulation mode: `flwr run` then runs the app on
  Flower's Simulation Engine, `num_nodes` virtual nodes, in the SuperLink's own processes:
  the "simulation federation" of `flwr run`).

  A context manager: entering starts `flower-superlink --insecure` on a free port (its
  Fleet, Control and Runtime APIs share it in Flower 1.42) and `num_nodes`
  `flower-supernode --insecure` processes (node k: `--node-config "partition-id=k
  num-partitions=N"`, its own free port for the ClientApp runtime), each in a process group
  of its own, with a private `FLWR_HOME` whose `config.toml` names the SuperLink as the
  connection `CONNECTION`; it returns when every node is registered. Leaving (also on an
  exception, KeyboardInterrupt or SIGTERM) stops every process group (SIGTERM, then SIGKILL
  after `grace` seconds). Logs: `<workdir>/superlink.log`, `supernode_<k>.log`.
  Runtime dependency installation (`uv sync` of the app's dependencies) is disabled: the
  apps run in this environment.
  """

  def __init__(self, num_nodes: int, workdir: str | os.PathLike, *,
               node_configs: Sequence[dict] | None = None, startup_timeout: float = 120.0,
               grace: float = 3.0, simulation: bool = False):
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
    if self.simulation and node_configs:
      raise ValueError('a simulation federation has no SuperNodes to configure')
    self.superlink: subprocess.Popen | None = None
    self.supernodes: list[subprocess.Popen | None] = []
    self.port: int | None = None
    self.home = self.workdir / 'flwr_home'
    self._logs: list[Any] = []
    self._saved_sigterm = None

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

  def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen:
    log = open(self.workdir / log_name, 'wb')  # pylint: disable=consider-using-with
    self._logs.append(log)
    with warnings.catch_warnings():
      # JAX warns on every fork; Popen forks only to exec the command at once.
      warnings.filterwarnings('ignore', message=r'os\.fork\(\) was called')
      return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, env=self.env, start_new_session=True)

  def start(self, attempts: int = 3) -> None:
    """Starts the SuperLink and the SuperNodes; returns when all nodes are registered. A
    process that exits while starting (a port taken between `free_ports` and its bind) is
    retried on fresh ports, `attempts` times in all."""
    for attempt in range(int(attempts)):
      try:
        return self._start_once()
      except _Exited:
        self.stop()
        self.superlink, self.supernodes = None, []
        if attempt == int(attempts) - 1:
          raise

  def _start_once(self) -> None:
    self.workdir.mkdir(parents=True, exist_ok=True)
    self.home.mkdir(parents=True, exist_ok=True)
    self.env = _environment(self.home)
    ports = free_ports(1 + self.num_nodes)
    self.port = ports[0]
    (self.home / 'config.toml').write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
        f'address = "127.0.0.1:{self.port}"\ninsecure = true\n', encoding='utf-8')
    if _is_main_thread():
      self._saved_sigterm = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    bin_dir = os.path.dirname(sys.executable)
    self.superlink = self._spawn(
        [os.path.join(bin_dir, 'flower-superlink'), '--insecure',
         '--disable-runtime-dependency-installation', '--host', '127.0.0.1',
         '--port', str(self.port)] + (['--simulation'] if self.simulation else []),
        'superlink.log')
    self._wait(self._superlink_up, 'the SuperLink to listen')
    if self.simulation:
      return  # the simulation runtime starts its virtual nodes with each run
    for k in range(self.num_nodes):
      config = {'partition-id': k, 'num-partitions': self.num_nodes, **self.node_configs[k]}
      node_config = ' '.join(f'{key}={_toml(v)}' for key, v in config.items())
      self.supernodes.append(self._spawn(
          [os.path.join(bin_dir, 'flower-supernode'), '--insecure',
           '--superlink', f'127.0.0.1:{self.port}', '--host', '127.0.0.1',
           '--port', str(ports[1 + k]), '--node-config', node_config],
          f'supernode_{k}.log'))
    self._wait(lambda: self._registered() >= self.num_nodes,
               f'{self.num_nodes} SuperNodes to register')

  def _superlink_up(self) -> bool:
    # Its own log line, not just an open port: another process may hold the port.
    text = (self.workdir / 'superlink.log').read_text(errors='replace')
    return f'Uvicorn running on http://127.0.0.1:{self.port}' in text and _listening(self.port)

  def _registered(self) -> int:
    text = (self.workdir / 'superlink.log').read_text(errors='replace')
    return text.count('[Fleet.ActivateNode] Activated node_id=')

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
      time.sleep(0.2)

  def pids(self) -> list[int]:
    """Process ids of the SuperLink and the SuperNodes still running."""
    return [p.pid for p in [self.superlink, *self.supernodes]
            if p is not None and p.poll() is None]

  def kill_node(self, k: int, sig: int = signal.SIGKILL) -> None:
    """Kills SuperNode k and its process group (its running ClientApp too)."""
    proc = self.supernodes[k]
    if proc is not None and proc.poll() is None:
      _signal_group(proc, sig)
      proc.wait(timeout=30)

  def stop(self) -> None:
    """Stops every process group this deployment started (idempotent)."""
    procs = [p for p in [*self.supernodes, self.superlink] if p is not None]
    for p in procs:
      _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + self.grace
    for p in procs:
      try:
        p.wait(timeout=max(0.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        pass
    for p in procs:
      _signal_group(p, signal.SIGKILL)  # the group's children too, even if p exited
      with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=10)
    # Processes that left the groups (Ray's daemons under a simulation-mode SuperLink start
    # sessions of their own) still carry this deployment's FLWR_HOME: those too.
    marked = _marked(f'FLWR_HOME={self.home}')
    for pid in marked:
      with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    # SIGKILL is asynchronous: return once none of them runs any more.
    groups = {p.pid for p in procs}
    deadline = time.monotonic() + 10
    while ((_group_members(groups) or _marked(f'FLWR_HOME={self.home}'))
           and time.monotonic() < deadline):
      time.sleep(0.05)
    for log in self._logs:
      log.close()
    self._logs = []
    if self._saved_sigterm is not None and _is_main_thread():
      signal.signal(signal.SIGTERM, self._saved_sigterm)
      self._saved_sigterm = None

  # --- runs -----------------------------------------------------------------------------------

  def submit(self, run_config: dict[str, Any], app_dir: str | os.PathLike = APP_DIR) -> int:
    """`flwr run <app_dir> CONNECTION --run-config ...`: the run id."""
    args = _flwr('run', str(app_dir), CONNECTION, '--format', 'json')
    if self.simulation:
      args += ['--federation-config', f'num-supernodes={self.num_nodes}']
    if run_config:
      args += ['--run-config', ' '.join(f'{k}={_toml(v)}' for k, v in run_config.items())]
    out = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=120,
                         check=False)
    try:
      payload = json.loads(out.stdout[out.stdout.index('{'):])
      return int(payload['run-id'])
    except (ValueError, KeyError, TypeError) as e:
      raise jobs_lib.EngineError(f'flwr run failed (exit {out.returncode}): '
                                 f'{(out.stdout + out.stderr).strip()[-400:]}') from e

  def status(self, run_id: int) -> dict[str, Any]:
    """The run's entry of `flwr ls --run-id <id> --format json`."""
    out = subprocess.run(_flwr('ls', CONNECTION, '--run-id', str(run_id), '--format', 'json'),
                         env=self.env, capture_output=True, text=True, timeout=60, check=False)
    try:
      runs = json.loads(out.stdout[out.stdout.index('{'):])['runs']
      return next(r for r in runs if int(r['run-id']) == int(run_id))
    except (ValueError, KeyError, StopIteration) as e:
      raise jobs_lib.EngineError(f'flwr ls failed (exit {out.returncode}): '
                                 f'{(out.stdout + out.stderr).strip()[-400:]}') from e

  def wait(self, run_id: int, timeout: float, poll: float = 2.0) -> dict[str, Any]:
    """Polls the run's status until it is finished; its entry. EngineError when the SuperLink
    dies or `timeout` passes (the run is stopped with `flwr stop` first)."""
    deadline = time.monotonic() + float(timeout)
    while True:
      if self.superlink is None or self.superlink.poll() is not None:
        raise jobs_lib.EngineError(f'the SuperLink exited during run {run_id} (logs in '
                                   f'{self.workdir})')
      entry = self.status(run_id)
      if str(entry.get('status', '')).startswith('finished'):
        return entry
      if time.monotonic() > deadline:
        subprocess.run(_flwr('stop', str(run_id), CONNECTION), env=self.env,
                       capture_output=True, timeout=60, check=False)
        raise jobs_lib.EngineError(f'run {run_id} did not finish within {timeout:.0f} s '
                                   '(stopped)')
      time.sleep(poll)

  def run(self, job: jobs_lib.Job, workdir: str | os.PathLike,
          timeout: float = 3600.0) -> Any:
    """Submits `job` (saved to `<workdir>/job_<hash>.pkl`), waits, and returns the result the
    ServerApp wrote; EngineError (one line: the run's status details) when it failed."""
    workdir = pathlib.Path(workdir)
    path = jobs_lib.save(job, workdir / f'job_{jobs_lib.job_hash(job)[:12]}.pkl')
    result_path = path.with_suffix('.result.pkl')
    with contextlib.suppress(FileNotFoundError):
      result_path.unlink()
    run_id = self.submit({'job': str(path)})
    entry = self.wait(run_id, timeout)
    if result_path.exists():
      with open(result_path, 'rb') as f:
        out = pickle.load(f)
      if isinstance(out, BaseException):
        raise out
      if entry.get('status') == 'finished:completed':
        return out
    details = str(entry.get('status-details', '')).strip().splitlines()
    raise jobs_lib.EngineError(f"run {run_id} {entry.get('status')}: "
                               f"{details[-1] if details else 'no result written'} "
                               f'(logs in {self.workdir})')


class _Exited(jobs_lib.EngineError):
  """A process of the deployment exited while it was starting."""


def _toml(value: Any) -> str:
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, (int, float)):
    return repr(value)
  return json.dumps(str(value))  # a TOML basic string


def _group_members(groups: set[int]) -> list[int]:
  """Live (not zombie) processes whose process group is one of `groups` (Linux /proc; none
  elsewhere)."""
  out = []
  if not os.path.isdir('/proc'):
    return out
  for entry in pathlib.Path('/proc').iterdir():
    if not entry.name.isdigit():
      continue
    try:
      stat = (entry / 'stat').read_text().rsplit(')', 1)[1].split()
    except (OSError, IndexError):
      continue
    if int(stat[2]) in groups and stat[0] not in ('Z', 'X'):
      out.append(int(entry.name))
  return out


def _marked(entry: str) -> list[int]:
  """Live processes (not this one) whose environment holds `entry` (Linux /proc)."""
  out, needle = [], entry.encode() + b'\0'
  if not os.path.isdir('/proc'):
    return out
  for proc in pathlib.Path('/proc').iterdir():
    if not proc.name.isdigit() or int(proc.name) == os.getpid():
      continue
    try:
      if needle in (proc / 'environ').read_bytes() + b'\0':
        state = (proc / 'stat').read_text().rsplit(')', 1)[1].split()[0]
        if state not in ('Z', 'X'):
          out.append(int(proc.name))
    except (OSError, IndexError):
      continue
  return out


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
  with contextlib.suppress(ProcessLookupError, PermissionError):
    os.killpg(proc.pid, sig)  # start_new_session: the group id is the leader's pid


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
