"""Running an experiment script as a user would, for the end-to-end tests."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
SMOKE = 'configs/digits.py:smoke'
# The smoke runs are dominated by XLA compilation, not by running the programs: LLVM's
# backend optimisations off halve a cold `dishonest_mia` smoke run (138 s -> 68 s here) and
# leave its metrics identical. Only the experiments' subprocesses get it (added to the
# session's XLA_FLAGS, see conftest.py), unless XLA_FLAGS already sets the level.
FAST_COMPILE = '--xla_backend_optimization_level=0'


def env(**extra) -> dict:
  """The environment of an experiment subprocess: this one, the repo importable, fast compiles."""
  out = dict(os.environ, **extra)
  out['PYTHONPATH'] = os.pathsep.join(p for p in (str(REPO), out.get('PYTHONPATH')) if p)
  flags = out.get('XLA_FLAGS', '')
  if FAST_COMPILE.split('=')[0] not in flags:
    out['XLA_FLAGS'] = f'{flags} {FAST_COMPILE}'.strip()
  return out


def run(experiment: str, workdir, *overrides, config: str = SMOKE,
        timeout: int = 600) -> subprocess.CompletedProcess:
  """`python -m experiments.<experiment> --config=... --workdir=... [overrides]` from the repo."""
  return subprocess.run(
      [sys.executable, '-m', f'experiments.{experiment}', f'--config={config}',
       f'--workdir={workdir}', *overrides],
      cwd=REPO, env=env(), capture_output=True, text=True, timeout=timeout, check=False)


def smoke_results(tmp_path_factory, experiment: str, folder: str, *,
                  timeout: int = 600) -> tuple[pathlib.Path, dict]:
  """Runs the smoke config once into a fresh workdir; (workdir, results.json) on success."""
  workdir = tmp_path_factory.mktemp(folder) / 'run'
  proc = run(experiment, workdir, timeout=timeout)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(workdir / 'results.json', encoding='utf-8') as f:
    return workdir, json.load(f)
