"""Every dataset config builds, carries the sections it promises, and documents its run."""

import importlib
import pathlib

import pytest

from configs import _base

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[2] / 'configs'
SECTIONS = {
    'digits': ('ami', 'dishonest', 'ldp_audit', 'fedmia', 'pastel', 'dp_audit', 'flower_audit',
               'training_audit', 'reconstruction', 'dp_bugs'),
    'npz': ('ami', 'dishonest', 'ldp_audit', 'fedmia', 'pastel', 'dp_audit', 'training_audit',
            'reconstruction'),
    'mnist': ('dishonest', 'ldp_audit'),
    'fashion_mnist': ('ldp_audit',),
    'svhn_cropped': ('ldp_audit',),
    'cifar10': ('ami', 'dishonest', 'ldp_audit', 'fedmia', 'pastel', 'reconstruction'),
    'cifar100': ('dishonest', 'fedmia'),
    'celeba': ('ami', 'dishonest'),
    'imagenette': ('ami',),
}


def test_every_config_file_is_listed():
  files = {p.stem for p in CONFIG_DIR.glob('*.py') if not p.stem.startswith('_')}
  files.discard('__init__')
  files.discard('toy')  # the evaluation layer's toy game, not a dataset
  assert files == set(SECTIONS)


@pytest.mark.parametrize('name', sorted(SECTIONS))
@pytest.mark.parametrize('arg', [None, 'smoke'])
def test_config_builds_with_its_sections(name, arg):
  module = importlib.import_module(f'configs.{name}')
  config = module.get_config(arg)
  assert config.dataset == name
  assert config.smoke == (arg == 'smoke')
  # None: the runner sizes chunks by bytes; an integer is an explicit override.
  assert config.game.chunk_size is None or config.game.chunk_size > 0
  assert config.game.batch_bytes is None
  for section in _base.EXPERIMENTS:
    assert (section in config) == (section in SECTIONS[name]), section
  assert 'python -m experiments.' in module.__doc__


def test_smoke_shrinks_the_game():
  from configs import digits
  smoke, full = digits.get_config('smoke'), digits.get_config()
  assert smoke.ami.num_trials < full.ami.num_trials
  assert smoke.ldp_audit.num_trials < full.ldp_audit.num_trials


def test_arg_parsing():
  assert _base.parse_arg('smoke,path=/a/b.npz') == {'smoke': True, 'path': '/a/b.npz'}
  assert _base.parse_arg(None) == {}
  from configs import npz
  assert npz.get_config('path=/x.npz').data.path == '/x.npz'


def test_python_m_configs_lists_every_config_and_its_sections():
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from configs import __main__ as listing  # pylint: disable=g-import-not-at-top
  repo = pathlib.Path(__file__).resolve().parents[2]
  proc = subprocess.run([sys.executable, '-m', 'configs'], cwd=repo, capture_output=True,
                        text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  for name in listing.config_names():
    assert f'{name}.py' in proc.stdout
  assert 'toy' in listing.config_names() and '_base' not in listing.config_names()
  digits = listing.describe('digits')
  assert digits['sections'] == ['ami', 'dishonest', 'ldp_audit', 'fedmia', 'pastel',
                                'dp_audit', 'flower_audit', 'training_audit', 'reconstruction',
                                'dp_bugs']
  assert 'dishonest_mia' in digits['experiments']
  one = subprocess.run([sys.executable, '-m', 'configs', 'toy'], cwd=repo, capture_output=True,
                       text=True, timeout=120, check=False)
  assert one.returncode == 0 and 'num_trials' in one.stdout
  bad = subprocess.run([sys.executable, '-m', 'configs', 'nope'], cwd=repo,
                       capture_output=True, text=True, timeout=120, check=False)
  assert bad.returncode == 2 and 'no config' in bad.stderr


def test_python_m_configs_into_a_closed_pipe_exits_quietly():
  # `python -m configs | head -1`: the reader is gone before the listing is written.
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  repo = pathlib.Path(__file__).resolve().parents[2]
  for args in ([], ['digits']):
    proc = subprocess.Popen([sys.executable, '-m', 'configs', *args], cwd=repo,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=120)
    assert proc.returncode == 141, err
    assert err == '', err


@pytest.mark.parametrize('name', ['digits', 'cifar10', 'cifar100'])
def test_optional_fields_can_be_set_from_the_command_line(name):
  # ml_collections cannot parse an override of a field whose value is a bare None, so every
  # optional field a user may want to set is a typed placeholder.
  from absl import flags
  from ml_collections import config_flags
  overrides = ['--config.data.max_examples=500', '--config.data.image_size=16',
               '--config.data.data_dir=/somewhere', '--config.data.path=x.npz']
  if name in ('digits', 'cifar100'):
    overrides.append('--config.fedmia.per_client=40')
  argv = ['prog', f'--config={CONFIG_DIR / name}.py', *overrides]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=values, sys_argv=argv)
  values(argv)
  data = values.config.data
  assert (data.max_examples, data.image_size, data.data_dir, data.path) == (
      500, 16, '/somewhere', 'x.npz')
  if name in ('digits', 'cifar100'):
    assert values.config.fedmia.per_client == 40


def test_setting_argument_selects_fedmia_data_per_client_and_is_checked():
  from configs import cifar10, digits
  leaky, wide = digits.get_config(), digits.get_config('setting=well_generalising')
  assert (leaky.setting, wide.setting) == ('leaky', 'well_generalising')
  assert (leaky.fedmia.num_clients, leaky.fedmia.per_client, leaky.fedmia.batch_size) == (20, 16, 8)
  assert (wide.fedmia.num_clients, wide.fedmia.per_client, wide.fedmia.batch_size) == (10, None, 32)
  # Only the data per client, K, B and the clients sweep differ.
  differing = {k for k in leaky.fedmia.keys() if leaky.fedmia[k] != wide.fedmia[k]}
  assert differing == {'num_clients', 'per_client', 'batch_size', 'client_counts'}
  assert digits.get_config('setting=leaky').fedmia == leaky.fedmia
  with pytest.raises(_base.ConfigArgError, match='setting=wide: must be one of leaky, '
                     'well_generalising'):
    digits.get_config('setting=wide')
  with pytest.raises(_base.ConfigArgError, match='only with the configs of digits, npz'):
    cifar10.get_config('setting=leaky')
  assert cifar10.get_config().setting == 'paper'
