"""The processes of a local deployment: ports, environment, process groups, the processes
that carry a deployment's `FLWR_HOME`, and the watchdog that ends them with their driver.

Every process a `LocalDeployment` starts (the SuperLink, the SuperNodes) runs in a session
and process group of its own with `FLWR_HOME=<the deployment's home>` in its environment; the
processes Flower starts from those (`flower-superexec`, `flwr-serverapp`, `flwr-clientapp`,
`flwr-simulation`, Ray's daemons, which start sessions of their own) inherit it, and
`FL_PRIVACY_DEPLOYMENT=<the same home>` (a SuperNode given a Flower home of its own keeps
that one). So `marked(marker_entry(home))` finds all of them, whichever group they sit in.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

WATCHDOG = pathlib.Path(__file__).with_name('watchdog.py')


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


MARKER = 'FL_PRIVACY_DEPLOYMENT'


def marker_entry(flwr_home: pathlib.Path) -> str:
  """The environment entry every process of the deployment at `flwr_home` carries (a
  SuperNode with a Flower home of its own too)."""
  return f'{MARKER}={flwr_home}'


def environment(flwr_home: pathlib.Path) -> dict[str, str]:
  """This process's environment for a deployment whose Flower home is `flwr_home` (its
  marker entry included)."""
  env = dict(os.environ)
  env[MARKER] = str(flwr_home)
  # The SuperLink and SuperNodes start `flwr-serverapp` / `flwr-clientapp` by name: this
  # interpreter's scripts first, whether or not its virtual environment is activated.
  env['PATH'] = os.pathsep.join([os.path.dirname(sys.executable), env.get('PATH', '')])
  env['FLWR_HOME'] = str(flwr_home)
  env['FLWR_TELEMETRY_ENABLED'] = '0'
  env.setdefault('FLWR_DISABLE_UPDATE_CHECK', '1')
  return env


def _state(pid: int | str) -> str | None:
  try:
    with open(f'/proc/{pid}/stat', encoding='utf-8') as f:
      return f.read().rsplit(')', 1)[1].split()[0]
  except (OSError, IndexError):
    return None


def alive(pid: int) -> bool:
  """Whether process `pid` exists and is not a zombie (Linux /proc)."""
  return _state(pid) not in (None, 'Z', 'X')


def group_members(groups: set[int]) -> list[int]:
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


def marked(entry: str) -> list[int]:
  """Live processes (not this one) whose environment holds `entry` (Linux /proc)."""
  out, needle = [], entry.encode() + b'\0'
  if not os.path.isdir('/proc'):
    return out
  for proc in pathlib.Path('/proc').iterdir():
    if not proc.name.isdigit() or int(proc.name) == os.getpid():
      continue
    try:
      if needle in (proc / 'environ').read_bytes() + b'\0' and alive(int(proc.name)):
        out.append(int(proc.name))
    except OSError:
      continue
  return out


def signal_group(proc: subprocess.Popen, sig: int) -> None:
  with contextlib.suppress(ProcessLookupError, PermissionError):
    os.killpg(proc.pid, sig)  # start_new_session: the group id is the leader's pid


def kill_all(entry: str, groups: set[int], timeout: float = 10.0) -> None:
  """SIGKILL every process of `groups` and every process carrying `entry`; returns once none
  runs (or after `timeout` seconds: SIGKILL is asynchronous)."""
  deadline = time.monotonic() + timeout
  while True:
    left = set(group_members(groups)) | set(marked(entry))
    if not left or time.monotonic() > deadline:
      return
    for group in groups:
      with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)
    for pid in left:
      with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.05)


def start_time(pid: int) -> str | None:
  """When process `pid` started (field 22 of /proc/<pid>/stat), None if it is gone."""
  try:
    with open(f'/proc/{pid}/stat', encoding='utf-8') as f:
      return f.read().rsplit(')', 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def start_watchdog(entry: str) -> subprocess.Popen | None:
  """`watchdog.py` watching this process (in a session of its own, so that a signal to this
  process's group spares it): once this process is gone, it SIGKILLs every process carrying
  `entry`. None where there is no /proc."""
  started = start_time(os.getpid())
  if started is None:
    return None
  return subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, '-I', str(WATCHDOG), str(os.getpid()), started, entry],
      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
      start_new_session=True, close_fds=True)


def stop_watchdog(proc: subprocess.Popen | None) -> None:
  if proc is not None and proc.poll() is None:
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
      proc.wait(timeout=10)
