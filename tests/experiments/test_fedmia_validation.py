"""Every bad FedMIA field is refused before any work, naming the field (in process)."""

from __future__ import annotations

import pytest

from configs import digits
from fl_privacy import validate
from fl_privacy.pipelines import fedmia


def _config(**fields):
  config = digits.get_config('smoke')
  for dotted, value in fields.items():
    node = config
    parts = dotted.split('.')
    for p in parts[:-1]:
      node = node[p]
    node[parts[-1]] = value
  return config


@pytest.mark.parametrize('fields,field', [
    ({'fedmia.record_every': 2}, 'fedmia.record_every'),
    ({'fedmia.single_round': 4}, 'fedmia.single_round'),
    ({'fedmia.single_round': 0}, 'fedmia.single_round'),
    ({'fedmia.betas': (float('inf'), 0.0)}, 'fedmia.betas'),
    ({'fedmia.betas': (-1.0,)}, 'fedmia.betas'),
    ({'fedmia.num_clients': 2}, 'fedmia.num_clients'),
    ({'fedmia.client_counts': (5, 2)}, 'fedmia.client_counts'),
    ({'fedmia.attacks': ('fedmia_ii', 'lira')}, 'fedmia.attacks'),
    ({'fedmia.attacks': ('lira_online@paper',)}, 'fedmia.attacks'),
    ({'fedmia.lira_in_models': 0}, 'fedmia.lira_in_models'),
    ({'fedmia.lira_in_models': True}, 'fedmia.lira_in_models'),
    # lira_online fits a per-query IN variance: one IN model is refused, where it is scored.
    ({'fedmia.lira_in_models': 1}, 'fedmia.lira_in_models'),
    ({'fedmia.lira_in_models': 1, 'fedmia.attacks': ('lira_online_fixed',),
      'fedmia.sweep_attacks': ('lira_online',)}, 'fedmia.lira_in_models'),
    ({'fedmia.rmia_gamma': 0.0}, 'fedmia.rmia_gamma'),
    ({'fedmia.rmia_gamma': float('inf')}, 'fedmia.rmia_gamma'),
    ({'fedmia.rmia_a': 1.5}, 'fedmia.rmia_a'),
    ({'fedmia.rmia_a': -0.1}, 'fedmia.rmia_a'),
    ({'fedmia.bootstrap_resamples': 0}, 'fedmia.bootstrap_resamples'),
    ({'fedmia.sweep_attacks': ('fedmia_ii@median',)}, 'fedmia.sweep_attacks'),
    ({'fedmia.defenses.sparsify': (0.0,)}, 'fedmia.defenses.sparsify'),
    ({'fedmia.defenses.sparsify': (1.5,)}, 'fedmia.defenses.sparsify'),
    ({'fedmia.defenses.sampling': (1.5,)}, 'fedmia.defenses.sampling'),  # (0, 1], one rule
    ({'fedmia.defenses.quantize': (0,)}, 'fedmia.defenses.quantize'),
    ({'fedmia.defenses.update_noise': (-0.1,)}, 'fedmia.defenses.update_noise'),
    ({'fedmia.defenses.update_dp': (-1.0,)}, 'fedmia.defenses.update_dp'),
    ({'fedmia.defenses.mixup': (0.0,)}, 'fedmia.defenses.mixup'),
    ({'fedmia.defenses.augment': (5,)}, 'fedmia.defenses.augment'),
    ({'fedmia.defenses.augment': (0,)}, 'fedmia.defenses.augment'),
    ({'fedmia.outlier_filter': 'median'}, 'fedmia.outlier_filter'),
    ({'fedmia.nonmember_scoring': ('aligned', 'shuffled')}, 'fedmia.nonmember_scoring'),
])
def test_bad_field_raises_config_error(fields, field):
  config = _config(**fields)
  with pytest.raises(validate.ConfigError) as e:
    fedmia.validate_config(config)
  assert e.value.field == field
  assert str(e.value).startswith(f'config.{field}:')


@pytest.mark.parametrize('value', [1.5, 'x', None])
def test_lira_in_models_of_another_type(value):
  # The command line refuses these as flags (exit 2 naming the field, test_fedmia.py); a config
  # built in code can still hold them.
  config = digits.get_config('smoke')
  with config.ignore_type():
    config.fedmia.lira_in_models = value
  with pytest.raises(validate.ConfigError) as e:
    fedmia.validate_config(config)
  assert e.value.field == 'fedmia.lira_in_models'


def test_unknown_defense_name():
  config = digits.get_config('smoke')
  config.fedmia.defenses['tempering'] = (0.5,)
  with pytest.raises(validate.ConfigError) as e:
    fedmia.validate_config(config)
  assert e.value.field == 'fedmia.defenses.tempering'


