"""The `defense` config section: end to end under a defense, and bad input exits 2."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from configs import digits
from fl_privacy import defenses
from fl_privacy import validate
from tests.experiments import cli

REPO = pathlib.Path(__file__).resolve().parents[2]
SMALL = ('--config.dishonest.M=(4,)', "--config.dishonest.optimizers=('momentum',)",
         '--config.dishonest.runs=4')


def _run(experiment, workdir, *overrides):
  return subprocess.run(
      [sys.executable, '-m', f'experiments.{experiment}', '--config=configs/digits.py:smoke',
       f'--workdir={workdir}', *overrides],
      cwd=REPO, env=cli.env(), capture_output=True, text=True, timeout=600, check=False)


BAD = [
    ('name', 'nope', 'one of'),
    ('noise_multiplier', '-1.0', '>= 0'),
    ('clip_norm', '-0.5', '> 0'),
    ('sparsity', '0.0', '(0, 1]'),
    ('sparsity', '1.5', '(0, 1]'),
    ('bits', '0', 'integer in [1, 24]'),
    ('participation', '0.0', '(0, 1]'),
    ('participation', '1.5', '(0, 1]'),
    ('target_epsilon', '0.0', '> 0'),
    ('target_epsilon', '-2.0', '> 0'),
]


@pytest.mark.parametrize('field,value,allowed', BAD)
def test_validate_section_names_the_field(field, value, allowed):
  config = digits.get_config('smoke')
  config.defense[field] = value if field == 'name' else (
      int(value) if field == 'bits' else float(value))
  with pytest.raises(validate.ConfigError) as e:
    defenses.validate_section(config.defense)
  assert f'config.defense.{field}:' in str(e.value) and allowed in str(e.value)


# Every case above through the command line would cost a process start each; these cover the
# path from flag to exit status (the checks themselves are the same function). Each names a
# defense that reads the field (a field the named defense does not read is refused as unused).
_READER = {'noise_multiplier': 'update_dp', 'sparsity': 'sparsify', 'target_epsilon': 'update_dp'}


@pytest.mark.parametrize('field,value,allowed', [BAD[0], BAD[1], BAD[3], BAD[8]])
def test_dishonest_bad_defense_exits_2_writing_nothing(tmp_path, field, value, allowed):
  workdir = tmp_path / 'never'
  named = [f'--config.defense.name={_READER[field]}'] if field in _READER else []
  proc = cli.run_forked('dishonest_mia', workdir, *named, f'--config.defense.{field}={value}')
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.startswith('error')]
  assert len(lines) == 1 and f'config.defense.{field}' in lines[0] and allowed in lines[0]
  assert not os.path.exists(workdir)


def test_ami_bad_defense_exits_2_writing_nothing(tmp_path):
  workdir = tmp_path / 'never'
  proc = cli.run_forked('ami', workdir, '--config.defense.name=nope')
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert 'config.defense.name' in proc.stderr
  assert not os.path.exists(workdir)


def test_dishonest_under_dp_sgd_reports_epsilon(tmp_path):
  proc = _run('dishonest_mia', tmp_path / 'run', *SMALL, '--config.defense.name=dp_sgd',
              '--config.defense.target_epsilon=4.0')
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(tmp_path / 'run' / 'results.json', encoding='utf-8') as f:
    (point,) = json.load(f)['points']
  assert point['params']['defense'] == 'dp_sgd'
  assert point['params']['defense_target_epsilon'] == 4.0
  assert point['params']['defense_clip_norm'] == 1.0
  assert 'defense_noise_multiplier' not in point['params']
  m = point['metrics']
  assert 3.5 < m['dp_epsilon'] <= 4.0 and m['noise_multiplier'] > 0


def test_dishonest_upload_defense_changes_what_the_server_sees(tmp_path):
  # Sparsifying every tensor to its top 1% zeroes the 84-entry fc2 bias (int(0.01 * 84) = 0):
  # the detector's bias never moves in what the server receives.
  proc = _run('dishonest_mia', tmp_path / 'run', *SMALL, '--config.defense.name=sparsify',
              '--config.defense.sparsity=0.99', '--config.defense.sparsify_min_size=0')
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(tmp_path / 'run' / 'results.json', encoding='utf-8') as f:
    (point,) = json.load(f)['points']
  assert point['params']['defense_sparsity'] == 0.99
  assert point['metrics']['tpr'] == 0.0 and point['metrics']['delta_in_min'] == 0.0
