"""Runs `python -m experiments.<name> FLAGS` many times for the price of one interpreter start.

The bad-input rows each start Python, import JAX, Flax and the library, and stop at the first
check: the imports were most of their time. The server (`python -m tests.experiments.forkserver`,
one per test process, `cli.forked_client`) imports `experiments.common` once (JAX's backend is not
started, so forking stays safe), then for each request on stdin forks a child that runs the
experiment module as `__main__` with the request's argv, cwd and environment, its stdout and
stderr written to files; the reply is the child's exit status and both streams, as
`subprocess.run` would give them. What the fork shares is only what every run imports first:
an import-time warning would not show here, which is why `test_bad_inputs` keeps one real
subprocess per experiment (`test_every_experiment_prints_only_the_error_line`).
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import tempfile
import traceback


def _child(request: dict, out_path: str, err_path: str) -> None:
  code = 1
  try:
    os.chdir(request['cwd'])
    for fd, path in ((1, out_path), (2, err_path)):
      target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
      os.dup2(target, fd)
      os.close(target)
    sys.stdout = open(1, 'w', encoding='utf-8', closefd=False)  # pylint: disable=consider-using-with
    sys.stderr = open(2, 'w', encoding='utf-8', closefd=False)  # pylint: disable=consider-using-with
    os.environ.clear()
    os.environ.update(request['env'])
    sys.argv = ['-m', *request['flags']]
    try:
      runpy.run_module(f'experiments.{request["experiment"]}', run_name='__main__',
                       alter_sys=True)
      code = 0
    except SystemExit as e:
      if e.code is None:
        code = 0
      elif isinstance(e.code, int):
        code = e.code
      else:  # as the interpreter does: the message on stderr, status 1
        print(e.code, file=sys.stderr)
        code = 1
    except BaseException:  # pylint: disable=broad-except
      traceback.print_exc()
      code = 1
  finally:
    try:
      sys.stdout.flush()
      sys.stderr.flush()
    finally:
      os._exit(code)  # pylint: disable=protected-access


def _preload() -> None:
  """Imports `experiments.common` and every catalog pipeline (one that fails to import, e.g.
  without an optional extra, fails again in each child, as it would in its own process)."""
  import experiments.common  # pylint: disable=g-import-not-at-top,unused-import,import-outside-toplevel
  from fl_privacy import catalog  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  from fl_privacy.pipelines import base  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  for name in catalog.NAMES:
    try:
      base.load(name)
    except Exception:  # pylint: disable=broad-except
      pass


def serve() -> None:
  _preload()
  print(json.dumps({'ready': True}), flush=True)
  for line in sys.stdin:
    request = json.loads(line)
    with tempfile.TemporaryDirectory() as tmp:
      out_path, err_path = os.path.join(tmp, 'out'), os.path.join(tmp, 'err')
      pid = os.fork()
      if pid == 0:
        _child(request, out_path, err_path)
      _, status = os.waitpid(pid, 0)
      streams = []
      for path in (out_path, err_path):
        try:
          with open(path, encoding='utf-8', errors='replace') as f:
            streams.append(f.read())
        except FileNotFoundError:
          streams.append('')
    print(json.dumps({'returncode': os.waitstatus_to_exitcode(status), 'stdout': streams[0],
                      'stderr': streams[1]}), flush=True)


class Client:
  """A running server; `run(...)` returns a `subprocess.CompletedProcess`."""

  def __init__(self, repo, env: dict):
    self._proc = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, '-m', 'tests.experiments.forkserver'], cwd=repo, env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ready = self._proc.stdout.readline()
    if not ready:
      raise RuntimeError('the fork server did not start')

  def run(self, experiment: str, flags: list[str], *, cwd, env: dict
          ) -> subprocess.CompletedProcess:
    self._proc.stdin.write(json.dumps({'experiment': experiment, 'flags': list(flags),
                                       'cwd': str(cwd), 'env': dict(env)}) + '\n')
    self._proc.stdin.flush()
    reply = json.loads(self._proc.stdout.readline())
    return subprocess.CompletedProcess(['python', '-m', f'experiments.{experiment}', *flags],
                                       reply['returncode'], reply['stdout'], reply['stderr'])

  def close(self) -> None:
    self._proc.stdin.close()
    self._proc.wait(timeout=60)


if __name__ == '__main__':
  serve()
