"""End to end: `python -m experiments.ldp_audit` on the offline digits smoke config."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest
from tests.experiments import cli

REPO = pathlib.Path(__file__).resolve().parents[2]
SMOKE = 'configs/digits.py:smoke'


def _run(workdir, *overrides, timeout=600):
  cmd = [sys.executable, '-m', 'experiments.ldp_audit', f'--config={SMOKE}',
         f'--workdir={workdir}', *overrides]
  env = cli.env(JAX_PLATFORMS='cpu')
  return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                        timeout=timeout, env=env)


def _points(workdir):
  with open(os.path.join(workdir, 'results.json'), encoding='utf-8') as f:
    results = json.load(f)
  assert results['experiment'] == 'ldp_audit'
  return {(p['params']['crafter'], p['params']['distinguisher'],
           p['params']['epsilon']): p for p in results['points']}


@pytest.fixture(scope='module')
def smoke_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('ldp') / 'run'
  proc = _run(workdir)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir


def test_smoke_schema_and_figure(smoke_run):
  points = _points(smoke_run)
  # smoke: 3 crafters x 2 distinguishers x 2 epsilons.
  assert len(points) == 12
  for (crafter, dist, eps), p in points.items():
    assert p['params']['mechanism'] == 'ldp_sgd'
    assert p['n_trials'] == 1000
    m = p['metrics']
    for rate in ('fp', 'fn', 'acc'):
      assert m[f'{rate}_ci_low'] <= m[rate] <= m[f'{rate}_ci_high']
    assert m['n_neg'] + m['n_pos'] == 1000
    lower = float(m['eps_emp_lower'])
    assert 0.0 <= lower <= float(m['eps_emp']) <= float(m['eps_emp_upper'])
    assert m['privacy_violation'] == 0.0, (crafter, dist, eps)
    assert m['eps_claimed'] == eps
    assert m['dim'] == 10_650  # AuditCNN on 8x8x1 digits, 10 classes
  assert (smoke_run / 'fig2_ldp_sgd.png').stat().st_size > 0
  assert (smoke_run / 'results.csv').exists()


def test_smoke_numbers_are_sane(smoke_run):
  points = _points(smoke_run)
  for eps in (1.0, 4.0):
    # Proposition 1: the dummy gradient's white-box test attains the bound.
    m = points[('dummy_gradient', 'white_box', eps)]['metrics']
    assert m['acc_ci_low'] <= m['acc_bound'] <= m['acc_ci_high']
    # A flip is exactly as good as its gradient norm allows.
    # Four 95% intervals in one test miss together far more often than 5%, so this
    # check uses a 4-sigma binomial band around the exact accuracy instead.
    p = points[('gradient_flip', 'white_box', eps)]
    m, n = p['metrics'], p['n_trials']
    exact = m['acc_white_box_exact']
    assert abs(m['acc'] - exact) <= 4 * (exact * (1 - exact) / n) ** 0.5
  # Benign black-box stays far below the claim (the paper's finding).
  m = points[('benign', 'black_box', 4.0)]['metrics']
  assert float(m['eps_emp_lower']) < 1.0


def test_resume_keeps_points(smoke_run):
  before = _points(smoke_run)
  proc = _run(smoke_run)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert _points(smoke_run) == before


@pytest.mark.parametrize('override,field', [
    ('--config.ldp_audit.epsilons=(0.0,1.0)', 'ldp_audit.epsilons'),
    ('--config.ldp_audit.clip_norm=-1.0', 'ldp_audit.clip_norm'),
    ("--config.ldp_audit.crafters=('benign','evil')", 'ldp_audit.crafters'),
    ("--config.ldp_audit.distinguishers=('grey_box',)",
     'ldp_audit.distinguishers'),
])
def test_bad_config_exits_2_and_writes_nothing(tmp_path, override, field):
  workdir = tmp_path / 'never'
  proc = cli.run_forked('ldp_audit', workdir, override, JAX_PLATFORMS='cpu')
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert f'config.{field}' in proc.stderr
  assert not workdir.exists()


def test_input_mechanisms_claimed_vs_attained(tmp_path):
  # BitRand's and OME's claimed eps are far below what their bit probabilities
  # allow: the audit must certify more and flag it; the Gaussian mechanism's
  # optimal test matches its exact error rate and raises no flag.
  for mechanism, flagged in (('bitrand', True), ('ome', True),
                             ('gaussian', False)):
    workdir = tmp_path / mechanism
    proc = _run(workdir, f'--config.ldp_audit.mechanism={mechanism}',
                '--config.ldp_audit.epsilons=(2.0,)')
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ('PRIVACY VIOLATION' in proc.stderr) == flagged
    for (crafter, dist, eps), p in _points(workdir).items():
      m = p['metrics']
      assert dist == 'likelihood_ratio'
      assert crafter == ('sensitivity_pair' if mechanism == 'gaussian' else
                         'extreme_pair')
      assert m['privacy_violation'] == float(flagged)
      if flagged:
        assert float(m['eps_emp_lower']) > eps
        assert m['eps_implied'] > float(m['eps_emp_lower'])
      else:
        assert float(m['eps_emp_lower']) <= m['eps_test_exact'] <= float(
            m['eps_emp_upper'])
        assert not math.isinf(float(m['eps_emp_upper']))


@pytest.mark.parametrize('field,value', [
    ('mechanism', 'laplace'),
    ('epsilons', (1.0, -2.0)),
    ('epsilons', (0.0,)),
    ('num_trials', 0),
    ('clip_norm', 0.0),
    ('crafters', ()),
    ('target_selection', 'best'),
    ('candidates', 1),
    ('server_lr', -0.1),
    ('radius', 0.0),
    ('violation_confidence', 1.0),
])
def test_validation_names_the_field(field, value):
  from configs import digits
  from fl_privacy.pipelines import ldp_audit
  from fl_privacy.validate import ConfigError
  config = digits.get_config('smoke')
  config.ldp_audit[field] = value
  with pytest.raises(ConfigError) as err:
    ldp_audit.validate_config(config)
  assert err.value.field == f'ldp_audit.{field}'


@pytest.mark.parametrize('mechanism,field,value', [
    ('gaussian', 'delta', 0.0),
    ('gaussian', 'sensitivity', -1.0),
    ('bitrand', 'rng_bits', 8),
    ('ome', 'ome_alpha', 0.0),
    ('bitrand', 'num_features', 0),
])
def test_input_mechanism_validation(mechanism, field, value):
  from configs import digits
  from fl_privacy.pipelines import ldp_audit
  from fl_privacy.validate import ConfigError
  config = digits.get_config('smoke')
  config.ldp_audit.mechanism = mechanism
  config.ldp_audit[field] = value
  with pytest.raises(ConfigError) as err:
    ldp_audit.validate_config(config)
  assert err.value.field == f'ldp_audit.{field}'


def test_figures_read_on_their_own(smoke_run, monkeypatch):
  from fl_privacy.pipelines import ldp_audit_figures  # pylint: disable=g-import-not-at-top
  from tests import figure_checks  # pylint: disable=g-import-not-at-top
  with open(os.path.join(smoke_run, 'results.json'), encoding='utf-8') as f:
    stored = json.load(f)['points']
  with figure_checks.capture(monkeypatch) as found:
    ldp_audit_figures.draw_figures(stored, str(smoke_run))
  assert set(found) == {'fig2_ldp_sgd'}
  assert found['fig2_ldp_sgd'] == []


def test_log_shows_eps_emp_per_point(tmp_path):
  # The Gaussian audit needs no data and runs in seconds; the log line of every saved point
  # carries the experiment's headline columns, the end of the run its table.
  proc = _run(tmp_path / 'run', '--config.ldp_audit.mechanism=gaussian',
              '--config.ldp_audit.num_trials=1000', '--config.ldp_audit.epsilons=(1.0,4.0)')
  assert proc.returncode == 0, proc.stderr[-2000:]
  saved = [l for l in proc.stderr.splitlines() if 'saved mechanism=gaussian' in l]
  assert len(saved) == 2 and all('eps_emp [95% lower]' in l for l in saved)
  table = proc.stdout.splitlines()
  assert any(l.startswith('Input mechanism audit') for l in table)
  assert sum(l.startswith('gaussian') for l in table) == 2


def test_projected_and_literal_white_box_paths_agree_within_intervals():
  # The default white-box path is the projected shortcut; on the same crafted pairs the
  # literal Algorithm 1 must give the same outcome rates: the two paths' 95% intervals
  # overlap for FP, FN and accuracy (a gap beyond that has probability < 0.3% per rate).
  import jax  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, str(REPO))
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import ldp_audit  # pylint: disable=g-import-not-at-top
  config = digits.get_config('smoke')
  assert config.ldp_audit.white_box_path == 'projected'
  config.ldp_audit.num_trials = 10_000
  state = ldp_audit.prepare(config)
  setup = ldp_audit.build_ldp_sgd_setup(config, state['dataset'], jax.random.key(0))
  for crafter, eps in (('gradient_flip', 1.0), ('benign', 4.0)):
    params = {'mechanism': 'ldp_sgd', 'crafter': crafter, 'distinguisher': 'white_box',
              'epsilon': eps}
    rates = {}
    for path in ('projected', 'literal'):
      config.ldp_audit.white_box_path = path
      rates[path], n = ldp_audit.ldp_sgd_point(config, setup, params,
                                               jax.random.key(len(path)), 0.95)
      assert n == 10_000
    a, b = rates['projected'], rates['literal']
    for rate in ('fp', 'fn', 'acc'):
      assert a[f'{rate}_ci_low'] <= b[f'{rate}_ci_high'], (crafter, rate, a[rate], b[rate])
      assert b[f'{rate}_ci_low'] <= a[f'{rate}_ci_high'], (crafter, rate, a[rate], b[rate])
