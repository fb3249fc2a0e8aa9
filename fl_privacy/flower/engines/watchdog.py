"""A local deployment's watchdog: when its driver dies, SIGKILL every process it started.

`deployment.LocalDeployment` starts this file as a script (`python -I watchdog.py <pid>
<start time> <marker>`: the standard library only, no JAX, no Flower) in a session of its own,
before any Flower process. It polls the driver (pid and its start time in `/proc/<pid>/stat`,
so a recycled pid is not taken for the driver) every `POLL` seconds; once the driver is gone,
however it ended (SIGKILL included, where no `finally` of the driver runs), it SIGKILLs every
live process whose environment holds `<marker>` (`FLWR_HOME=<the deployment's home>`: the
SuperLink, the SuperNodes, their `flower-superexec`, the ServerApp and ClientApp processes,
Ray's daemons under a simulation-mode SuperLink), again until none is left, and exits. A
driver that stops its deployment itself ends the watchdog with SIGTERM.

Linux only (`/proc`); elsewhere the deployment starts no watchdog.
"""

import os
import signal
import sys
import time

POLL = 0.25      # seconds between looks at the driver
SETTLE = 30.0    # seconds the watchdog goes on killing what the marker finds


def start_time(pid: int) -> str | None:
  """Field 22 of /proc/<pid>/stat (when the process started), None when it is gone or a
  zombie."""
  try:
    with open(f'/proc/{pid}/stat', encoding='utf-8') as f:
      fields = f.read().rsplit(')', 1)[1].split()
  except (OSError, IndexError):
    return None
  return None if fields[0] in ('Z', 'X') else fields[19]


def marked(entry: str) -> list[int]:
  """Live processes other than this one whose environment holds `entry`."""
  out, needle = [], entry.encode() + b'\0'
  for name in os.listdir('/proc'):
    if not name.isdigit() or int(name) == os.getpid():
      continue
    try:
      with open(f'/proc/{name}/environ', 'rb') as f:
        if needle not in f.read() + b'\0':
          continue
    except OSError:
      continue
    if start_time(int(name)) is not None:
      out.append(int(name))
  return out


def kill_marked(entry: str, settle: float = SETTLE) -> None:
  """SIGKILL every process `marked(entry)` finds, until a look finds none (a dying SuperNode's
  runtime may still start a ClientApp)."""
  deadline = time.monotonic() + settle
  while time.monotonic() < deadline:
    pids = marked(entry)
    if not pids:
      return
    for pid in pids:
      try:
        os.kill(pid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass
    time.sleep(0.1)


def main(argv: list[str]) -> int:
  pid, started, entry = int(argv[1]), argv[2], argv[3]
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  while start_time(pid) == started:
    time.sleep(POLL)
  kill_marked(entry)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
