"""End-to-end tests of `python -m experiments.ami` (smoke config, bad inputs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from configs import digits
from fl_privacy import validate
from fl_privacy.pipelines import ami as ami_pipeline

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(workdir, *flags, config='configs/digits.py:smoke', timeout=300):
  cmd = [sys.executable, '-m', 'experiments.ami', f'--config={config}',
         f'--workdir={workdir}', *flags]
  env = dict(os.environ, PYTHONPATH=REPO)
  return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=timeout)


@pytest.fixture(scope='module')
def smoke_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('ami') / 'run'
  proc = _run(str(workdir))
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(workdir / 'results.json') as f:
    return workdir, json.load(f)


def test_smoke_results_schema_and_sanity(smoke_run):
  workdir, results = smoke_run
  assert results['experiment'] == 'ami'
  games = [p for p in results['points'] if p['params']['part'] == 'game']
  assert {(p['params']['mechanism'], p['params']['epsilon']) for p in games} == {
      ('none', None), ('bitrand', 2.0), ('bitrand', 9.0)}
  for p in games:
    m = p['metrics']
    assert p['n_trials'] == 400 and m['n_pos'] == m['n_neg'] == 200
    for name in ('adv', 'tpr', 'tnr', 'accuracy'):
      assert 0.0 <= m[f'{name}_ci_low'] <= m[name] <= m[f'{name}_ci_high'] <= 1.0
    assert m['adv'] == pytest.approx((m['tpr'] + m['tnr']) / 2)
    # The paper's rule is `adv`; the calibrated extension is reported beside it.
    assert m['adv_calibrated_ci_low'] <= m['adv_calibrated'] <= m['adv_calibrated_ci_high']
  none = next(p['metrics'] for p in games if p['params']['mechanism'] == 'none')
  assert none['adv'] >= 0.8 and none['tpr'] == 1.0
  high = next(p['metrics'] for p in games if p['params']['epsilon'] == 9.0)
  assert 'certified_delta_star' in high and high['certified_range'] > 0
  assert high['certified_q'] == 717  # the whole game pool (digits)
  dp = [p for p in results['points'] if p['params']['part'] == 'dp_averaging']
  assert dp and all(p['metrics']['rounds_closed_form'] >= 1 for p in dp)
  for name in ('ami_vs_epsilon', 'neuron_histograms', 'certified', 'dp_rounds'):
    assert (workdir / f'{name}.png').stat().st_size > 0
  assert (workdir / 'results.csv').exists()


def test_resume_keeps_saved_points(smoke_run):
  workdir, results = smoke_run
  t0 = time.time()
  proc = _run(str(workdir))
  assert proc.returncode == 0, proc.stderr[-2000:]
  with open(workdir / 'results.json') as f:
    again = json.load(f)
  assert again['points'] == results['points']


@pytest.mark.parametrize('flag,field', [
    ('--config.ami.mechanisms=("none","laplace")', 'ami.mechanisms'),
    ('--config.ami.batch_size=100000', 'ami.batch_size'),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, flag, field):
  workdir = tmp_path / 'never'
  proc = _run(str(workdir), flag)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert field in proc.stderr
  assert not workdir.exists()


def test_unavailable_dataset_fails_fast(tmp_path):
  workdir = tmp_path / 'never'
  t0 = time.time()
  proc = _run(str(workdir), config=f'configs/celeba.py:smoke,data_dir={tmp_path / "no_tfds"}',
              timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert 'celeb' in proc.stderr.lower()
  assert time.time() - t0 < 90
  assert not workdir.exists()


@pytest.mark.parametrize('field,value', [
    ('epsilons', (1.0, 0.0)), ('epsilons', (-2.0,)), ('num_neurons', 0),
    ('mechanisms', ('bitrand', 'rappor')), ('decision_path', 'slow'),
])
def test_validation_names_the_field(field, value):
  config = digits.get_config('smoke')
  config.ami[field] = value
  with pytest.raises(validate.ConfigError) as e:
    ami_pipeline.validate_config(config)
  assert e.value.field == f'ami.{field}'