def test_default_configs_are_valid():
  for arg in (None, 'smoke'):
    fedmia.validate_config(digits.get_config(arg))
  # Two IN models are enough; the fixed variance's global sigma_in needs two as well (issue 29).
  fedmia.validate_config(_config(**{'fedmia.lira_in_models': 2,
                                    'fedmia.attacks': ('lira_online_fixed', 'fedmia_ii')}))
  with pytest.raises(validate.ConfigError, match='lira_in_models'):
    fedmia.validate_config(_config(**{'fedmia.lira_in_models': 1,
                                      'fedmia.attacks': ('lira_online_fixed', 'fedmia_ii')}))
  # Without a suffix FedMIA is the paper's filter; ours sits beside it in the defaults.
  config = digits.get_config(None)
  assert config.fedmia.outlier_filter == 'paper'
  for name in ('fedmia_i', 'fedmia_ii', 'fedmia_i@leave_one_out', 'fedmia_ii@leave_one_out'):
    assert name in config.fedmia.attacks and name in config.fedmia.sweep_attacks


def test_new_attacks_scorings_and_rmia_fields():
  from configs import cifar100  # pylint: disable=g-import-not-at-top
  config = digits.get_config(None)
  assert {'fedmia_ii', 'lira_offline', 'lira_offline_fixed', 'rmia'} <= set(config.fedmia.attacks)
  assert config.fedmia.rmia_gamma == 2.0 and config.fedmia.rmia_a == 1.0
  c100 = cifar100.get_config(None)
  assert 'rmia' in c100.fedmia.attacks and c100.fedmia.rmia_a == 0.6
  fedmia.validate_config(_config(**{'fedmia.nonmember_scoring': ('aligned', 'public_code_2024'),
                                    'fedmia.rmia_a': 0.0, 'fedmia.rmia_gamma': 0.5}))


def test_fields_the_run_does_not_read_are_declared_unused():
  config = digits.get_config('smoke')
  # The smoke's defaults: momentum SGD under the cosine schedule, every attack (online LiRA
  # and RMIA included), the MLP.
  unused = fedmia.unused_fields(config)
  for read in ('fedmia.lira_in_models', 'fedmia.rmia_gamma', 'fedmia.rmia_a',
               'fedmia.momentum', 'fedmia.hidden'):
    assert read not in unused
  assert 'cosine' in unused['fedmia.lr_decay']
  config.fedmia.attacks = ('fedmia_ii', 'lira_offline')
  config.fedmia.sweep_attacks = ('fedmia_ii',)
  config.fedmia.optimizer = 'sgd'
  unused = fedmia.unused_fields(config)
  assert 'online LiRA' in unused['fedmia.lira_in_models']
  assert "'rmia'" in unused['fedmia.rmia_gamma'] and "'rmia'" in unused['fedmia.rmia_a']
  assert "'sgd' has no heavy-ball momentum" in unused['fedmia.momentum']
  # The sweeps' attacks count only where a sweep trains.
  config.fedmia.sweep_attacks = ('rmia', 'lira_online')
  assert not {'fedmia.rmia_gamma', 'fedmia.lira_in_models'} & set(fedmia.unused_fields(config))
  for f in ('betas', 'client_counts', 'epoch_counts'):
    config.fedmia[f] = ()
  config.fedmia.defenses = {}
  unused = fedmia.unused_fields(config)
  assert {'fedmia.rmia_gamma', 'fedmia.lira_in_models', 'fedmia.sweep_attacks',
          'fedmia.sweep_scoring'} <= set(unused)
  # A config validation refuses declares nothing (validation names the field).
  config.fedmia.attacks = ('no_such_attack',)
  assert fedmia.unused_fields(config) == {}


def test_plain_sgd_trains_without_momentum():
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  config = digits.get_config('smoke')
  config.fedmia.optimizer = 'sgd'
  assert config.fedmia.momentum > 0  # the default, read only by 'momentum'
  opt = fedmia.make_optimizer(config)(0)
  params = {'w': jnp.ones(3)}
  grads = {'w': jnp.full(3, 0.5)}
  state = opt.init(params)
  first, state = opt.update(grads, state, params)
  second, _ = opt.update(grads, state, params)
  # Plain SGD: the same step twice (momentum would grow the second by the first's 0.9).
  assert jnp.allclose(first['w'], second['w'], rtol=1e-6)
  config.fedmia.optimizer = 'momentum'
  opt = fedmia.make_optimizer(config)(0)
  state = opt.init(params)
  first, state = opt.update(grads, state, params)
  second, _ = opt.update(grads, state, params)
  assert float(jnp.abs(second['w'][0])) > 1.5 * float(jnp.abs(first['w'][0]))
