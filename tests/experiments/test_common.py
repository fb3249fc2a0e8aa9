"""Tests of the experiment scaffolding: flags, exit codes, resume, Ctrl-C."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from experiments import common
from fl_privacy import report

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

_FAKE = textwrap.dedent('''
    import logging
    import os
    import warnings
    from experiments import common
    from fl_privacy import validate

    MODE = os.environ['FAKE_MODE']

    def prepare(config):
      if MODE.startswith('noisy'):
        # What JAX and the data loading say while a run starts (backend probing, warnings).
        logging.getLogger('jax._src.xla_bridge').info("Unable to initialize backend 'tpu'")
        warnings.warn('a loading warning')
        if MODE == 'noisy_error':
          raise validate.ConfigError('toy.p', 'in [0, 1]', 7)
      if MODE == 'config_error':
        raise validate.ConfigError('toy.p', 'in [0, 1]', 7)
      if MODE == 'missing':
        raise FileNotFoundError('no such data file: /nowhere.npz')
      return {'seed': config.seed}

    def sweep(config, state, store, key):
      for i in range(4):
        if MODE == 'interrupt' and i == 2:
          raise KeyboardInterrupt
        common.run_point(store, {'i': i},
                         lambda: ({'seed': state['seed'], 'i2': i * i}, 1))

    if __name__ == '__main__':
      common.main('fake', prepare, sweep)
''')


def _run_fake(tmp_path, mode, *flags, cwd=None):
  module_dir = tmp_path / 'mods'
  module_dir.mkdir(exist_ok=True)
  (module_dir / 'fake_exp.py').write_text(_FAKE)
  env = dict(os.environ, FAKE_MODE=mode, JAX_PLATFORMS='cpu',
             PYTHONPATH=f'{REPO}{os.pathsep}{module_dir}')
  return subprocess.run(
      [sys.executable, '-m', 'fake_exp', '--config=configs/toy.py:smoke',
       *flags], env=env, cwd=cwd or REPO, capture_output=True, text=True,
      timeout=120)


def _points(workdir):
  with open(os.path.join(workdir, 'results.json')) as f:
    return json.load(f)['points']


@pytest.mark.parametrize('mode,needle', [('config_error', 'config.toy.p'),
                                         ('missing', 'no such data file')])
def test_prepare_errors_exit_2_and_write_nothing(tmp_path, mode, needle):
  workdir = tmp_path / 'run'
  proc = _run_fake(tmp_path, mode, f'--workdir={workdir}')
  assert proc.returncode == 2, proc.stderr[-2000:]
  error_lines = [l for l in proc.stderr.splitlines() if l.startswith('error:')]
  assert len(error_lines) == 1 and needle in error_lines[0]
  assert 'Traceback' not in proc.stderr
  assert not workdir.exists()


def test_a_bad_input_prints_one_line_and_a_good_one_keeps_the_start_logs(tmp_path):
  workdir = tmp_path / 'run'
  proc = _run_fake(tmp_path, 'noisy_error', f'--workdir={workdir}')
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.splitlines() == ['error: config.toy.p: must be in [0, 1] (got 7)']
  assert not workdir.exists()
  # A run whose inputs pass shows what was held, before its own log lines.
  proc = _run_fake(tmp_path, 'noisy_ok', f'--workdir={workdir}', '--quiet')
  assert proc.returncode == 0, proc.stderr[-2000:]
  err = proc.stderr
  assert "Unable to initialize backend 'tpu'" in err and 'a loading warning' in err
  assert err.index("backend 'tpu'") < err.index('point(s) already saved')


def test_interrupt_lists_saved_points_then_resume(tmp_path):
  workdir = tmp_path / 'run'
  proc = _run_fake(tmp_path, 'interrupt', f'--workdir={workdir}')
  assert proc.returncode == 130, proc.stderr[-2000:]
  assert '2 point(s) saved' in proc.stderr
  assert f'--workdir={workdir}' in proc.stderr
  assert [p['params'] for p in _points(workdir)] == [{'i': 0}, {'i': 1}]

  proc = _run_fake(tmp_path, 'ok', f'--workdir={workdir}')
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert 'skipping i=0' in proc.stderr and 'skipping i=1' in proc.stderr
  assert [p['params']['i'] for p in _points(workdir)] == [0, 1, 2, 3]


def test_seed_flag_overrides_and_is_stored(tmp_path):
  workdir = tmp_path / 'run'
  proc = _run_fake(tmp_path, 'ok', f'--workdir={workdir}', '--seed=5')
  assert proc.returncode == 0, proc.stderr[-2000:]
  with open(workdir / 'results.json') as f:
    data = json.load(f)
  assert data['config']['seed'] == 5
  assert data['points'][0]['metrics']['seed'] == 5

  # Same workdir, other seed: a different config, refused with exit 2.
  proc = _run_fake(tmp_path, 'ok', f'--workdir={workdir}', '--seed=6')
  assert proc.returncode == 2
  assert 'error:' in proc.stderr and 'seed' in proc.stderr


def test_relative_config_and_default_workdir_from_another_folder(tmp_path):
  cwd = tmp_path / 'elsewhere'
  cwd.mkdir()
  proc = _run_fake(tmp_path, 'ok', cwd=cwd)
  assert proc.returncode == 0, proc.stderr[-2000:]
  runs = os.listdir(cwd / 'runs')
  assert len(runs) == 1 and runs[0].startswith('fake-')
  assert len(_points(cwd / 'runs' / runs[0])) == 4


def test_resolve_config_arg(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  toy = os.path.join(REPO, 'configs', 'toy.py')
  assert common.resolve_config_arg(['prog']) == [
      'prog', f'--config={common.DEFAULT_CONFIG}']
  assert common.resolve_config_arg(['prog', '--config=configs/toy.py:smoke']) == [
      'prog', f'--config={toy}:smoke']
  assert common.resolve_config_arg(['prog', '--config', 'configs/toy.py']) == [
      'prog', '--config', toy]
  (tmp_path / 'configs').mkdir()
  (tmp_path / 'configs' / 'toy.py').write_text('')
  # A file that exists from the current folder wins.
  assert common.resolve_config_arg(['prog', '--config=configs/toy.py']) == [
      'prog', '--config=configs/toy.py']


def test_default_config_is_the_repos_digits():
  assert os.path.isabs(common.DEFAULT_CONFIG)
  assert common.DEFAULT_CONFIG == os.path.join(REPO, 'configs', 'digits.py')
  assert os.path.exists(common.DEFAULT_CONFIG)


def test_run_point_computes_once(tmp_path):
  store = report.ResultsStore(tmp_path, 'x', {'seed': 0})
  calls = []

  def compute():
    calls.append(1)
    return {'m': 1.5}, 3

  assert common.run_point(store, {'a': 1}, compute) == {'m': 1.5}
  assert common.run_point(store, {'a': 1}, compute) == {'m': 1.5}
  assert len(calls) == 1
  assert store.get({'a': 1})['n_trials'] == 3


def test_refuse_unused_names_an_override_the_run_does_not_read():
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy import validate  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import base  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import ldp_audit  # pylint: disable=g-import-not-at-top
  config = digits.get_config('smoke')
  unused = base.unused(ldp_audit, config)  # mechanism 'ldp_sgd': the input fields are unused
  assert 'ldp_audit.int_bits' in unused and 'ldp_audit.candidates' not in unused
  argv = ['prog', '--config.ldp_audit.candidates=3']
  common.refuse_unused(unused, argv)  # read by ldp_sgd: fine
  with pytest.raises(validate.ConfigError, match=r'config.ldp_audit.int_bits: must be left at '
                     r"its default: read only by ldp_audit.mechanism bitrand or ome"):
    common.refuse_unused(unused, argv + ['--config.ldp_audit.int_bits=40'])
  config.ldp_audit.mechanism = 'gaussian'
  unused = base.unused(ldp_audit, config)
  assert 'ldp_audit.candidates' in unused and 'ldp_audit.int_bits' in unused
  assert 'ldp_audit.sensitivity' not in unused and 'ldp_audit.num_features' not in unused
  # A pipeline that declares none: only the data section's fields its dataset does not read.
  assert base.unused(object(), config) == base.data_unused(config) == {
      'data.attribute': "read only by data.name='celeb_a' (the data is 'digits')"}


@pytest.mark.parametrize('text,needle', [
    ('this is not python(', 'got a file Python cannot read: SyntaxError at line 1'),
    ('x = 1\n', 'got a module without get_config'),
    ('def section(dataset, smoke):\n  pass\n', 'got a section module'),
    ('raise RuntimeError("boom")\n', 'got a module that fails on import: RuntimeError: boom'),
])
def test_load_config_file_refuses_what_is_not_a_config(tmp_path, text, needle):
  path = tmp_path / 'c.py'
  path.write_text(text)
  with pytest.raises(common.ConfigFileError, match=needle):
    common.load_config_file(str(path), None)
  txt = tmp_path / 'c.txt'
  txt.write_text('hello')
  with pytest.raises(common.ConfigFileError, match='got a file that is not a .py module'):
    common.load_config_file(str(txt), None)


def test_seed_rule_is_int64():
  assert common.SEED_RULE.ok(0) and common.SEED_RULE.ok(2**63 - 1) and common.SEED_RULE.ok(-2**63)
  assert not common.SEED_RULE.ok(2**63) and not common.SEED_RULE.ok(1.5)
  assert not common.SEED_RULE.ok(True)
