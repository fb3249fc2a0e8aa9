"""Running an experiment script as a user would, for the end-to-end tests."""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
SMOKE = 'configs/digits.py:smoke'
# Most smoke runs are dominated by XLA compilation, not by running the programs: LLVM's
# backend optimisations off (level 0) take a cold `dishonest_mia` smoke run from 62 to 19
# CPU-seconds, `pastel` 49 -> 26, `flower_audit` 50 -> 33 (against the default level, both
# with the classic fusion emitters; 2026-11-27), and leave the metrics identical. FedMIA's
# smoke trains long enough that unoptimised programs cost more than they save (76 s at level
# 0, 40 at the session's level 1, 53 at the default): it keeps the session's level
# (conftest.py). A level the user put in XLA_FLAGS is kept everywhere.
FAST_COMPILE = '--xla_backend_optimization_level=0'
EXECUTION_BOUND = frozenset({'fedmia'})
# '1' where the user's XLA_FLAGS set the level (conftest.py sets it for the session).
USER_LEVEL = 'FL_PRIVACY_TEST_USER_XLA_LEVEL'


def env(*, fast_compile: bool = True, **extra) -> dict:
  """The environment of an experiment subprocess: this one, the repo importable, fast compiles."""
  out = dict(os.environ, **extra)
  out['PYTHONPATH'] = os.pathsep.join(p for p in (str(REPO), out.get('PYTHONPATH')) if p)
  if fast_compile and not os.environ.get(USER_LEVEL):
    flags = [f for f in out.get('XLA_FLAGS', '').split()
             if not f.startswith('--xla_backend_optimization_level')]
    out['XLA_FLAGS'] = ' '.join(flags + [FAST_COMPILE])
  return out


def run(experiment: str, workdir, *overrides, config: str = SMOKE,
        timeout: int = 600) -> subprocess.CompletedProcess:
  """`python -m experiments.<experiment> --config=... --workdir=... [overrides]` from the repo."""
  return subprocess.run(
      [sys.executable, '-m', f'experiments.{experiment}', f'--config={config}',
       f'--workdir={workdir}', *overrides],
      cwd=REPO, env=env(fast_compile=experiment not in EXECUTION_BOUND), capture_output=True,
      text=True, timeout=timeout, check=False)


def smoke_results(tmp_path_factory, experiment: str, folder: str, *,
                  timeout: int = 600) -> tuple[pathlib.Path, dict]:
  """Runs the smoke config once into a fresh workdir; (workdir, results.json) on success."""
  workdir = tmp_path_factory.mktemp(folder) / 'run'
  proc = run(experiment, workdir, timeout=timeout)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(workdir / 'results.json', encoding='utf-8') as f:
    return workdir, json.load(f)


_SERVER = []


def forked_client():
  """This test process's fork server (forkserver.py), started on first use, closed at exit."""
  from tests.experiments import forkserver  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  if not _SERVER:
    _SERVER.append(forkserver.Client(REPO, env()))
    atexit.register(_SERVER[0].close)
  return _SERVER[0]


def run_forked(experiment: str, workdir, *overrides, config: str = SMOKE,
               **extra_env) -> subprocess.CompletedProcess:
  """`run` for a command that stops at a check (a refused input): the same argv, cwd and
  environment, run in a fork of one interpreter per test process that imported the library
  once (`forked_client`), so each refusal costs a fork, not a Python start (about 3 s here).
  What a fork cannot show (import-time output) test_bad_inputs checks with real processes."""
  return forked_client().run(
      experiment, [f'--config={config}', f'--workdir={workdir}', *overrides], cwd=REPO,
      env=env(fast_compile=experiment not in EXECUTION_BOUND, **extra_env))
