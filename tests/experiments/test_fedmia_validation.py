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


def test_unknown_defense_name():
  config = digits.get_config('smoke')
  config.fedmia.defenses['tempering'] = (0.5,)
  with pytest.raises(validate.ConfigError) as e:
    fedmia.validate_config(config)
  assert e.value.field == 'fedmia.defenses.tempering'


def test_default_configs_are_valid():
  for arg in (None, 'smoke'):
    fedmia.validate_config(digits.get_config(arg))
