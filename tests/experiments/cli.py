"""Running an experiment script as a user would, for the end-to-end tests."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
SMOKE = 'configs/digits.py:smoke'


def run(experiment: str, workdir, *overrides, config: str = SMOKE,
        timeout: int = 600) -> subprocess.CompletedProcess:
  """`python -m experiments.<experiment> --config=... --workdir=... [overrides]` from the repo."""
  return subprocess.run(
      [sys.executable, '-m', f'experiments.{experiment}', f'--config={config}',
       f'--workdir={workdir}', *overrides],
      cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)


def smoke_results(tmp_path_factory, experiment: str, folder: str, *,
                  timeout: int = 600) -> tuple[pathlib.Path, dict]:
  """Runs the smoke config once into a fresh workdir; (workdir, results.json) on success."""
  workdir = tmp_path_factory.mktemp(folder) / 'run'
  proc = run(experiment, workdir, timeout=timeout)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(workdir / 'results.json', encoding='utf-8') as f:
    return workdir, json.load(f)
